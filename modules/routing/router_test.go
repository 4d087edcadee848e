package routing

import (
	"slices"
	"testing"
)

func months(ss ...string) []Month {
	out := make([]Month, len(ss))
	for i, s := range ss {
		out[i] = MustMonth(s)
	}
	return out
}

func TestTopicRouteSelection(t *testing.T) {
	tr := TopicRoute{Ranges: []MonthRange{
		{Month: MustMonth("202607"), MinSeq: 1, MaxSeq: 100, Count: 100},
		{Month: MustMonth("202608"), MinSeq: 101, MaxSeq: 150, Count: 50},
		{Month: MustMonth("202609"), MinSeq: 151, MaxSeq: 0},
	}, Probe: months("202610")}
	cases := []struct {
		name string
		got  []Month
		want []Month
	}{
		{"before latest", tr.Before(1 << 62), months("202610", "202609", "202608", "202607")},
		{"before inside first month", tr.Before(101), months("202610", "202607")},
		{"before at a month's first seq", tr.Before(151), months("202610", "202608", "202607")},
		{"before 1", tr.Before(1), months("202610")},
		{"since 0", tr.Since(0), months("202607", "202608", "202609", "202610")},
		// the stale max_seq of 202607 (100) must not hide late rows: only
		// the next month's first seq bounds it
		{"since at a month's end", tr.Since(99), months("202607", "202608", "202609", "202610")},
		{"since past a month", tr.Since(100), months("202608", "202609", "202610")},
		{"since beyond all", tr.Since(5000), months("202609", "202610")},
		{"by seq in the middle", tr.BySeq(120), months("202608", "202609", "202610")},
		{"by seq in the last month", tr.BySeq(9000), months("202609", "202610")},
		{"by seq below every first seq", tr.BySeq(0), months("202607", "202610")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !slices.Equal(c.got, c.want) {
				t.Fatalf("got %v, want %v", c.got, c.want)
			}
		})
	}
	if got := tr.Months(); !slices.Equal(got, months("202607", "202608", "202609", "202610")) {
		t.Fatalf("Months = %v", got)
	}
}

func TestProbeMonths(t *testing.T) {
	reg := months("202601", "202602", "202603", "202604", "202605", "202606", "202607")
	route := []MonthRange{{Month: MustMonth("202602"), MinSeq: 1}, {Month: MustMonth("202604"), MinSeq: 10}}
	cases := []struct {
		name     string
		ranges   []MonthRange
		active   Month
		complete Month
		fallback bool
		want     []Month
	}{
		{"no watermark: after the route's newest month up to active", route, MustMonth("202606"), Month{}, false, months("202605", "202606")},
		{"watermark below newest: holes after it too", route, MustMonth("202606"), MustMonth("202602"), false, months("202603", "202605", "202606")},
		{"idle topic, current watermark: nothing", route, MustMonth("202606"), MustMonth("202606"), false, nil},
		{"never past active", route, MustMonth("202604"), Month{}, false, nil},
		{"fallback: active and the two before", nil, MustMonth("202606"), MustMonth("202606"), true, months("202604", "202605", "202606")},
		{"fallback at the first registered month", nil, MustMonth("202601"), Month{}, true, months("202601")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ProbeMonths(c.ranges, reg, c.active, c.complete, c.fallback)
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}
