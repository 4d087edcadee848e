package routecheck

import (
	"slices"
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

func TestJoinRanges(t *testing.T) {
	oct, nov, dec := routing.MustMonth("202610"), routing.MustMonth("202611"), routing.MustMonth("202612")
	r := func(m routing.Month, lo, hi, n int64) routing.MonthRange {
		return routing.MonthRange{Month: m, MinSeq: lo, MaxSeq: hi, Count: n}
	}
	for _, tc := range []struct {
		name        string
		above, upTo []routing.MonthRange
		want        []routing.MonthRange
	}{
		{"nothing", nil, nil, nil},
		{"only above", []routing.MonthRange{r(dec, 11, 12, 2)}, nil, []routing.MonthRange{r(dec, 11, 12, 2)}},
		{"only up to", nil, []routing.MonthRange{r(oct, 1, 5, 5)}, []routing.MonthRange{r(oct, 1, 5, 5)}},
		{"different months",
			[]routing.MonthRange{r(dec, 11, 12, 2)},
			[]routing.MonthRange{r(oct, 1, 5, 5), r(nov, 6, 10, 4)},
			[]routing.MonthRange{r(dec, 11, 12, 2), r(oct, 1, 5, 5), r(nov, 6, 10, 4)}},
		{"a month split by the cutover",
			[]routing.MonthRange{r(nov, 9, 10, 2), r(dec, 11, 12, 2)},
			[]routing.MonthRange{r(oct, 1, 5, 5), r(nov, 6, 8, 3)},
			[]routing.MonthRange{r(nov, 6, 10, 5), r(dec, 11, 12, 2), r(oct, 1, 5, 5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			above := slices.Clone(tc.above)
			got := joinRanges(tc.above, tc.upTo)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("joinRanges = %+v, want %+v", got, tc.want)
			}
			if !slices.Equal(tc.above, above) {
				t.Fatalf("joinRanges changed its first argument: %+v", tc.above)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	m := routing.MustMonth
	tables := []routing.MonthRange{{Month: m("202608"), MinSeq: 1, MaxSeq: 10, Count: 10}, {Month: m("202609"), MinSeq: 11, MaxSeq: 12, Count: 2}}
	if d := Compare("t", tables, tables, tables); len(d) != 0 {
		t.Fatalf("equal views differ: %v", d)
	}
	redis := tables[:1]
	mirror := []routing.MonthRange{tables[0], {Month: m("202609"), MinSeq: 11, MaxSeq: 11, Count: 1}, {Month: m("202610"), MinSeq: 13, MaxSeq: 13, Count: 1}}
	d := Compare("t", redis, mirror, tables)
	var got []string
	for _, x := range d {
		got = append(got, x.Month+"/"+x.Store)
	}
	if want := []string{"202609/mirror", "202609/redis", "202610/mirror"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if s := d[1].String(); s != "topic t month 202609: redis has none, tables have min=11 max=12 count=2" {
		t.Fatalf("String = %q", s)
	}
}
