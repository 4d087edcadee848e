package routing

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestSplitsOfKeepsMonthRangesContiguous(t *testing.T) {
	m := func(s string) Month {
		mm, err := ParseMonth(s)
		if err != nil {
			t.Fatal(err)
		}
		return mm
	}
	for _, tt := range []struct {
		name  string
		first map[Month]int64
		want  []Split
	}{
		{"in order", map[Month]int64{m("202601"): 1, m("202602"): 40, m("202603"): 90},
			[]Split{{m("202601"), 1}, {m("202602"), 40}, {m("202603"), 90}}},
		// a row of seq 10 created in February starts February there
		{"skew forward", map[Month]int64{m("202601"): 1, m("202602"): 10, m("202603"): 90},
			[]Split{{m("202601"), 1}, {m("202602"), 10}, {m("202603"), 90}}},
		// every January row follows a February one: January gets no range
		{"month swallowed", map[Month]int64{m("202601"): 50, m("202602"): 1, m("202603"): 90},
			[]Split{{m("202602"), 1}, {m("202603"), 90}}},
		{"one month", map[Month]int64{m("202601"): 7}, []Split{{m("202601"), 7}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := SplitsOf(tt.first)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := 1; i < len(got); i++ {
				if got[i].FirstSeq <= got[i-1].FirstSeq || !got[i].Month.After(got[i-1].Month) {
					t.Fatalf("not contiguous and ordered: %v", got)
				}
			}
		})
	}
	sp := []Split{{m("202601"), 1}, {m("202602"), 10}, {m("202603"), 90}}
	for seq, want := range map[int64]string{1: "202601", 9: "202601", 10: "202602", 89: "202602", 90: "202603", 1000: "202603"} {
		if got := MonthOfSeq(sp, seq); got != m(want) {
			t.Errorf("seq %d → %s, want %s", seq, got, want)
		}
	}
}

// TestMigrationTransitions: every state but none is reached by some step,
// and the gate follows the state: sends and changes open at cutover's end
// (a change of a legacy row copies it first), the dual read ends at finish.
func TestMigrationTransitions(t *testing.T) {
	reached := map[MigrationState]bool{}
	for _, tr := range MigrationTransitions {
		reached[tr.To] = true
	}
	for _, s := range []MigrationState{MigrationPlanned, MigrationCutover, MigrationBackfilling, MigrationPaused,
		MigrationVerifying, MigrationDone, MigrationFinished} {
		if !reached[s] {
			t.Errorf("no step reaches %s", s)
		}
	}
	for s, want := range map[MigrationState][3]bool{
		MigrationNone:        {false, false, false},
		MigrationPlanned:     {true, true, true},
		MigrationCutover:     {true, true, true},
		MigrationBackfilling: {false, false, true},
		MigrationPaused:      {false, false, true},
		MigrationVerifying:   {false, false, true},
		MigrationDone:        {false, false, true},
		MigrationFinished:    {false, false, false},
	} {
		if got := [3]bool{s.RefusesSends(), s.RefusesChanges(), s.DualRead()}; got != want {
			t.Errorf("%s: sends refused, changes refused, dual read = %v, want %v", s, got, want)
		}
	}
}

// unreachableDBs is a MySQL that never answers, for tenants the
// configuration names (all but those in gone).
type unreachableDBs struct{ gone map[string]bool }

func (unreachableDBs) DB(context.Context, string) (*sql.DB, error) {
	return nil, errors.New("mysql unreachable")
}

func (d unreachableDBs) Has(tenant string) bool { return !d.gone[tenant] }

// TestMigrationsForgetATenantTheConfigurationDropped: a tenant removed from
// the configuration (a reload) leaves the refresh loop at its next pass,
// without a read or a warning — before, its refresh failed and warned once
// a second for as long as the process ran — while a tenant still named is
// read again (here, unreachably: warned about and kept).
func TestMigrationsForgetATenantTheConfigurationDropped(t *testing.T) {
	var logs bytes.Buffer
	g := NewMigrations(unreachableDBs{gone: map[string]bool{"gone": true}}, nil, KeySpace{}, NewScripts(), zerolog.New(&logs))
	now := g.now()
	g.states["gone"] = migrationCopy{state: MigrationNone, readAt: now}
	g.states["kept"] = migrationCopy{state: MigrationNone, readAt: now}
	g.refresh(context.Background())
	if _, ok := g.states["gone"]; ok {
		t.Error("the removed tenant's state is still refreshed")
	}
	if _, ok := g.states["kept"]; !ok {
		t.Error("a configured tenant's state was forgotten on a failed refresh")
	}
	if out := logs.String(); strings.Contains(out, `"tenant":"gone"`) || !strings.Contains(out, `"tenant":"kept"`) {
		t.Errorf("warnings: %s; want one for kept only", out)
	}
}

// TestMigrationGateRefusesWritesOnceTheStateCopyIsStale: a process whose
// refreshes of a tenant's migration state fail keeps deciding on its last
// copy only up to MigrationStaleAfter; past it the tenant's sends and
// changes are refused (ErrMigrationStateUnknown) rather than let through
// on a state that may have moved, while reads keep the last copy. A
// tenant whose state was never read is refused the same way. The clock is
// the test's: no waiting.
func TestMigrationGateRefusesWritesOnceTheStateCopyIsStale(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	g := NewMigrations(unreachableDBs{}, nil, KeySpace{}, NewScripts(), zerolog.Nop())
	g.now = func() time.Time { return now }
	g.states["acme"] = migrationCopy{state: MigrationNone, readAt: now}
	var unknown *ErrMigrationStateUnknown
	for period := time.Duration(1); period*MigrationRefresh <= MigrationStaleAfter; period++ {
		now = now.Add(MigrationRefresh)
		if _, err := g.load(ctx, "acme"); err == nil {
			t.Fatal("a refresh from an unreachable MySQL succeeded")
		}
		if err := g.GateSend(ctx, "acme"); err != nil {
			t.Fatalf("send refused %d refresh periods after the last read: %v", period, err)
		}
	}
	now = now.Add(time.Millisecond)
	if err := g.GateSend(ctx, "acme"); !errors.As(err, &unknown) {
		t.Fatalf("send past the stale bound: %v, want ErrMigrationStateUnknown", err)
	}
	if err := g.GateChange(ctx, "acme"); !errors.As(err, &unknown) {
		t.Fatalf("change past the stale bound: %v, want ErrMigrationStateUnknown", err)
	}
	if s, err := g.State(ctx, "acme"); err != nil || s != MigrationNone {
		t.Fatalf("reads past the stale bound: %s %v, want the last copy", s, err)
	}
	if err := g.GateSend(ctx, "never-read"); !errors.As(err, &unknown) {
		t.Fatalf("send of a tenant never read: %v, want ErrMigrationStateUnknown", err)
	}
}
