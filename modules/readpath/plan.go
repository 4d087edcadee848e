package readpath

import (
	"math"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// pageRequest is a list page as a client asks for it.
type pageRequest struct {
	Topic string
	User  int64
	Order Order // Desc: a before page, newest first; Asc: a since page, oldest first
	// Cursor is exclusive: seq < Cursor (Desc; math.MaxInt64 is the latest
	// page) or seq > Cursor (Asc).
	Cursor int64
	Limit  int
}

// latest reports a page of the topic's newest messages.
func (q pageRequest) latest() bool { return q.Order == Desc && q.Cursor == math.MaxInt64 }

// slack is how many cached members a page's first hot-cache read takes.
func (q pageRequest) slack() int { return q.Limit + 1 + HotSlack }

// pageReads is what a list page learns from Redis in one round trip
// (Reader.readPage): the hot cache next to the cursor (over this process's
// copy of the newest stretch, when that serves the page), the topic's last
// issued seq, the caller's deletion ranges, and on request the route's
// reads and the forward bound. Everything a plan decides, it decides from
// these.
type pageReads struct {
	View hotView
	At   time.Time // when the reads were sent: a copy made from them is this old
	Last int64     // the seq counter; 0: Redis holds none, the cache proves nothing
	Err  error     // the hot-cache read failed: MySQL answers
	// Hidden: the caller's deletion ranges, or unknown (MySQL filters)
	Hidden HiddenView
	Route  []rueidis.RedisResult // the route's reads, when prefetched (routing.Router.RouteCmds)
	Bound  routing.Bound         // how far a forward page may go (Asc only)
	// Floor: the topic's retention floor (0: nothing expired)
	Floor int64
}

// plan is the source plan of one list page, built by planPage purely from
// the request and the page's Redis replies: whether the forward bound
// leaves anything to read, what the hot cache (and this process's copy of
// the newest stretch) proves of the page, and — for when it does not — the
// MySQL query and the side of the route whose months it walks. Reader.run
// executes it; where the plan needs what Redis did not say (the caller's
// deletion ranges when Redis did not know them, a longer cache read), it
// names that step (cacheStep) and the executor fetches it and asks the
// plan again (walk, over), so every decision stays a pure function.
type plan struct {
	req   pageRequest
	reads pageReads
	// empty: the forward bound stops the page at its cursor (Asc only):
	// nothing is read, the page is empty and echoes the cursor
	empty bool
	// from and stop are the seqs the page walks over the hot view, in
	// order (stop inclusive): below the cursor down to seq 1, or above it
	// up to the bound and the seq counter
	from, stop int64
	// hiddenLo is the lowest seq whose deletion ranges a walk needs, when
	// Redis did not know the caller's ranges
	hiddenLo int64
	cache    cacheStep
	query    ListQuery // the MySQL query of the page when the cache does not answer
}

// cacheKind is what the hot view proves of a page.
type cacheKind int

const (
	cacheMiss    cacheKind = iota // MySQL answers
	cacheHit                      // the view answers: page
	cacheRanges                   // read the caller's ranges above hiddenLo from MySQL, then walk
	cacheFurther                  // the view ended before the page did: read the cache once more, then over
)

// cacheStep is one decision of the hot-cache part of a plan.
type cacheStep struct {
	kind cacheKind
	page []message.Message // cacheHit
	// view is what the page walked (with a latest page's copy made from
	// the read); nil base and zero Top when no walk was made
	view   hotView
	walked bool // a walk was made: what it proved of the newest stretch is kept
	failed bool // the cache read failed (logged; not a miss of the cache)
	reset  bool // the copy lies above the seq counter: dropped
}

// planPage builds the plan of a page from its request and Redis replies;
// no I/O.
func planPage(req pageRequest, r pageReads) plan {
	pl := plan{req: req, reads: r}
	q := ListQuery{Topic: req.Topic, User: req.User, Order: req.Order, Bound: req.Cursor, Limit: req.Limit + 1, HidNothing: r.Hidden.None()}
	if req.Order == Desc {
		pl.from, pl.stop, pl.hiddenLo = min(req.Cursor-1, r.Last), 1, r.View.Lo()
	} else {
		upTo, ok := r.Bound.Forward(req.Cursor)
		if !ok {
			pl.empty = true
			return pl
		}
		q.UpTo = upTo
		pl.from, pl.stop, pl.hiddenLo = req.Cursor+1, min(upTo, r.Last), req.Cursor
	}
	pl.query = q
	pl.cache = pl.first()
	return pl
}

// first is what the replies alone prove of the page.
func (pl plan) first() cacheStep {
	r := pl.reads
	if r.Err != nil {
		return cacheStep{failed: true}
	}
	if r.Last == 0 {
		return cacheStep{} // no counter: nothing can be proven from the cache
	}
	v := r.View
	if v.base != nil && v.base.hi > r.Last {
		// the seq counter is below the copy: the copy is of a past the
		// topic no longer has, and the read above it proves nothing
		return cacheStep{reset: true}
	}
	if v.base == nil && pl.req.latest() {
		v.base = newRecent(v.Top, r.Last, r.At)
	}
	if !r.Hidden.Known {
		// the ranges are worth a MySQL read only once the cache is known to
		// cover the page
		if _, ok, miss := walk(v, pl.from, pl.stop, pl.req.Order, pl.req.Limit, nil, false); !ok && v.covers(miss) {
			return cacheStep{}
		}
		return cacheStep{kind: cacheRanges, view: v}
	}
	return pl.walk(v, r.Hidden.Ranges, true)
}

// walk is what view v proves of the page with the caller's ranges hidden;
// further allows one longer cache read when the view ends before the page
// does (not with ranges read from MySQL above hiddenLo only: MySQL answers
// instead).
func (pl plan) walk(v hotView, hidden Hidden, further bool) cacheStep {
	page, ok, miss := walk(v, pl.from, pl.stop, pl.req.Order, pl.req.Limit, hidden, false)
	switch {
	case ok:
		return cacheStep{kind: cacheHit, page: page, view: v, walked: true}
	case further && !v.covers(miss):
		return cacheStep{kind: cacheFurther, view: v, walked: true}
	}
	return cacheStep{view: v, walked: true}
}

// furtherN is how many members the longer cache read takes.
func (pl plan) furtherN() int { return hotFurther * pl.req.slack() }

// over is what the longer cache read c proves of the page (cacheFurther).
func (pl plan) over(c Cached) cacheStep {
	v := hotView{Top: c}
	if pl.req.latest() {
		v.base = newRecent(c, pl.reads.Last, pl.reads.At)
	}
	return pl.walk(v, pl.reads.Hidden.Ranges, false)
}

// months is the side of the topic's route a MySQL page walks.
func (pl plan) months(tr routing.TopicRoute) []routing.Month {
	if pl.req.Order == Desc {
		return tr.Before(pl.req.Cursor)
	}
	return tr.Since(pl.req.Cursor)
}

// gaps are the recorded gaps within [lo, hi] as the page's round trip
// read them, and whether they prove the list: read after the bound (a seq
// settled by then that became a gap was one already), or held by this
// process's copy — gaps are never taken back; not when the bound recorded
// gaps of its own after the round trip read them.
func (pl plan) gaps(lo, hi int64) ([]int64, bool) {
	if pl.reads.Err != nil || pl.reads.Bound.Regapped {
		return nil, false
	}
	return pl.reads.View.GapsIn(lo, hi)
}
