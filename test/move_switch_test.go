package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/testenv"
)

// mvSwitchSetup is a tenant with its current month table on the shared
// server (at, src), a second server as the target, the placement store
// and the month.
func mvSwitchSetup(t *testing.T) (tenant, targetDSN string, store *placement.Store, at tenantdb.Placement, src *sql.DB, month string) {
	t.Helper()
	tenant = testenv.NewTenant(t)
	_, targetDSN = mvStartSecond(t, tenant)
	sourceDSN, st := mvSourceStore(t, tenant)
	store, at = st, tenantdb.Placement{DSN: sourceDSN}
	var err error
	if code, out := runCLI(t, nil, "--config", tenantConfig(t, tenant, ""), "shard", "ensure", "--months=1"); code != 0 {
		t.Fatalf("shard ensure: %d %s", code, out)
	}
	if src, _, err = move.OpenDB(sourceDSN, nil, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tenant, targetDSN, store, at, src, now.String()
}

// mvTriggers counts the triggers of db's database, and the marks it holds.
func mvTriggers(t *testing.T, db *sql.DB) (triggers, marks int) {
	t.Helper()
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.triggers WHERE trigger_schema = DATABASE()").Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT COUNT(*) FROM im_tenant_move_marks").Scan(&marks); err != nil {
		t.Fatal(err)
	}
	return triggers, marks
}

// TestMoveSwitchCopiesOnlyWhatChanged: the verification runs before the
// fence, and behind it the switch copies and verifies only the rows
// changed since (marked by the source's triggers) and the chunks that
// verification never proved. A row changed between the verification and
// the fence is copied and compared before it (its chunk, copied again by
// the pre-checks' catch-up, compared behind the fence); rows changed just before the fence (an
// update, an insert, a delete) are copied behind it; rows inserted past
// the last chunk's start make the switch split it; the mover is killed
// behind the fence and resumed, with a table created meanwhile. The
// resumed switch copies the three marked rows and the new table's one
// chunk, not the other chunks, and both copies end equal (a composite key's
// chunks too); the triggers
// and marks are gone once the move is done, and the target never had any.
func TestMoveSwitchCopiesOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	tenant, targetDSN, store, at, src, month := mvSwitchSetup(t)
	ctx := context.Background()
	mvInsert(t, src, month, "g_a", 1, 200)
	// a composite key: chunks end inside a topic
	for _, topic := range []string{"g_a", "g_b", "g_c"} {
		for u := 1; u <= 25; u++ {
			if _, err := src.Exec("INSERT INTO im_group_members (topic, user_id) VALUES (?, ?)", topic, u); err != nil {
				t.Fatal(err)
			}
		}
	}
	table := "im_group_messages_" + month
	later := "im_group_messages_209901"
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := src.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}

	killed := errors.New("killed")
	o := move.Options{ChunkRows: 20, StepHook: func(step string) error {
		switch step {
		case move.HookVerified:
			exec("UPDATE "+table+" SET content = ? WHERE topic = 'g_a' AND seqid = 5", `{"text":"after the verification"}`)
			// past the last chunk's start: the switch's catch-up splits it in 3
			mvInsert(t, src, month, "g_b", 1, 45)
		case move.HookFenced:
			// writers that committed just before the fence
			exec("UPDATE "+table+" SET content = ? WHERE topic = 'g_a' AND seqid = 7", `{"text":"before the fence"}`)
			mvInsert(t, src, month, "g_a", 1000, 1)
			exec("DELETE FROM " + table + " WHERE topic = 'g_a' AND seqid = 9")
			exec("UPDATE im_group_members SET role = 'admin' WHERE topic = 'g_b' AND user_id = 16")
			return killed
		}
		return nil
	}}
	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); !errors.Is(err, killed) {
		t.Fatalf("first run: %v, want it killed behind the fence", err)
	}
	m.Close()
	tables, err := move.CopiedTables(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if trig, marks := mvTriggers(t, src); trig != 3*len(tables) || marks != 4 {
		t.Fatalf("source behind the fence: %d triggers (want 3 on each of %d tables), %d marks (want 4)", trig, len(tables), marks)
	}
	// a table created after the verification (as the shard manager makes
	// next month's), with a row
	exec("CREATE TABLE " + later + " LIKE " + table)
	mvInsert(t, src, "209901", "g_b", 1, 1)

	o.StepHook = nil
	if m, err = move.Resume(ctx, tenant, at, store, o); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	// the pre-checks' catch-up copied again the chunk of the row updated
	// after the verification: its proof taken back, it is compared too
	if w := m.Work(); w != (move.SwitchWork{Keys: 4, Compared: 5, Chunks: 1}) {
		t.Fatalf("behind the fence: %+v, want the 4 marked rows, the 3 chunks split from the month table's last, the chunk the pre-checks copied again and the new table's 1 compared, and only the latter copied", w)
	}
	dst, _, err := move.OpenDB(targetDSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	want, got := mvDigest(t, src, table, later), mvDigest(t, dst, table, later)
	if fmt.Sprint(want) != fmt.Sprint(got) || want[table+" g_a"] == "" || want[table+" g_b"] == "" || want[later+" g_b"] == "" {
		t.Fatalf("digests: source %v, target %v", want, got)
	}
	var content string
	if err := dst.QueryRow("SELECT content FROM " + table + " WHERE topic = 'g_a' AND seqid = 5").Scan(&content); err != nil || !strings.Contains(content, "after the verification") {
		t.Fatalf("the row changed after the verification on the target: %q %v", content, err)
	}
	members := func(db *sql.DB) string {
		t.Helper()
		var s string
		if err := db.QueryRow("SELECT CONCAT(COUNT(*), ':', SUM(CRC32(CONCAT_WS(':', topic, user_id, role))), ':', " +
			"(SELECT role FROM im_group_members WHERE topic = 'g_b' AND user_id = 16)) FROM im_group_members").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if a, b := members(src), members(dst); a != b || !strings.HasSuffix(a, ":admin") {
		t.Fatalf("members: source %s, target %s", a, b)
	}
	var n int
	if err := dst.QueryRow("SELECT COUNT(*) FROM " + table + " WHERE topic = 'g_a' AND seqid IN (9, 1000)").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the deleted and the inserted row on the target: %d rows, want 1 (%v)", n, err)
	}
	if trig, marks := mvTriggers(t, src); trig != 0 || marks != 0 {
		t.Fatalf("source after the move: %d triggers, %d marks", trig, marks)
	}
	if trig, marks := mvTriggers(t, dst); trig != 0 || marks != 0 {
		t.Fatalf("target after the move: %d triggers, %d marks", trig, marks)
	}
}

// TestMoveCancelDropsTheMarks: a move cancelled before its switch leaves
// no trigger and no mark on the source.
func TestMoveCancelDropsTheMarks(t *testing.T) {
	t.Parallel()
	tenant, targetDSN, store, at, src, month := mvSwitchSetup(t)
	ctx := context.Background()
	mvInsert(t, src, month, "g_a", 1, 30)
	o := mvBeginStopped(t, ctx, tenant, at, targetDSN, store)
	mvInsert(t, src, month, "g_a", 100, 2)
	if trig, marks := mvTriggers(t, src); trig == 0 || marks != 2 {
		t.Fatalf("source while copying: %d triggers, %d marks (want 2)", trig, marks)
	}
	if completed, err := move.Cancel(ctx, tenant, at, store, o); err != nil || completed {
		t.Fatalf("cancel: %v %v", completed, err)
	}
	if trig, marks := mvTriggers(t, src); trig != 0 || marks != 0 {
		t.Fatalf("source after the cancel: %d triggers, %d marks", trig, marks)
	}
}
