package test

import (
	"context"
	"database/sql"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// mvState is the move's step and rows copied on db (none: "").
func mvState(t *testing.T, db *sql.DB) (string, int64) {
	t.Helper()
	var step string
	var rows int64
	err := db.QueryRow("SELECT step, rows_copied FROM im_tenant_move WHERE id = 1").Scan(&step, &rows)
	if err == sql.ErrNoRows {
		return "", 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return step, rows
}

// mvKillMidCopy starts `imshard tenant move` and kill -9s it once it has
// copied rows but not finished the copy.
func mvKillMidCopy(t *testing.T, src *sql.DB, args ...string) {
	t.Helper()
	p := faultsStart(t, nil, args...)
	sendWaitFor(t, 20*time.Second, "the mover copies", func() bool {
		step, rows := mvState(t, src)
		return step == move.StepCopy && rows > 0
	})
	p.kill9(t)
	if step, _ := mvState(t, src); step != move.StepCopy {
		t.Fatalf("the mover got past the copy (%s) before its kill: chunks too big", step)
	}
}

// TestMoveCLIKilledCancelledAndResumed: `imshard tenant move` is killed
// with SIGKILL in the middle of the copy; status tells where it stood;
// cancel drops the target copy and leaves the source (fence, placement,
// rows) as it was; a new move killed again, then paused (status says so),
// is driven to its end by `resume`, and every row is on the target exactly once.
func TestMoveCLIKilledCancelledAndResumed(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	_, targetDSN := mvStartSecond(t, tenant)
	sourceDSN := strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant)
	servers, err := placement.DefaultServers([]string{sourceDSN})
	if err != nil {
		t.Fatal(err)
	}
	store, err := placement.Open(servers, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Delete(context.Background(), tenant); _ = store.Close() })
	cfg := tenantConfig(t, tenant, "")
	if code, out := runCLI(t, nil, "--config", cfg, "shard", "ensure", "--months=2"); code != 0 {
		t.Fatalf("shard ensure: %d %s", code, out)
	}
	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	src, _, err := move.OpenDB(sourceDSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	months := []string{now.String(), now.Next().String()}
	tables := []string{"im_group_messages_" + months[0], "im_group_messages_" + months[1]}
	for _, m := range months {
		mvInsert(t, src, m, "g_a", 1, 300)
		mvInsert(t, src, m, "g_c", 1, 100)
	}
	want := mvDigest(t, src, tables...)
	moveArgs := []string{"--config", cfg, "tenant", "move", "--tenant=" + tenant, "--to=" + targetDSN, "--yes", "--chunk-rows=2"}

	// without --yes and without a terminal: refused, nothing recorded
	if code, out := runCLI(t, nil, moveArgs[:len(moveArgs)-2]...); code != 2 || !strings.Contains(out, "--yes") {
		t.Fatalf("move without --yes off a terminal: %d %s", code, out)
	}
	if step, _ := mvState(t, src); step != "" {
		t.Fatalf("a refused move recorded step %q", step)
	}

	// a target that is the source database itself: refused, nothing recorded
	if code, out := runCLI(t, nil, "--config", cfg, "tenant", "move", "--tenant="+tenant, "--to="+sourceDSN, "--yes"); code != 1 || !strings.Contains(out, "current database") {
		t.Fatalf("move onto itself: %d %s", code, out)
	}
	if step, _ := mvState(t, src); step != "" {
		t.Fatalf("a move onto itself recorded step %q", step)
	}

	mvKillMidCopy(t, src, moveArgs...)
	// the shard manager's retention and archive wait for a move under way
	if moving, err := move.Moving(context.Background(), src); err != nil || !moving {
		t.Fatalf("Moving mid-copy: %v %v", moving, err)
	}
	code, out := runCLI(t, nil, "--config", cfg, "tenant", "move", "status", "--tenant="+tenant)
	if code != 0 || !strings.Contains(out, "step copy") || !strings.Contains(out, "lag ") {
		t.Fatalf("status after the kill: %d %s", code, out)
	}
	if code, out := runCLI(t, nil, "--config", cfg, "tenant", "move", "cancel", "--tenant="+tenant); code != 0 || !strings.Contains(out, "cancelled") {
		t.Fatalf("cancel: %d %s", code, out)
	}
	server, tcfg, err := move.OpenDB(targetDSN, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	var n int
	if err := server.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", tcfg.DBName).Scan(&n); err != nil || n != 0 {
		t.Fatalf("target database after cancel: %d %v", n, err)
	}
	if step, _ := mvState(t, src); step != move.StepCancelled {
		t.Fatalf("step after cancel: %q", step)
	}
	if moving, err := move.Moving(context.Background(), src); err != nil || moving {
		t.Fatalf("Moving after cancel: %v %v", moving, err)
	}
	if e := mvFence(t, src); e != 0 {
		t.Fatalf("source fence after cancel: %d", e)
	}
	if recs, _, err := store.Load(context.Background()); err != nil || recs[tenant].Epoch != 0 {
		t.Fatalf("placement after cancel: %+v %v", recs[tenant], err)
	}
	if got := mvDigest(t, src, tables...); len(got) != 4 || strings.Join(mapLines(got), ",") != strings.Join(mapLines(want), ",") {
		t.Fatalf("source after cancel: %v, want %v", got, want)
	}

	// a new move, killed again, then resumed to its end
	mvKillMidCopy(t, src, moveArgs...)
	if code, out := runCLI(t, nil, "--config", cfg, "tenant", "move", "pause", "--tenant="+tenant); code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: %d %s", code, out)
	}
	if code, out := runCLI(t, nil, "--config", cfg, "tenant", "move", "status", "--tenant="+tenant); code != 0 || !strings.Contains(out, "step copy (paused)") {
		t.Fatalf("status of a paused move: %d %s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "tenant", "move", "resume", "--tenant="+tenant, "--chunk-rows=500")
	if code != 0 || !strings.Contains(out, "moved") {
		t.Fatalf("resume: %d %s", code, out)
	}
	dst, _, err := move.OpenDB(targetDSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if got := mvDigest(t, dst, tables...); strings.Join(mapLines(got), ",") != strings.Join(mapLines(want), ",") {
		t.Fatalf("target after the move: %v, want %v", got, want)
	}
	if recs, _, err := store.Load(context.Background()); err != nil || recs[tenant].Epoch != 1 || recs[tenant].DSN != targetDSN {
		t.Fatalf("placement after the move: %+v %v", recs[tenant], err)
	}
	code, out = runCLI(t, nil, "--config", cfg, "tenant", "move", "status", "--tenant="+tenant, "--output=json")
	if code != 0 || !strings.Contains(out, `"role": "target"`) || !strings.Contains(out, `"step": "done"`) || strings.Contains(out, `"rows_copied": 0,`) {
		t.Fatalf("status after the move: %d %s", code, out)
	}
}

func mapLines(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
