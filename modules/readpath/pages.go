package readpath

import (
	"context"
	"database/sql"
	"math"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// Before is the page of up to limit visible messages with seq < before,
// newest first; before 0 means the latest page.
func (s *Reader) Before(ctx context.Context, p httpapi.Principal, topic string, before int64, limit int) (BeforePage, error) {
	start := time.Now()
	if before <= 0 {
		before = math.MaxInt64
	}
	_, page, _, err := s.page(ctx, p, pageRequest{Topic: topic, User: p.UserID, Order: Desc, Cursor: before, Limit: limit}, start)
	if err != nil {
		return BeforePage{}, err
	}
	page, more := Truncate(page, limit)
	return BeforePage{Messages: NonNil(page), NextBefore: NextBefore(page), HasMore: more}, nil
}

// Since is the page of up to limit visible messages with seq > since,
// oldest first, never above the topic's forward bound (invariant 12): a
// seq still in flight below a persisted one stops the page, so it cannot
// be jumped over.
func (s *Reader) Since(ctx context.Context, p httpapi.Principal, topic string, since int64, limit int) (SincePage, error) {
	start := time.Now()
	pl, page, floor, err := s.page(ctx, p, pageRequest{Topic: topic, User: p.UserID, Order: Asc, Cursor: since, Limit: limit}, start)
	if err != nil {
		return SincePage{}, err
	}
	// a walk from below the retention floor starts at it
	since = max(since, floor-1)
	page, more := Truncate(dropFirst(page), limit)
	next := nextSince(page, since)
	// the page accounts for every seq up to the bound, or up to its last
	// row when more follow
	hi, _ := pl.reads.Bound.Forward(since)
	if more {
		hi = next
	}
	var gaps []int64
	if hi > since {
		read := false
		if gaps, read = pl.gaps(since+1, hi); !read {
			if gaps, err = s.p.Flight.Gaps(ctx, p.Tenant, topic, since+1, hi); err != nil {
				return SincePage{}, err
			}
		}
	}
	gaps = gapOfStored(gaps, page)
	through := max(hi, next)
	if len(gaps) > 0 {
		through = max(through, gaps[len(gaps)-1])
	}
	return SincePage{Messages: NonNil(page), NextSince: next, HasMore: more, Gaps: nonNilSeqs(gaps), Through: through}, nil
}

// page opens the topic, makes the page's Redis round trip, plans the
// page from what it returned and runs the plan: the page's rows (up to
// limit+1, one of lookahead), the plan it ran and the topic's retention
// floor: history begins there — a newest-first walk ends at it, an
// oldest-first walk from below it starts at it, and no row below it is in
// the page, whatever source answered.
func (s *Reader) page(ctx context.Context, p httpapi.Principal, req pageRequest, start time.Time) (plan, []message.Message, int64, error) {
	keys, db, err := s.Open(ctx, p, req.Topic)
	if err != nil {
		return plan{}, nil, 0, err
	}
	r, err := s.readPage(ctx, p, keys, db, req)
	if err != nil {
		return plan{}, nil, 0, err
	}
	floor := r.Floor
	switch {
	case req.Order == Asc && req.Cursor < floor-1:
		// a walk from below the floor starts at it: read again from there
		req.Cursor = floor - 1
		if r, err = s.readPage(ctx, p, keys, db, req); err != nil {
			return plan{}, nil, 0, err
		}
		floor = max(floor, r.Floor)
		req.Cursor = max(req.Cursor, floor-1)
	case req.Order == Desc && req.Cursor <= floor:
		return plan{req: req}, nil, floor, nil
	}
	pl := planPage(req, r)
	page, err := s.run(ctx, db, p.Tenant, keys, pl, start)
	return pl, AboveFloor(page, floor), floor, err
}

// run executes a page's plan: the hot cache where it proves the page, else
// the month tables (and the legacy table while the tenant migrates) one at
// a time in the route's order — a newest-first page adding what the cache
// holds and MySQL does not have yet — and records the read. The page
// holds up to limit+1 rows.
func (s *Reader) run(ctx context.Context, db *sql.DB, tenant string, keys routing.Keys, pl plan, start time.Time) ([]message.Message, error) {
	var page []message.Message
	ok, tables := false, 0
	if !pl.empty {
		if page, ok = s.fromCache(ctx, db, tenant, keys, pl); !ok {
			var err error
			if page, tables, err = s.Scan(ctx, db, tenant, pl.query, pl.reads.Route, pl.months); err != nil {
				return nil, err
			}
			if pl.req.Order == Desc {
				if page, err = s.withHeld(ctx, db, pl, page); err != nil {
					return nil, err
				}
			}
		}
	}
	s.Observe(tables, ok, time.Since(start).Seconds())
	return page, nil
}

// fromCache runs the hot-cache part of a plan: the page when the cache
// provably covers every seq the page walks (Redis answers only a complete
// page); false sends the page to MySQL. It fetches what the plan asks for
// beyond the round trip — the caller's deletion ranges above hiddenLo when
// Redis did not know them, one longer cache read — and keeps what the
// page's view proved as this process's copy of the topic's newest stretch.
func (s *Reader) fromCache(ctx context.Context, db *sql.DB, tenant string, keys routing.Keys, pl plan) ([]message.Message, bool) {
	r, req := pl.reads, pl.req
	k := topicKey{tenant, req.Topic}
	st := pl.cache
	switch {
	case st.failed:
		s.p.Log.Warn().Err(r.Err).Str("topic", req.Topic).Msg("hot cache read failed; reading MySQL")
		return nil, false
	case st.reset:
		s.recent.drop(k)
		s.m.local.WithLabelValues(localReset).Inc()
		return s.hotMiss()
	case st.kind == cacheMiss && !st.walked:
		return s.hotMiss()
	}
	if st.kind == cacheRanges {
		hidden, err := s.st.HiddenRanges(ctx, db, req.Topic, req.User, pl.hiddenLo, 0)
		if err != nil {
			return nil, false
		}
		st = pl.walk(st.view, hidden, false)
	}
	if st.kind == cacheFurther {
		if r.View.base != nil {
			s.m.local.WithLabelValues(localFallback).Inc()
		}
		if c, err := s.hotReread(ctx, keys, req.Topic, req.Order, req.Cursor, pl.furtherN()); err == nil {
			st = pl.over(c)
		} else {
			st.kind = cacheMiss
		}
	} else if st.kind == cacheHit && r.View.base != nil {
		s.m.local.WithLabelValues(localHit).Inc()
	}
	s.keepRecent(k, st.view, r.View.base, req.latest(), r.Last, r.At)
	if st.kind != cacheHit {
		return s.hotMiss()
	}
	s.m.hot.WithLabelValues("hit").Inc()
	return st.page, true
}

// withHeld adds to a newest-first page read from MySQL what the page's
// hot-cache read holds below its cursor and MySQL did not return (messages
// acknowledged but not persisted yet), minus what the caller hid.
func (s *Reader) withHeld(ctx context.Context, db *sql.DB, pl plan, page []message.Message) ([]message.Message, error) {
	held := pl.reads.View.Held(pl.req.Cursor)
	if len(held) == 0 {
		return page, nil
	}
	hidden := pl.reads.Hidden.Ranges
	if !pl.reads.Hidden.Known {
		var err error
		if hidden, err = s.st.HiddenRanges(ctx, db, pl.req.Topic, pl.req.User, held[len(held)-1].Seq, 0); err != nil {
			return nil, err
		}
	}
	visible := held[:0]
	for _, m := range held {
		if !hidden.Hides(m.Seq) {
			visible = append(visible, m)
		}
	}
	return merge(page, visible, Desc), nil
}

// keepRecent keeps what a page's view proved of the topic's newest
// stretch: its copy extended by the read above it, or — for a latest page
// whose copy could not reach the topic's last seq that way (the read above
// it was cut short) — the stretch below the last seq. held is the copy the
// page was read over (nil if none): kept as it is, it is not stored again.
func (s *Reader) keepRecent(k topicKey, v hotView, held *recent, latest bool, last int64, now time.Time) {
	if v.base == nil {
		return
	}
	kept := v.base.extend(v.Top)
	if latest && kept.hi < last {
		if r := newRecent(v.Top, last, now); r != nil {
			kept = r
		}
	}
	if kept != held {
		s.recent.put(k, kept, now)
	}
}

func (s *Reader) hotMiss() ([]message.Message, bool) {
	s.m.hot.WithLabelValues("miss").Inc()
	return nil, false
}
