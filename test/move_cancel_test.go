package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/move"
)

// TestMoveCancelDuringThePreChecks: the switch's pre-checks (a catch-up
// round over every chunk, then the copy of the marked rows) are the
// precheck step, with nothing held, and a cancel issued there cancels —
// at the step's start (the catch-up round sees it at its next chunk) and
// once the pre-checks passed, right before the step would become switch
// (the cancel's and the mover's conditional UPDATEs: one wins). The
// mover ends with ErrCancelled, the source fence and the placement
// record never rise, the target copy is dropped and every row is on the
// source once.
func TestMoveCancelDuringThePreChecks(t *testing.T) {
	t.Parallel()
	for _, at := range []string{move.StepPreCheck, move.HookPreChecked} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			mvCancelAt(t, at)
		})
	}
}

func mvCancelAt(t *testing.T, hook string) {
	tenant, targetDSN, store, at, src, month := mvSwitchSetup(t)
	ctx := context.Background()
	mvInsert(t, src, month, "g_a", 1, 120)
	type result struct {
		completed bool
		err       error
	}
	cancelled := make(chan result, 1)
	var o move.Options
	o = move.Options{ChunkRows: 20, StepHook: func(step string) error {
		if step != hook {
			return nil
		}
		if step == move.StepPreCheck {
			// a write the pre-check's catch-up round would copy
			mvInsert(t, src, month, "g_a", 1000, 1)
		}
		go func() {
			completed, err := move.Cancel(ctx, tenant, at, store, o)
			cancelled <- result{completed, err}
		}()
		// the cancel has recorded itself (it then waits for the mover's lock)
		sendWaitFor(t, 10*time.Second, "the cancel records cancelling", func() bool {
			s, _ := mvState(t, src)
			return s == move.StepCancelling
		})
		return nil
	}}
	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	runErr := m.Run(ctx)
	m.Close()
	if !errors.Is(runErr, move.ErrCancelled) {
		t.Fatalf("run: %v, want ErrCancelled", runErr)
	}
	var res result
	select {
	case res = <-cancelled:
	case <-time.After(60 * time.Second):
		t.Fatal("the cancel did not end")
	}
	if res.err != nil || res.completed {
		t.Fatalf("cancel: completed %v, %v; want it cancelled", res.completed, res.err)
	}
	if s, _ := mvState(t, src); s != move.StepCancelled {
		t.Fatalf("step %s, want %s", s, move.StepCancelled)
	}
	if e := mvFence(t, src); e != at.Epoch {
		t.Fatalf("source fence %d, want %d (never raised)", e, at.Epoch)
	}
	recs, _, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec, ok := recs[tenant]; ok {
		t.Fatalf("placement record %+v written by a cancelled move", rec)
	}
	if _, err := move.ReadState(ctx, targetDSN, nil); err == nil {
		t.Fatal("the target copy is still there")
	}
	want := int64(120)
	if hook == move.StepPreCheck {
		want++
	}
	if rows, seqs := mvTopicRows(t, src, "g_a"); rows != want || seqs != want {
		t.Fatalf("source: %d rows, %d seqs, want %d of each", rows, seqs, want)
	}
	if trig, marks := mvTriggers(t, src); trig != 0 || marks != 0 {
		t.Fatalf("source after the cancel: %d triggers, %d marks", trig, marks)
	}
}
