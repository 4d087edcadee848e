package readpath

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// mirrorOf is a topic's mirror of the given (month, minSeq, maxSeq)
// rows, oldest first as the mirror holds them.
func mirrorOf(rows ...routing.MonthRange) routing.TopicMirror {
	m := routing.TopicMirror{}
	for _, r := range rows {
		m.Rows = append(m.Rows, routing.MirrorRow{Topic: "t", MonthRange: r})
	}
	return m
}

func monthRange(month string, lo, hi int64) routing.MonthRange {
	return routing.MonthRange{Month: routing.MustMonth(month), MinSeq: lo, MaxSeq: hi, Count: hi - lo + 1}
}

func months(ss ...string) []routing.Month {
	var out []routing.Month
	for _, s := range ss {
		out = append(out, routing.MustMonth(s))
	}
	return out
}

// TestPlanCount: an unread count reads only the months holding a seq above
// the cursor, newest first; nothing when neither the mirror nor the legacy
// table holds one; and one month without legacy rows above the cursor is
// countable with the other topics of that month.
func TestPlanCount(t *testing.T) {
	three := mirrorOf(monthRange("202608", 1, 10), monthRange("202609", 11, 20), monthRange("202610", 21, 30))
	cases := []struct {
		name     string
		after    int64
		mirror   routing.TopicMirror
		leg      routing.LegacySource
		none     bool
		months   []routing.Month
		oneMonth string // "" : not one month
	}{
		{name: "nothing stored", after: 0, none: true},
		{name: "all read", after: 30, mirror: three, none: true},
		{name: "above the newest month's first seq", after: 25, mirror: three, months: months("202610"), oneMonth: "202610"},
		{name: "at a month's last seq", after: 20, mirror: three, months: months("202610"), oneMonth: "202610"},
		{name: "two months", after: 15, mirror: three, months: months("202610", "202609")},
		{name: "never read", after: 0, mirror: three, months: months("202610", "202609", "202608")},
		{name: "legacy rows above the cursor only", after: 30, mirror: three,
			leg: routing.LegacySource{Hi: 40, Split: true}},
		{name: "legacy rows above the cursor beside a month", after: 25, mirror: three,
			leg: routing.LegacySource{Hi: 40, Split: true}, months: months("202610")},
		{name: "before cutover: the legacy table may hold anything", after: 25, mirror: three,
			leg: routing.LegacySource{Hi: math.MaxInt64}, months: months("202610")},
		{name: "legacy rows all read", after: 25, mirror: three,
			leg: routing.LegacySource{Hi: 12, Split: true}, months: months("202610"), oneMonth: "202610"},
		{name: "legacy and mirror all read", after: 30, mirror: three,
			leg: routing.LegacySource{Hi: 12, Split: true}, none: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pl := PlanCount("t", 7, c.after, c.mirror, c.leg)
			if pl.None != c.none {
				t.Fatalf("None = %v, want %v", pl.None, c.none)
			}
			if c.none {
				return
			}
			if !slices.Equal(pl.Months, c.months) {
				t.Fatalf("months %v, want %v", pl.Months, c.months)
			}
			if pl.Legacy != c.leg {
				t.Fatalf("legacy %+v, want %+v", pl.Legacy, c.leg)
			}
			want := ListQuery{Topic: "t", User: 7, Order: Desc, Bound: math.MaxInt64}
			if pl.Q != want {
				t.Fatalf("query %+v, want %+v", pl.Q, want)
			}
			m, ok := pl.OneMonth()
			switch {
			case c.oneMonth == "" && ok:
				t.Fatalf("OneMonth = %v, want none", m)
			case c.oneMonth != "" && (!ok || m != routing.MustMonth(c.oneMonth)):
				t.Fatalf("OneMonth = %v %v, want %s", m, ok, c.oneMonth)
			}
		})
	}
}

// TestPlanLast: the topic list's last message is one row, newest first,
// over every month the mirror knows and the legacy table.
func TestPlanLast(t *testing.T) {
	leg := routing.LegacySource{Hi: 50, Split: true}
	pl := PlanLast("t", 7, mirrorOf(monthRange("202609", 51, 60), monthRange("202610", 61, 70)), leg)
	want := ListQuery{Topic: "t", User: 7, Order: Desc, Bound: math.MaxInt64, Limit: 1}
	if pl.None || pl.Q != want || pl.Legacy != leg || !slices.Equal(pl.Months, months("202610", "202609")) {
		t.Fatalf("plan %+v", pl)
	}
	if pl := PlanLast("t", 7, routing.TopicMirror{}, routing.LegacySource{}); pl.None || len(pl.Months) != 0 {
		t.Fatalf("no rows: %+v", pl)
	}
}

// TestPlanSearch: a search reads the months whose rows' created_at range
// overlaps the window — a month edge where the active month lagged the
// calendar included — or, for a topic the mirror does not know, the
// registered calendar months of the window and the one before; one row
// more than the page; every source stops at the retention floor.
func TestPlanSearch(t *testing.T) {
	at := func(s string) time.Time { tm, _ := time.Parse(time.RFC3339, s); return tm }
	row := func(month, from, to string) routing.MirrorRow {
		return routing.MirrorRow{MonthRange: routing.MonthRange{Month: routing.MustMonth(month)}, MinCreatedAt: at(from), MaxCreatedAt: at(to)}
	}
	mirror := []routing.MirrorRow{
		row("202608", "2026-08-01T00:00:00Z", "2026-08-31T23:59:59Z"),
		// the active month lagged the calendar: September rows in 202608's
		// successor start late, and 202609 holds a row from October 1st
		row("202609", "2026-09-01T00:00:01Z", "2026-10-01T00:00:02Z"),
		row("202610", "2026-10-01T00:00:03Z", "2026-10-20T00:00:00Z"),
	}
	reg := months("202607", "202608", "202609", "202610")
	cases := []struct {
		name     string
		mirror   []routing.MirrorRow
		from, to string
		floor    int64
		before   int64
		months   []routing.Month
		qFloor   int64
	}{
		{name: "month edge", mirror: mirror, from: "2026-10-01T00:00:00Z", to: "2026-10-02T00:00:00Z",
			before: math.MaxInt64, months: months("202610", "202609")},
		{name: "one month", mirror: mirror, from: "2026-08-10T00:00:00Z", to: "2026-08-20T00:00:00Z",
			before: 500, months: months("202608")},
		{name: "no mirror: the window's months and the one before", from: "2026-09-10T00:00:00Z", to: "2026-10-02T00:00:00Z",
			before: math.MaxInt64, months: months("202610", "202609", "202608")},
		{name: "outside every month", mirror: mirror, from: "2026-11-01T00:00:00Z", to: "2026-11-02T00:00:00Z",
			before: math.MaxInt64},
		{name: "retention floor", mirror: mirror, from: "2026-10-01T00:00:00Z", to: "2026-10-02T00:00:00Z",
			floor: 40, before: math.MaxInt64, months: months("202610", "202609"), qFloor: 39},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			leg := routing.LegacySource{Hi: 10, Split: true}
			s := Search{Topic: "t", User: 7, Before: c.before, Limit: 20, From: at(c.from), To: at(c.to), Like: "%x%"}
			pl := PlanSearch(s, SearchReads{Mirror: c.mirror, Registered: reg, Legacy: leg, Floor: c.floor})
			if pl.None || pl.Legacy != leg || !slices.Equal(pl.Months, c.months) {
				t.Fatalf("plan %+v, want months %v", pl, c.months)
			}
			q := pl.Q
			if q.Topic != "t" || q.User != 7 || q.Order != Desc || q.Bound != c.before || q.Limit != 21 || q.Floor != c.qFloor ||
				q.Match == nil || *q.Match != (TextMatch{From: s.From, To: s.To, Like: "%x%"}) {
				t.Fatalf("query %+v", q)
			}
		})
	}
}
