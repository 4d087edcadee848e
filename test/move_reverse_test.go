package test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/move"
)

// TestMoveReverse: a tenant is moved to a second server, takes more sends
// and a direct write there, and is moved back. A reverse is refused before
// the move is done; one killed at its copy and cancelled leaves the tenant
// on the target (the move done); one killed just after its fence rose is
// resumed to its end. Sends and reads answer throughout, and the source
// ends with every row of the target exactly once (counts and hashes per
// topic-month), its fence and the placement at the epoch after.
func TestMoveReverse(t *testing.T) {
	t.Parallel()
	l := mvStartLive(t, 1)
	tenant, targetDSN, env, store, src := l.tenant, l.targetDSN, l.env, l.store, l.src
	ctx := context.Background()
	months, tables := l.months, l.tables
	for _, m := range months {
		mvInsert(t, src, m, "g_a", 1, 120)
	}
	at := l.at
	o := move.Options{ChunkRows: 1000, CatchUpRounds: 2}
	if _, err := move.Reverse(ctx, tenant, at, store, o); !errors.Is(err, move.ErrNoMove) {
		t.Fatalf("reverse without a move: %v, want ErrNoMove", err)
	}

	// sends and reads run through both moves: every send 201, every read 200
	tr := mvStartTraffic(t, env, "mvr", true)

	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	mvWaitEpoch(t, env, at.Epoch+1)
	moved, err := env.App.Pools().Placement(tenant)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := env.App.Pools().DB(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	// written on the target after the switch: what the reverse must bring back
	mvInsert(t, dst, months[1], "g_c", 1, 30)
	if _, err := dst.Exec("UPDATE " + tables[0] + " SET status = 'recalled' WHERE topic = 'g_a' AND seqid = 7"); err != nil {
		t.Fatal(err)
	}
	sendWaitFor(t, 10*time.Second, "sends stored on the target", func() bool {
		n, _ := mvTopicRows(t, dst, "mvr")
		return n > 0
	})

	// a reverse killed as it copies, then cancelled: the move stays done
	killed := errors.New("killed")
	killAt := move.StepCopy
	o.StepHook = func(step string) error {
		if step == killAt {
			return killed
		}
		return nil
	}
	r, err := move.Reverse(ctx, tenant, moved, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, killed) {
		t.Fatalf("reverse: %v, want it stopped at the copy", err)
	}
	r.Close()
	if completed, err := move.Cancel(ctx, tenant, moved, store, o); err != nil || completed {
		t.Fatalf("cancel of the reverse: completed %v, %v", completed, err)
	}
	if st, err := move.ReadState(ctx, moved.DSN, nil); err != nil || st.Role != "target" || st.Step != move.StepDone {
		t.Fatalf("after the cancelled reverse: %+v %v, want the move done on the target", st, err)
	}
	if e := mvFence(t, dst); e != moved.Epoch {
		t.Fatalf("target fence %d after the cancelled reverse, want %d", e, moved.Epoch)
	}

	// a reverse killed just after its fence rose, then resumed
	killAt = move.HookFenced
	if r, err = move.Reverse(ctx, tenant, moved, store, o); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, killed) {
		t.Fatalf("reverse: %v, want it stopped after the fence", err)
	}
	r.Close()
	o.StepHook = nil
	if r, err = move.Resume(ctx, tenant, moved, store, o); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	r.Close()
	mvWaitEpoch(t, env, at.Epoch+2)
	back, err := env.App.Pools().Placement(tenant)
	if err != nil || back.DSN != at.DSN {
		t.Fatalf("placement after the reverse: %+v %v, want the source %s", back, err, at.DSN)
	}
	time.Sleep(300 * time.Millisecond) // sends on the source again
	tr.stopClean(t)

	srcDB, _, err := move.OpenDB(at.DSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer srcDB.Close()
	if e := mvFence(t, srcDB); e != at.Epoch+2 {
		t.Fatalf("source fence %d, want %d", e, at.Epoch+2)
	}
	if e := mvFence(t, dst); e != at.Epoch+2 {
		t.Fatalf("target fence %d, want %d", e, at.Epoch+2)
	}
	// every sent message exactly once on the source
	tr.wantStoredOnce(t, srcDB)
	// the rows written on the target before the reverse are on the source,
	// per topic-month as the target has them
	want, got := mvDigest(t, dst, tables...), mvDigest(t, srcDB, tables...)
	delete(want, tables[0]+" mvr") // sent after the reverse: on the source only
	delete(want, tables[1]+" mvr")
	delete(got, tables[0]+" mvr")
	delete(got, tables[1]+" mvr")
	if len(want) != 3 || fmt.Sprint(want) != fmt.Sprint(got) {
		t.Fatalf("per topic-month digests: target %v, source %v", want, got)
	}
	// finish after the reverse drops the copy on the second server
	if err := move.Finish(ctx, tenant, back, move.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := move.Reverse(ctx, tenant, back, store, o); !errors.Is(err, move.ErrReverseRefused) {
		t.Fatalf("reverse after finish: %v, want ErrReverseRefused", err)
	}
}
