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

// Search finds messages of topic whose content.text contains q, created in
// [from, to), newest first, paged with next_before. Each month's query stays
// inside the topic's created_at range of idx_topic_created; while the
// tenant migrates, the legacy table is one more bounded source (walked by
// seq, as it may lack that index), through the same walk as a page: the
// read path plans it from the topic's mirror rows, the registered months,
// the legacy source and the retention floor (readpath.PlanSearch) and
// executes the plan (Reader.Walk). The topic's ACL is checked before any
// row is read and the caller's deletion ranges apply to every hit.
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
	floor, err := s.r.RetentionFloor(ctx, db, keys, topic)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	pl := readpath.PlanSearch(readpath.Search{Topic: topic, User: p.UserID, Before: before, Limit: r.Limit, From: r.From, To: r.To, Like: likePattern(r.Q)},
		readpath.SearchReads{Mirror: mirror, Registered: routing.SortedMonths(registered), Legacy: leg, Floor: floor})
	page, touched, err := s.r.Walk(ctx, db, p.Tenant, pl)
	if err != nil {
		return readpath.BeforePage{}, err
	}
	s.r.Observe(touched, false, time.Since(start).Seconds())
	page, more := readpath.Truncate(page, r.Limit)
	return readpath.BeforePage{Messages: readpath.NonNil(page), NextBefore: readpath.NextBefore(page), HasMore: more}, nil
}
