package readpath

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// upTo lists the seqs lo..hi.
func upTo(lo, hi int64) []int64 {
	var out []int64
	for s := lo; s <= hi; s++ {
		out = append(out, s)
	}
	return out
}

// The plan of a page is decided from the request and the Redis replies
// alone: what the forward bound leaves to read, what the hot cache (and
// this process's copy) proves, what the MySQL fallback reads. No server
// is involved.
func TestPlanPageDecidesFromTheRepliesAlone(t *testing.T) {
	at := time.Unix(1000, 0)
	// the cache of seqs 1..30 with 12 a recorded gap, read whole
	whole := func() Cached {
		return cached(t, 1, math.MaxInt64-1, msgs(slices.DeleteFunc(upTo(1, 30), func(s int64) bool { return s == 12 })...), []int64{12})
	}
	// a newest-first read cut short at seq 26: more may lie below
	cut := func() Cached { c := cached(t, 26, 30, msgs(upTo(26, 30)...), nil); c.Full = true; return c }
	// the cache of 1..30 with 20 neither cached nor a gap (in flight)
	hole := func() Cached {
		return cached(t, 1, math.MaxInt64-1, msgs(slices.DeleteFunc(upTo(1, 30), func(s int64) bool { return s == 20 })...), nil)
	}
	known := HiddenView{Known: true}
	for _, tc := range []struct {
		name  string
		req   pageRequest
		reads pageReads
		empty bool
		kind  cacheKind
		page  []int64 // cacheHit, with one row of lookahead
		upTo  int64   // the MySQL query's bound (Asc)
		flags string  // "failed", "reset", "walked"
	}{
		{name: "latest page, cache whole", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 3},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30, Hidden: known}, kind: cacheHit, page: []int64{30, 29, 28, 27}, flags: "walked"},
		{name: "before page steps over a recorded gap", req: pageRequest{Order: Desc, Cursor: 14, Limit: 2},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30, Hidden: known}, kind: cacheHit, page: []int64{13, 11, 10}, flags: "walked"},
		{name: "before page reaches seq 1", req: pageRequest{Order: Desc, Cursor: 3, Limit: 5},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30, Hidden: known}, kind: cacheHit, page: []int64{2, 1}, flags: "walked"},
		{name: "hidden ranges are skipped", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 2},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30, Hidden: HiddenView{Known: true, Ranges: Hidden{{28, 30}}}}, kind: cacheHit, page: []int64{30, 27, 26}, flags: "walked"},
		{name: "cache read cut short: read further", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 6},
			reads: pageReads{View: hotView{Top: cut()}, Last: 30, Hidden: known}, kind: cacheFurther, flags: "walked"},
		{name: "a seq in flight within the read: MySQL", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 20},
			reads: pageReads{View: hotView{Top: hole()}, Last: 30, Hidden: known}, kind: cacheMiss, flags: "walked"},
		{name: "no counter: the cache proves nothing", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 3},
			reads: pageReads{View: hotView{Top: whole()}, Last: 0, Hidden: known}, kind: cacheMiss},
		{name: "cache read failed", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 3},
			reads: pageReads{Err: errors.New("down"), Last: 30, Hidden: known}, kind: cacheMiss, flags: "failed"},
		{name: "ranges unknown, cache covers: read them", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 3},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30}, kind: cacheRanges},
		{name: "ranges unknown, cache has a hole: MySQL, no range read", req: pageRequest{Order: Desc, Cursor: 25, Limit: 10},
			reads: pageReads{View: hotView{Top: hole()}, Last: 30}, kind: cacheMiss},
		{name: "copy above the counter: dropped", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 3},
			reads: pageReads{View: hotView{Top: whole(), base: newRecent(whole(), 30, at)}, Last: 20, Hidden: known}, kind: cacheMiss, flags: "reset"},
		{name: "latest page over the copy and the read above it", req: pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 3},
			reads: pageReads{View: hotView{Top: cached(t, 29, math.MaxInt64-1, msgs(29, 30, 31), nil), base: newRecent(whole(), 28, at)}, Last: 31, Hidden: known},
			kind:  cacheHit, page: []int64{31, 30, 29, 28}, flags: "walked"},
		{name: "since page up to the bound", req: pageRequest{Order: Asc, Cursor: 24, Limit: 10},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30, Hidden: known, Bound: routing.Bound{Settled: 27, Counted: true}},
			kind:  cacheHit, page: []int64{25, 26, 27}, upTo: 27, flags: "walked"},
		{name: "since page with lookahead", req: pageRequest{Order: Asc, Cursor: 10, Limit: 2},
			reads: pageReads{View: hotView{Top: whole()}, Last: 30, Hidden: known, Bound: routing.Bound{Settled: 30, Counted: true}},
			kind:  cacheHit, page: []int64{11, 13, 14}, upTo: 30, flags: "walked"},
		{name: "since page: a seq in flight right above the cursor", req: pageRequest{Order: Asc, Cursor: 19, Limit: 10},
			reads: pageReads{View: hotView{Top: hole()}, Last: 30, Hidden: known, Bound: routing.Bound{Settled: 19, Counted: true}}, empty: true},
		{name: "since page, counter unknown, nothing proven stored", req: pageRequest{Order: Asc, Cursor: 5, Limit: 10},
			reads: pageReads{View: hotView{Top: whole()}, Last: 0, Hidden: known, Bound: routing.Bound{}}, empty: true},
		{name: "since page, counter unknown, the mirror proves a prefix", req: pageRequest{Order: Asc, Cursor: 5, Limit: 10},
			reads: pageReads{Last: 0, Hidden: known, Bound: routing.Bound{Settled: 9}}, kind: cacheMiss, upTo: 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Topic, tc.req.User = "t", 7
			pl := planPage(tc.req, tc.reads)
			if pl.empty != tc.empty {
				t.Fatalf("empty %v, want %v", pl.empty, tc.empty)
			}
			if tc.empty {
				return
			}
			st := pl.cache
			if st.kind != tc.kind {
				t.Fatalf("cache step %d, want %d", st.kind, tc.kind)
			}
			if got := seqsOf(st.page); tc.kind == cacheHit && !slices.Equal(got, tc.page) {
				t.Fatalf("page %v, want %v", got, tc.page)
			}
			for flag, got := range map[string]bool{"failed": st.failed, "reset": st.reset, "walked": st.walked} {
				if want := flag == tc.flags; got != want {
					t.Fatalf("%s %v, want %v", flag, got, want)
				}
			}
			q := pl.query
			if q.Topic != "t" || q.User != 7 || q.Order != tc.req.Order || q.Bound != tc.req.Cursor || q.Limit != tc.req.Limit+1 {
				t.Fatalf("query %+v", q)
			}
			if q.HidNothing != tc.reads.Hidden.None() {
				t.Fatalf("HidNothing %v for %+v", q.HidNothing, tc.reads.Hidden)
			}
			if tc.req.Order == Asc && q.UpTo != tc.upTo {
				t.Fatalf("the MySQL page reaches %d, want %d", q.UpTo, tc.upTo)
			}
		})
	}
}

// The steps a plan asks the executor for are pure too: the caller's ranges
// read from MySQL, the longer cache read.
func TestPlanFollowUpSteps(t *testing.T) {
	whole := cached(t, 1, math.MaxInt64-1, msgs(upTo(1, 30)...), nil)
	t.Run("ranges read from MySQL are hidden, and never ask for more", func(t *testing.T) {
		pl := planPage(pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 2}, pageReads{View: hotView{Top: whole}, Last: 30})
		if pl.cache.kind != cacheRanges || pl.hiddenLo != 1 {
			t.Fatalf("step %+v, hiddenLo %d", pl.cache.kind, pl.hiddenLo)
		}
		st := pl.walk(pl.cache.view, Hidden{{29, 30}}, false)
		if st.kind != cacheHit || !slices.Equal(seqsOf(st.page), []int64{30, 28, 27}) {
			t.Fatalf("%d %v", st.kind, seqsOf(st.page))
		}
		short := cached(t, 28, 30, msgs(28, 29, 30), nil)
		short.Full = true
		pl.req.Limit = 5
		if st := pl.walk(hotView{Top: short}, nil, false); st.kind != cacheMiss {
			t.Fatalf("a view ending early with ranges from MySQL goes to MySQL, got %d", st.kind)
		}
	})
	t.Run("the longer read answers, and a latest page keeps its copy", func(t *testing.T) {
		short := cached(t, 28, 30, msgs(28, 29, 30), nil)
		short.Full = true
		pl := planPage(pageRequest{Order: Desc, Cursor: math.MaxInt64, Limit: 4}, pageReads{View: hotView{Top: short}, Last: 30, Hidden: HiddenView{Known: true}})
		if pl.cache.kind != cacheFurther || pl.furtherN() != hotFurther*(4+1+HotSlack) {
			t.Fatalf("step %d, further %d", pl.cache.kind, pl.furtherN())
		}
		st := pl.over(whole)
		if st.kind != cacheHit || !slices.Equal(seqsOf(st.page), []int64{30, 29, 28, 27, 26}) || st.view.base == nil || st.view.base.hi != 30 {
			t.Fatalf("%d %v %+v", st.kind, seqsOf(st.page), st.view.base)
		}
		if st := pl.over(short); st.kind != cacheMiss {
			t.Fatalf("still short: %d", st.kind)
		}
	})
}

// A page that MySQL answers walks the side of the route its cursor points
// to, across months, and the gaps the round trip read count only when
// nothing recorded gaps after it.
func TestPlanMonthsAndGaps(t *testing.T) {
	m1, m2, m3 := routing.MustMonth("202601"), routing.MustMonth("202602"), routing.MustMonth("202603")
	tr := routing.TopicRoute{Ranges: []routing.MonthRange{
		{Month: m1, MinSeq: 1, MaxSeq: 10, Count: 10}, {Month: m2, MinSeq: 11, MaxSeq: 20, Count: 10}, {Month: m3, MinSeq: 21, MaxSeq: 30, Count: 10}}}
	for _, tc := range []struct {
		name string
		req  pageRequest
		want []routing.Month
	}{
		{"latest: every month, newest first", pageRequest{Order: Desc, Cursor: math.MaxInt64}, []routing.Month{m3, m2, m1}},
		{"before spans two months", pageRequest{Order: Desc, Cursor: 15}, []routing.Month{m2, m1}},
		{"since spans two months", pageRequest{Order: Asc, Cursor: 15}, []routing.Month{m2, m3}},
		{"since at a month's end", pageRequest{Order: Asc, Cursor: 20}, []routing.Month{m3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := planPage(tc.req, pageReads{Bound: routing.Bound{Settled: 30, Counted: true}})
			if got := pl.months(tr); !slices.Equal(got, tc.want) {
				t.Fatalf("months %v, want %v", got, tc.want)
			}
		})
	}
	view := hotView{Top: cached(t, 11, math.MaxInt64-1, msgs(11, 13), []int64{12, 14})}
	for _, tc := range []struct {
		name  string
		reads pageReads
		read  bool
	}{
		{"read with the bound", pageReads{View: view, Last: 14, Bound: routing.Bound{Settled: 14, Counted: true}}, true},
		{"the bound recorded gaps after the read", pageReads{View: view, Last: 14, Bound: routing.Bound{Settled: 14, Counted: true, Regapped: true}}, false},
		{"the cache read failed", pageReads{Err: errors.New("down"), Bound: routing.Bound{Settled: 14, Counted: true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := planPage(pageRequest{Order: Asc, Cursor: 10, Limit: 10}, tc.reads)
			gaps, read := pl.gaps(11, 14)
			if read != tc.read || read && !slices.Equal(gaps, []int64{12, 14}) {
				t.Fatalf("gaps %v %v, want read %v", gaps, read, tc.read)
			}
		})
	}
}

// A badge's count over the hot cache goes up to the newest cached message
// below the counter, decided by the same Bound.Forward as a page; without
// a counter the cache proves nothing.
func TestNewestBoundStopsAtTheNewestCachedMessage(t *testing.T) {
	c := cached(t, 1, math.MaxInt64-1, msgs(upTo(1, 8)...), nil)
	for _, tc := range []struct {
		name    string
		c       Cached
		counter int64
		cursor  int64
		to      int64
		counted bool
		reads   bool
	}{
		{"seqs above the newest cached are in flight", c, 10, 5, 8, true, true},
		{"the counter below the cache", c, 6, 5, 6, true, true},
		{"read up to the newest cached", c, 10, 8, 8, true, false},
		{"nothing cached", Cached{}, 10, 5, 10, true, true},
		{"no counter", c, 0, 5, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Newest{c: tc.c, counter: tc.counter}.Bound()
			to, ok := b.Forward(tc.cursor)
			if b.Counted != tc.counted || to != tc.to || ok != tc.reads {
				t.Fatalf("%+v: Forward(%d) = %d %v, want %d %v counted %v", b, tc.cursor, to, ok, tc.to, tc.reads, tc.counted)
			}
		})
	}
}
