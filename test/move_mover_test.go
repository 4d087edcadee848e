package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/testenv"
)

// mvInsert writes message rows straight into a month table (topic, seqs).
func mvInsert(t *testing.T, db *sql.DB, month, topic string, first, n int64) {
	t.Helper()
	for s := first; s < first+n; s++ {
		if _, err := db.Exec("INSERT INTO im_group_messages_"+month+
			" (message_id, topic, group_id, seqid, from_user, content, created_at, updated_at) VALUES (?, ?, 7, ?, 1, ?, NOW(3), NOW(3))",
			mvMonthInt(month)*10_000_000+int64(topic[2])*10_000+s, topic, s, fmt.Sprintf(`{"text":"m%d"}`, s)); err != nil {
			t.Fatal(err)
		}
	}
}

func mvMonthInt(month string) int64 {
	var n int64
	for _, c := range month {
		n = n*10 + int64(c-'0')
	}
	return n
}

// mvTopicRows counts topic's rows and distinct seqs over every month table of db.
func mvTopicRows(t *testing.T, db *sql.DB, topic string) (rowsN, seqs int64) {
	t.Helper()
	for _, tb := range mvMonthTables(t, db) {
		var a, b int64
		if err := db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT seqid) FROM "+tb+" WHERE topic = ?", topic).Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		rowsN, seqs = rowsN+a, seqs+b
	}
	return rowsN, seqs
}

// mvMonthTables lists db's month tables.
func mvMonthTables(t testing.TB, db *sql.DB) []string {
	t.Helper()
	names, err := db.Query("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'im\\_group\\_messages\\_%'")
	if err != nil {
		t.Fatal(err)
	}
	defer names.Close()
	var tables []string
	for names.Next() {
		var n string
		if err := names.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return tables
}

// mvDigest is, per table and topic, the rows' count and hash.
func mvDigest(t *testing.T, db *sql.DB, tables ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, tb := range tables {
		rows, err := db.Query("SELECT topic, COUNT(*), COUNT(DISTINCT seqid), SUM(CRC32(CONCAT_WS('|', message_id, seqid, CAST(content AS BINARY), CAST(status AS BINARY)))) FROM " + tb + " GROUP BY topic")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var topic string
			var n, distinct, sum int64
			if err := rows.Scan(&topic, &n, &distinct, &sum); err != nil {
				t.Fatal(err)
			}
			if n != distinct {
				t.Fatalf("%s %s: %d rows, %d distinct seqs", tb, topic, n, distinct)
			}
			out[tb+" "+topic] = fmt.Sprintf("%d/%d", n, sum)
		}
		rows.Close()
	}
	return out
}

// TestMoveTenantCopiesCatchesUpAndSwitches: a tenant with messages in two
// months and a writer still writing is moved to a second server. The mover
// is stopped at the copy and resumed, a cancel arriving after the fence
// was raised completes the switch (the tenant ends wholly on the target),
// every row is there exactly once with the same hashes per topic-month, the
// process follows the new placement, and finish drops the source.
func TestMoveTenantCopiesCatchesUpAndSwitches(t *testing.T) {
	t.Parallel()
	l := mvStartLive(t, 1)
	tenant, targetDSN, env, store, src := l.tenant, l.targetDSN, l.env, l.store, l.src
	ctx := context.Background()
	months, tables := l.months, l.tables
	for _, m := range months {
		mvInsert(t, src, m, "g_a", 1, 120)
		mvInsert(t, src, m, "g_b", 1, 45)
	}
	if _, err := src.Exec("INSERT INTO im_groups (group_id, topic) VALUES (7, 'g_a')"); err != nil {
		t.Fatal(err)
	}

	// a writer keeps writing until the fence is raised (as persist does:
	// its batches are refused from then on)
	var fenced atomic.Bool
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		seq := int64(1000)
		for !fenced.Load() {
			select {
			case <-stop:
				return
			default:
			}
			mvInsert(t, src, months[0], "g_a", seq, 1)
			if _, err := src.Exec("UPDATE im_group_messages_"+months[1]+" SET status = 'recalled' WHERE topic = 'g_b' AND seqid = ?", seq%45+1); err != nil {
				t.Error(err)
				return
			}
			seq++
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	// sends (persist running in the same process) and reads go on through
	// the whole move: every send answers 201, every read 200
	tr := mvStartTraffic(t, env, "mvs", true)

	at := l.at
	killed := errors.New("killed")
	copies := 0
	o := move.Options{ChunkRows: 50, StepHook: func(step string) error {
		if step == move.StepCopy {
			copies++
			if copies == 1 {
				return killed // the mover dies as it starts copying
			}
		}
		if step == move.HookFenced && copies < 100 {
			fenced.Store(true)
			copies = 100
			return killed // and again just after the fence was raised
		}
		return nil
	}}
	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); !errors.Is(err, killed) {
		t.Fatalf("first run: %v, want it stopped at the copy", err)
	}
	m.Close()
	// a second mover while a first holds the lock is refused
	m, err = move.Resume(ctx, tenant, at, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := move.Begin(ctx, tenant, at, targetDSN, store, o); !errors.Is(err, move.ErrBusy) {
		t.Fatalf("a second mover: %v, want ErrBusy", err)
	}
	if err := m.Run(ctx); !errors.Is(err, killed) {
		t.Fatalf("second run: %v, want it stopped after the fence", err)
	}
	m.Close()
	st, err := move.ReadState(ctx, at.DSN, nil)
	if err != nil || st.Step != move.StepSwitch || st.RowsCopied == 0 {
		t.Fatalf("state after the kill in the switch: %+v %v", st, err)
	}
	if e := mvFence(t, src); e != at.Epoch+1 {
		t.Fatalf("source fence %d, want %d", e, at.Epoch+1)
	}
	wg.Wait()
	// cancel after the fence: the switch completes, the tenant is on the target
	completed, err := move.Cancel(ctx, tenant, at, store, o)
	if err != nil || !completed {
		t.Fatalf("cancel in the switch: completed %v, %v", completed, err)
	}
	wg.Wait()
	mvWaitEpoch(t, env, at.Epoch+1)
	before := tr.sent()
	sendWaitFor(t, 10*time.Second, "sends after the move", func() bool { return tr.sent() >= before+10 })
	tr.stopClean(t)
	dst, err := env.App.Pools().DB(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	srcDB, _, err := move.OpenDB(at.DSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer srcDB.Close()
	want, got := mvDigest(t, srcDB, tables...), mvDigest(t, dst, tables...)
	if len(want) != 4 || fmt.Sprint(want) != fmt.Sprint(got) {
		t.Fatalf("per topic-month digests: source %v, target %v", want, got)
	}
	if e := mvFence(t, dst); e != at.Epoch+1 {
		t.Fatalf("target fence %d, want %d", e, at.Epoch+1)
	}
	// every message sent during the move is on the target exactly once
	tr.wantStoredOnce(t, dst)
	if onSource, _ := mvTopicRows(t, srcDB, "mvs"); onSource > tr.sent() {
		t.Fatalf("the source holds %d rows of mvs, more than the target's %d", onSource, tr.sent())
	}
	if n := persistMetric(t, env, "group_message_dead_letter_total"); n != 0 {
		t.Fatalf("%v events dead-lettered during the move", n)
	}
	// reads on the new placement answer from the target
	var n int
	if err := dst.QueryRow("SELECT COUNT(*) FROM " + tables[1]).Scan(&n); err != nil || n != 165 {
		t.Fatalf("rows of %s on the target: %d %v", tables[1], n, err)
	}
	now2, _ := env.App.Pools().Placement(tenant)
	if err := move.Finish(ctx, tenant, now2, move.Options{}); err != nil {
		t.Fatal(err)
	}
	var left int
	server, cfg, err := move.OpenDB(at.DSN, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if err := server.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", cfg.DBName).Scan(&left); err != nil || left != 0 {
		t.Fatalf("source database after finish: %d %v", left, err)
	}
}

// TestMoveOneAtATime: a tenant has one move at a time. While a move is
// under way a move to another target is refused; once it is done (the
// tenant on its target, the source copy kept) a new move — onward or back
// by a new move instead of reverse — is refused and records nothing,
// until finish drops the source copy; then a new move begins (and is
// cancelled).
func TestMoveOneAtATime(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	second, targetDSN := mvStartSecond(t, tenant)
	thirdDSN := strings.ReplaceAll(second.DSNTemplate, "{tenant}", tenant+"c")
	sourceDSN, store := mvSourceStore(t, tenant)
	if code, out := runCLI(t, nil, "--config", tenantConfig(t, tenant, ""), "shard", "ensure", "--months=1"); code != 0 {
		t.Fatalf("shard ensure: %d %s", code, out)
	}
	ctx := context.Background()
	src, _, err := move.OpenDB(sourceDSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	now, err := routing.NewClock(testenv.Redis(t)).Month(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mvInsert(t, src, now.String(), "g_a", 1, 50)

	at := tenantdb.Placement{DSN: sourceDSN}
	o := mvBeginStopped(t, ctx, tenant, at, targetDSN, store)
	if _, err := move.Begin(ctx, tenant, at, thirdDSN, store, o); !errors.Is(err, move.ErrLastMoveOpen) {
		t.Fatalf("a move elsewhere while one is under way: %v, want ErrLastMoveOpen", err)
	}
	o.StepHook = nil
	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()

	moved := tenantdb.Placement{DSN: targetDSN, Epoch: at.Epoch + 1}
	for _, to := range []string{thirdDSN, sourceDSN} {
		if _, err := move.Begin(ctx, tenant, moved, to, store, o); !errors.Is(err, move.ErrLastMoveOpen) || !strings.Contains(err.Error(), "finish it") {
			t.Fatalf("a new move to %s before finish: %v, want ErrLastMoveOpen", to, err)
		}
	}
	if st, err := move.ReadState(ctx, targetDSN, nil); err != nil || st.Role != "target" || st.Step != move.StepDone {
		t.Fatalf("the done move after the refused ones: %+v %v", st, err)
	}
	if recs, _, err := store.Load(ctx); err != nil || recs[tenant].Epoch != moved.Epoch || recs[tenant].DSN != targetDSN {
		t.Fatalf("placement after the refused moves: %+v %v", recs[tenant], err)
	}

	if err := move.Finish(ctx, tenant, moved, o); err != nil {
		t.Fatal(err)
	}
	if m, err = move.Begin(ctx, tenant, moved, thirdDSN, store, o); err != nil {
		t.Fatalf("a new move after finish: %v", err)
	}
	if st := m.State(); st.Role != "source" || st.Step != move.StepPlan {
		t.Fatalf("the new move: %+v", st)
	}
	m.Close()
	if completed, err := move.Cancel(ctx, tenant, moved, store, o); err != nil || completed {
		t.Fatalf("cancel of the new move: %v %v", completed, err)
	}
}
