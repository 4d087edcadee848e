package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
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
	sourceDSN, store := mvSourceStore(t, tenant)
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

// TestMoveCLIKilledAfterThePlacement: `imshard tenant move` kills itself
// (IMSHARD_TEST_CRASH_MOVE=placed) right after the switch wrote the
// placement record, before it recorded the move's end, while sends and
// reads go on. The service follows the record onto the target at once and
// keeps storing there. The half-done switch is recorded on the target, so
// status says so and cancel, finish, reverse and a new move are refused
// (exit 1) without changing anything; resume only completes the
// bookkeeping — it copies nothing over what the target took since — and
// every message is then on the target exactly once, read back in full.
func TestMoveCLIKilledAfterThePlacement(t *testing.T) {
	t.Parallel()
	l := mvStartLive(t, 1)
	tenant, targetDSN, env, store, src := l.tenant, l.targetDSN, l.env, l.store, l.src
	ctx := context.Background()
	months, tables := l.months, l.tables
	for _, m := range months {
		mvInsert(t, src, m, "g_a", 1, 150)
	}
	at := l.at
	cfg := tenantConfig(t, tenant, "")
	cli := func(args ...string) (int, string) {
		return runCLI(t, nil, append([]string{"--config", cfg, "tenant", "move"}, args...)...)
	}

	// sends and reads through the move, the crash and the resume
	tr := mvStartTraffic(t, env, "mvk", true)
	sendWaitFor(t, 10*time.Second, "sends stored on the source", func() bool {
		n, _ := mvTopicRows(t, src, "mvk")
		return n >= 20
	})

	p := faultsStart(t, []string{testhook.CrashMoveEnv + "=" + testhook.MovePlaced},
		"--config", cfg, "tenant", "move", "--tenant="+tenant, "--to="+targetDSN, "--yes", "--chunk-rows=40")
	err := p.wait(t, 60*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the mover was to kill itself after the placement write: %v\n%s", err, p.out.String())
	}
	if recs, _, err := store.Load(ctx); err != nil || recs[tenant].Epoch != at.Epoch+1 || recs[tenant].DSN != targetDSN {
		t.Fatalf("placement after the kill: %+v %v, want the target at epoch %d", recs[tenant], err, at.Epoch+1)
	}
	if step, _ := mvState(t, src); step != move.StepSwitch {
		t.Fatalf("source step after the kill: %q, want switch", step)
	}
	st, err := move.ReadState(ctx, targetDSN, nil)
	if err != nil || !st.HalfSwitched() {
		t.Fatalf("target's move after the kill: %+v %v, want the half-done switch recorded", st, err)
	}

	// the service follows the record: the tenant is written on the target
	mvWaitEpoch(t, env, at.Epoch+1)
	dst, err := env.App.Pools().DB(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	before := tr.sent()
	sendWaitFor(t, 15*time.Second, "sends stored on the target", func() bool {
		n, _ := mvTopicRows(t, dst, "mvk")
		return n >= before+20
	})

	if code, out := cli("status", "--tenant="+tenant); code != 0 || !strings.Contains(out, "step switch") || !strings.Contains(out, "half done") {
		t.Fatalf("status of the half-done switch: %d %s", code, out)
	}
	for _, args := range [][]string{
		{"cancel", "--tenant=" + tenant},
		{"finish", "--tenant=" + tenant},
		{"reverse", "--tenant=" + tenant, "--yes"},
		{"--tenant=" + tenant, "--to=" + at.DSN, "--yes"},
	} {
		if code, out := cli(args...); code != 1 || !strings.Contains(out, "the switch is half done") || !strings.Contains(out, "resume") {
			t.Errorf("%v on the half-done switch: %d %s, want exit 1 naming the half-done switch and resume", args, code, out)
		}
	}
	if step, _ := mvState(t, src); step != move.StepSwitch {
		t.Fatalf("source step after the refusals: %q", step)
	}
	if st, err := move.ReadState(ctx, targetDSN, nil); err != nil || !st.HalfSwitched() {
		t.Fatalf("target's move after the refusals: %+v %v", st, err)
	}

	if code, out := cli("resume", "--tenant="+tenant); code != 0 || !strings.Contains(out, "moved") {
		t.Fatalf("resume of the half-done switch: %d %s", code, out)
	}
	if st, err := move.ReadState(ctx, targetDSN, nil); err != nil || st.Role != "target" || st.Step != move.StepDone {
		t.Fatalf("target's move after resume: %+v %v, want done", st, err)
	}
	if step, _ := mvState(t, src); step != move.StepDone {
		t.Fatalf("source step after resume: %q, want done", step)
	}
	if recs, _, err := store.Load(ctx); err != nil || recs[tenant].Epoch != at.Epoch+1 || recs[tenant].DSN != targetDSN {
		t.Fatalf("placement after resume: %+v %v", recs[tenant], err)
	}
	sendWaitFor(t, 10*time.Second, "more sends after resume", func() bool { return tr.sent() >= before+40 })
	tr.stopClean(t)

	// every 201 exactly once on the target, and read back in full
	tr.wantStoredOnce(t, dst)
	read := rpWalkSince(t, env, rpMember, "mvk", 50)
	seqs := tr.sortedSeqs()
	if fmt.Sprint(read) != fmt.Sprint(seqs) {
		t.Fatalf("read back %d seqs %v\nwant the %d answered %v", len(read), read, len(seqs), seqs)
	}
	if n := persistMetric(t, env, "group_message_dead_letter_total"); n != 0 {
		t.Fatalf("%v events dead-lettered", n)
	}
	// the rows the move copied are the source's, per topic-month
	want, got := mvDigest(t, src, tables...), mvDigest(t, dst, tables...)
	for _, tb := range tables {
		delete(want, tb+" mvk")
		delete(got, tb+" mvk")
	}
	if len(want) != 2 || fmt.Sprint(want) != fmt.Sprint(got) {
		t.Fatalf("per topic-month digests: source %v, target %v", want, got)
	}
	if code, out := cli("finish", "--tenant="+tenant); code != 0 || !strings.Contains(out, "dropped") {
		t.Fatalf("finish after resume: %d %s", code, out)
	}
}

// TestMoveSigstoppedPersistWritesOnceOnTheTarget: the mover is stopped
// with SIGSTOP in the middle of its catch-up while sends (and persist)
// keep writing to the source, then continued with SIGCONT: it catches up,
// switches, and every message answered 201 is on the target exactly once.
func TestMoveSigstoppedPersistWritesOnceOnTheTarget(t *testing.T) {
	t.Parallel()
	l := mvStartLive(t, 1)
	tenant, targetDSN, env, src := l.tenant, l.targetDSN, l.env, l.src
	ctx := context.Background()
	for _, m := range l.months {
		mvInsert(t, src, m, "g_a", 1, 300)
	}
	at := l.at
	tr := mvStartTraffic(t, env, "mvz", false)

	p := faultsStart(t, nil, "--config", tenantConfig(t, tenant, ""), "tenant", "move", "--tenant="+tenant, "--to="+targetDSN, "--yes", "--chunk-rows=5")
	sendWaitFor(t, 60*time.Second, "the mover catches up", func() bool {
		step, _ := mvState(t, src)
		return step == move.StepCatchUp || !p.running()
	})
	p.signal(t, syscall.SIGSTOP)
	if step, _ := mvState(t, src); step != move.StepCatchUp {
		p.signal(t, syscall.SIGCONT)
		t.Fatalf("the mover got past the catch-up (%s) before its SIGSTOP\n%s", step, p.out.String())
	}
	// persist keeps writing to the source while the mover sleeps
	before := tr.sent()
	sendWaitFor(t, 15*time.Second, "sends stored on the source while the mover is stopped", func() bool {
		n, _ := mvTopicRows(t, src, "mvz")
		return n >= before+50
	})
	p.signal(t, syscall.SIGCONT)
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("the continued mover: %v\n%s", err, p.out.String())
	}
	mvWaitEpoch(t, env, at.Epoch+1)
	time.Sleep(300 * time.Millisecond)
	tr.stopClean(t)
	dst, err := env.App.Pools().DB(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	tr.wantStoredOnce(t, dst)
}
