package readpath

import (
	"math"
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

// TestSourcesOrderTheLegacyTable: the legacy table is one more bounded
// source, placed so that every source holds only seqs beyond the ones
// before it in the page's order.
func TestSourcesOrderTheLegacyTable(t *testing.T) {
	m1, _ := routing.ParseMonth("202601")
	m2, _ := routing.ParseMonth("202602")
	t1, _ := routing.TableFor(m1)
	t2, _ := routing.TableFor(m2)
	tables := []routing.Table{t2, t1}
	legacy := routing.LegacyQuoted()
	names := func(ss []Source) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Table)
		}
		return out
	}
	// no migration: the month tables only
	if got := sources(ListQuery{Order: Desc, Bound: 100}, tables, routing.LegacySource{}); len(got) != 2 {
		t.Fatalf("no migration: %v", names(got))
	}
	// before cutover: months first (newest seqs), then the whole legacy table
	got := sources(ListQuery{Order: Desc, Bound: math.MaxInt64}, tables, routing.LegacySource{Hi: math.MaxInt64})
	if len(got) != 3 || got[2].Table != legacy || got[2].Q.Bound != math.MaxInt64 || got[0].Q.Floor != 0 {
		t.Fatalf("before cutover, desc: %v %+v", names(got), got)
	}
	for _, s := range got {
		if !s.full {
			t.Fatalf("before cutover every source is read whole: %+v", got)
		}
	}
	// after cutover 50, desc below 200: months above 50, then legacy below 51
	got = sources(ListQuery{Order: Desc, Bound: 200}, tables, routing.LegacySource{Hi: 50, Split: true})
	if len(got) != 3 || got[0].Q.Floor != 50 || got[2].Table != legacy || got[2].Q.Bound != 51 || got[0].full {
		t.Fatalf("after cutover, desc: %v %+v", names(got), got)
	}
	// desc entirely below the cutover: the legacy table alone
	got = sources(ListQuery{Order: Desc, Bound: 30}, tables, routing.LegacySource{Hi: 50, Split: true})
	if len(got) != 1 || got[0].Table != legacy || got[0].Q.Bound != 30 {
		t.Fatalf("below cutover, desc: %v %+v", names(got), got)
	}
	// asc from 10: legacy up to 50 first, then months above 50
	got = sources(ListQuery{Order: Asc, Bound: 10, UpTo: Unbounded}, tables, routing.LegacySource{Hi: 50, Split: true})
	if len(got) != 3 || got[0].Table != legacy || got[0].Q.UpTo != 50 || got[1].Q.Bound != 50 {
		t.Fatalf("after cutover, asc: %v %+v", names(got), got)
	}
	// asc above the cutover: months only
	got = sources(ListQuery{Order: Asc, Bound: 60, UpTo: Unbounded}, tables, routing.LegacySource{Hi: 50, Split: true})
	if len(got) != 2 || got[0].Q.Bound != 60 {
		t.Fatalf("above cutover, asc: %v %+v", names(got), got)
	}
}
