package shardmgr

import (
	"database/sql"
	"slices"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

func months(ms []routing.Month) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return out
}

func TestExpectedMonths(t *testing.T) {
	tests := []struct {
		name  string
		now   string
		ahead int
		from  string
		want  []string
	}{
		{"default two ahead", "202611", 2, "", []string{"202610", "202611", "202612", "202701"}},
		{"across the year", "202612", 3, "", []string{"202611", "202612", "202701", "202702", "202703"}},
		{"january looks back to december", "202701", 0, "", []string{"202612", "202701"}},
		{"from extends back", "202611", 1, "202607", []string{"202607", "202608", "202609", "202610", "202611", "202612"}},
		{"from newer than prev is ignored", "202611", 1, "202611", []string{"202610", "202611", "202612"}},
		{"range edge clipped", "219911", 3, "", []string{"219910", "219911", "219912"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var from routing.Month
			if tt.from != "" {
				from = routing.MustMonth(tt.from)
			}
			got := months(ExpectedMonths(routing.MustMonth(tt.now), tt.ahead, from))
			if len(got) != len(tt.want) {
				t.Fatalf("got %v want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("got %v want %v", got, tt.want)
				}
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	now := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	grace := 7 * 24 * time.Hour
	at := func(d time.Duration) sql.NullTime { return sql.NullTime{Time: now.Add(-d), Valid: true} }
	shard := func(m string, st routing.Status, deact sql.NullTime) routing.Shard {
		return routing.Shard{Month: routing.MustMonth(m), Status: st, DeactivatedAt: deact}
	}
	shards := []routing.Shard{
		shard("202608", routing.StatusSealed, at(60*24*time.Hour)),
		shard("202609", routing.StatusSealing, at(8*24*time.Hour)), // grace over
		shard("202610", routing.StatusSealing, at(2*24*time.Hour)), // still in grace
		shard("202610", routing.StatusSealing, sql.NullTime{}),     // never stamped: keep
		shard("202611", routing.StatusWritable, sql.NullTime{}),    // active
		shard("202612", routing.StatusWritable, sql.NullTime{}),    // future, writable
		shard("202607", routing.StatusWritable, sql.NullTime{}),    // history created by --from
	}
	got := map[string]routing.Status{}
	for _, tr := range Lifecycle(shards, routing.MustMonth("202611"), now, grace) {
		got[tr.Month.String()] = tr.To
	}
	want := map[string]routing.Status{"202609": routing.StatusSealed, "202607": routing.StatusSealing}
	if len(got) != len(want) {
		t.Fatalf("got %v want %v", got, want)
	}
	for m, st := range want {
		if got[m] != st {
			t.Fatalf("got %v want %v", got, want)
		}
	}
	if tr := Lifecycle(shards, routing.Month{}, now, grace); tr != nil {
		t.Fatalf("no active month must change nothing, got %v", tr)
	}
}

func TestNearBoundary(t *testing.T) {
	tests := []struct {
		at   string
		want bool
	}{
		{"2026-11-30T23:30:00Z", true},
		{"2026-12-01T00:10:00Z", true},
		{"2026-11-15T12:00:00Z", false},
		{"2026-11-30T22:00:00Z", false},
	}
	for _, tt := range tests {
		at, _ := time.Parse(time.RFC3339, tt.at)
		if got := nearBoundary(at, time.Hour); got != tt.want {
			t.Errorf("nearBoundary(%s) = %v", tt.at, got)
		}
	}
}

// TestHoldForMigration: while a tenant migrates from its legacy table, the
// months from its oldest legacy month on are not sealed (the backfill
// writes them); sealing starts, and older months seal, as before.
func TestHoldForMigration(t *testing.T) {
	m := func(s string) routing.Month {
		mm, err := routing.ParseMonth(s)
		if err != nil {
			t.Fatal(err)
		}
		return mm
	}
	trs := []Transition{{m("202601"), routing.StatusSealed}, {m("202603"), routing.StatusSealed}, {m("202604"), routing.StatusSealing}}
	mig := routing.Migration{State: routing.MigrationBackfilling, MinMonth: m("202602")}
	got := HoldForMigration(trs, mig)
	want := []Transition{{m("202601"), routing.StatusSealed}, {m("202604"), routing.StatusSealing}}
	if !slices.Equal(got, want) {
		t.Fatalf("during a migration: %v, want %v", got, want)
	}
	mig.State = routing.MigrationFinished
	if got := HoldForMigration(trs, mig); !slices.Equal(got, trs) {
		t.Fatalf("after finish: %v, want %v", got, trs)
	}
}
