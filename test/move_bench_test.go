package test

import (
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/test/testenv"
)

// `imshard bench move` runs end to end on a tiny fixture — the load, the
// raw copy and the move to the private mariadbd it starts, by a mover
// process of its own (`tenant move`, whose step lines it times) — prints every
// bar, leaves neither tenant's database behind on the shared server, and
// rejects bad usage with exit 2 (figures are not asserted: they belong to
// docs/performance.md).
func TestMoveBenchCommand(t *testing.T) {
	t.Parallel()
	tenant, other := testenv.NewTenant(t), testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	// three minutes: the fixture, the private server, the roles and the
	// mover's own processes start on a machine that may be loaded
	code, stdout, stderr := runCLIWithin(t, 3*time.Minute, nil, "--config", cfg, "bench", "move", "--tenant", tenant, "--other", other,
		"--rows=400", "--topics=2", "--months=2", "--send-rate=20", "--read-rate=20", "--warmup=0s", "--baseline=1s", "--tail=0s")
	out := stdout + stderr
	for _, want := range []string{"moving tenant: failed sends", "moving tenant: failed reads", "sends stored exactly once",
		"persistence paused", "changes held", "other tenant: send p99", "raw streamed copy", "verification"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("bench move: exit %d, want %q in\n%s", code, want, out)
		}
	}
	admin, err := sql.Open("mysql", testenv.MySQLAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, id := range []string{tenant, other} {
		var n int
		if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE ?", "%"+id+"%").Scan(&n); err != nil || n != 0 {
			t.Errorf("bench move left %d databases of %s (%v)", n, id, err)
		}
	}
	for _, bad := range [][]string{{"--rows=0"}, {"--months=1"}, {"--rows=1000"}, {"--tenant=Bad-Id"}, {"--other", tenant, "--tenant", tenant}} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg, "bench", "move"}, bad...)...); code != 2 {
			t.Fatalf("bench move %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
}

// TestMoveBenchMarksAreTheMoversNames: the step and part names bench move
// times the move by are the ones the mover reaches (its steps and
// StepHook's parts), which `tenant move` prints and the bench reads back;
// a renamed step would leave its mark unset and its figure wrong, not
// failing.
func TestMoveBenchMarksAreTheMoversNames(t *testing.T) {
	want := []string{move.StepCopy, move.HookProving, move.HookProven, move.HookCopied, move.StepCatchUp,
		move.StepVerify, move.HookVerified, move.HookFenced, move.HookSynced}
	if !slices.Equal(bench.MoveMarks, want) {
		t.Errorf("bench move marks %q, the mover reaches %q", bench.MoveMarks, want)
	}
}
