package query

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// monthSpan is how many calendar months [from, to) touches; 0 if either
// end lies outside the supported years.
func monthSpan(from, to time.Time) int {
	a, b := routing.MonthOf(from), routing.MonthOf(to.Add(-time.Nanosecond))
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return b.Sub(a) + 1
}

// likePattern escapes q for LIKE ... ESCAPE '!' and wraps it in %…%: the
// search text is matched literally, never as a pattern.
func likePattern(q string) string {
	r := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_")
	return "%" + r.Replace(q) + "%"
}

// SearchMonths picks the months a search of [from, to) reads, newest first.
// A message's month is the active month when it was sent, which may lag
// the calendar at a month edge, so months come from the topic's mirror
// rows (min/max created_at per month) overlapping the window, not from the
// calendar. A topic the mirror does not know is read in the calendar months
// of the window and the one before.
func SearchMonths(mirror []routing.MirrorRow, registered []routing.Month, from, to time.Time) []routing.Month {
	var out []routing.Month
	for _, r := range mirror {
		if !r.MaxCreatedAt.Before(from) && r.MinCreatedAt.Before(to) {
			out = append(out, r.Month)
		}
	}
	if len(mirror) == 0 {
		lo, hi := routing.MonthOf(from).Prev(), routing.MonthOf(to.Add(-time.Nanosecond))
		for _, m := range registered {
			if !m.Before(lo) && !m.After(hi) {
				out = append(out, m)
			}
		}
	}
	return newestFirst(out)
}

func newestFirst(ms []routing.Month) []routing.Month {
	out := make([]routing.Month, len(ms))
	for i, m := range ms {
		out[len(ms)-1-i] = m
	}
	return out
}

// Search finds messages of topic whose content.text contains q, created in
// [from, to), newest first, paged with next_before. Each month's query stays
// inside the topic's created_at range of idx_topic_created; while the
// tenant migrates, the legacy table is one more bounded source (walked by
// seq, as it may lack that index), through the same walk as a page. The
// topic's ACL is checked before any row is read and the caller's deletion
// ranges apply to every hit.
func (s *Service) Search(ctx context.Context, p httpapi.Principal, topic string, r SearchRequest) (readpath.BeforePage, error) {
	if err := s.r.Authorize(ctx, p, topic); err != nil {
		return readpath.BeforePage{}, err
	}
	start := time.Now()
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	mirror, err := routing.LoadMirrorRows(ctx, db, topic)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	registered, err := s.p.Catalog.Months(ctx, p.Tenant)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	tables, err := s.p.Router.Tables(ctx, p.Tenant, SearchMonths(mirror, routing.SortedMonths(registered), r.From, r.To))
	if err != nil {
		return readpath.BeforePage{}, err
	}
	before := r.Before
	if !r.HasBefore {
		before = math.MaxInt64
	}
	leg, err := s.p.Migrations.Legacy(ctx, p.Tenant, topic)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	// history begins at the retention floor: an archived month keeps the
	// rows below it (a purge or a trim hides them by the floor alone);
	// every source's query stops at it (ListQuery.Floor)
	floor, err := s.r.RetentionFloor(ctx, db, keys, topic)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	q := readpath.ListQuery{Topic: topic, User: p.UserID, Order: readpath.Desc, Bound: before, Limit: r.Limit + 1,
		Floor: max(floor-1, 0), Match: &readpath.TextMatch{From: r.From, To: r.To, Like: likePattern(r.Q)}}
	page, touched, err := s.r.WalkSources(ctx, db, p.Tenant, q, readpath.Sources(q, tables, leg))
	if err != nil {
		return readpath.BeforePage{}, err
	}
	s.r.Observe(touched, false, time.Since(start).Seconds())
	page, more := readpath.Truncate(page, r.Limit)
	return readpath.BeforePage{Messages: readpath.NonNil(page), NextBefore: readpath.NextBefore(page), HasMore: more}, nil
}
