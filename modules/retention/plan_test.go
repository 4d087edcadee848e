package retention

import (
	"database/sql"
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

func TestExpired(t *testing.T) {
	dec := routing.MustMonth("202612")
	for _, c := range []struct {
		m      string
		months int
		want   bool
	}{
		{"202611", 1, false}, // N = 1 in December keeps November and December
		{"202610", 1, true},
		{"202612", 1, false},
		{"201001", 0, false}, // 0 keeps forever
		{"202609", 3, false},
		{"202608", 3, true},
		{"202512", 12, false},
		{"202511", 12, true},
	} {
		if got := Expired(routing.MustMonth(c.m), dec, c.months); got != c.want {
			t.Errorf("Expired(%s, 202612, %d) = %v, want %v", c.m, c.months, got, c.want)
		}
	}
}

func month(m string, st routing.Status, rows int64, topics ...routing.MirrorRow) MonthState {
	s := routing.Shard{Month: routing.MustMonth(m), Status: st}
	if rows >= 0 {
		s.RowCount, s.StatsAt = rows, sql.NullTime{Valid: true}
	}
	return MonthState{Shard: s, Topics: topics}
}

func row(topic string, lo, hi int64) routing.MirrorRow {
	return routing.MirrorRow{Topic: topic, MonthRange: routing.MonthRange{MinSeq: lo, MaxSeq: hi, Count: hi - lo + 1}}
}

func TestDecide(t *testing.T) {
	now := routing.MustMonth("202612")
	months := []MonthState{
		month("202608", routing.StatusSealed, 30, row("a", 1, 10), row("b", 1, 20)),       // every topic expired: drop
		month("202609", routing.StatusSealed, 25, row("a", 11, 20), row("keep", 1, 15)),   // "keep" keeps it: trim a
		month("202603", routing.StatusArchived, -1, row("a", 21, 30)),                     // archived, every topic expired: drop
		month("202602", routing.StatusArchived, 9, row("a", 41, 45), row("keep", 16, 19)), // archived, "keep" keeps it: skipped
		month("202611", routing.StatusSealed, 10, row("a", 31, 40)),                       // within retention
		month("202607", routing.StatusExpiring, 7, row("x", 1, 7)),                        // resumed
		month("202606", routing.StatusSealing, -1, row("b", 100, 104)),                    // not sealed
		month("202605", routing.StatusSealed, 0),                                          // empty and expired: drop
		month("202604", routing.StatusSealed, 5, row("short", 1, 5), row("keep", 1, 9)),   // per-topic shorter
	}
	p := Decide("t", now, 2, map[string]int{"keep": 0}, months)
	if len(p.Drops) != 4 || p.Drops[0].Month != "202608" || p.Drops[0].Rows != 30 || p.Drops[0].Archived ||
		p.Drops[1].Month != "202603" || !p.Drops[1].Archived || p.Drops[1].Rows != 10 ||
		p.Drops[2].Month != "202607" || !p.Drops[2].Resumed || p.Drops[3].Month != "202605" {
		t.Fatalf("drops %+v", p.Drops)
	}
	if len(p.Trims) != 2 || p.Trims[0].Topic != "a" || p.Trims[0].Month != "202609" || p.Trims[0].Rows != 10 ||
		p.Trims[1].Topic != "short" || p.Trims[1].Month != "202604" {
		t.Fatalf("trims %+v", p.Trims)
	}
	if len(p.Skipped) != 2 || p.Skipped[0].Month != "202602" || p.Skipped[0].Topics != 1 || p.Skipped[0].Rows != 5 ||
		p.Skipped[1].Month != "202606" || p.Skipped[1].Rows != 5 {
		t.Fatalf("skipped %+v", p.Skipped)
	}
	if p.Rows() != 30+10+7+0+10+5 {
		t.Fatalf("rows %d", p.Rows())
	}
	// nothing expires with retention 0 and no group shorter
	if p := Decide("t", now, 0, nil, months[:5]); len(p.Drops)+len(p.Trims)+len(p.Skipped) != 0 {
		t.Fatalf("retention 0 removed %+v", p)
	}
	// a group's own shorter retention under a tenant keeping forever
	p = Decide("t", now, 0, map[string]int{"a": 1}, months[:2])
	if len(p.Trims) != 2 || p.Trims[0].Topic != "a" || p.Trims[1].Topic != "a" || len(p.Drops) != 0 {
		t.Fatalf("per-group retention: %+v", p)
	}
}

// TestDecideHolds: a month holding a held topic is not dropped whole, its
// other expired topics are trimmed instead; a topic held in one month is
// kept in every month of the plan; the plan says what is held and why.
func TestDecideHolds(t *testing.T) {
	now := routing.MustMonth("202612")
	held := func(ms MonthState, why map[string]string) MonthState { ms.Held = why; return ms }
	months := []MonthState{
		held(month("202607", routing.StatusSealed, 15, row("a", 1, 5), row("h", 1, 10)), map[string]string{"h": "hold L: case 1"}),
		month("202608", routing.StatusSealed, 12, row("h", 11, 20), row("b", 1, 2)), // h held by the older month's hold
		month("202609", routing.StatusSealed, 3, row("c", 1, 3)),                    // nothing held: drop
	}
	p := Decide("t", now, 2, nil, months)
	if len(p.Drops) != 1 || p.Drops[0].Month != "202609" {
		t.Fatalf("drops %+v", p.Drops)
	}
	if len(p.Trims) != 2 || p.Trims[0].Topic != "a" || p.Trims[0].Month != "202607" || p.Trims[1].Topic != "b" || p.Trims[1].Month != "202608" {
		t.Fatalf("trims %+v", p.Trims)
	}
	if len(p.Held) != 2 || p.Held[0] != (Held{Month: "202607", Topic: "h", Rows: 10, Reason: "hold L: case 1"}) ||
		p.Held[1] != (Held{Month: "202608", Topic: "h", Rows: 10, Reason: "hold L: case 1"}) {
		t.Fatalf("held %+v", p.Held)
	}
	if p.Rows() != 3+5+2 {
		t.Fatalf("rows %d", p.Rows())
	}
}
