package readpath

import (
	"context"
	"database/sql"
	"math"
	"slices"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// WalkPlan is the source plan of a read that walks a topic's tables
// outside a list page — a search, the topic list's last message, an
// unread count: its query, the months whose tables it walks (newest
// first), the legacy table while the tenant migrates, or None when
// nothing it asks for is stored. PlanSearch, PlanLast and PlanCount build
// it from what the read already learned (the topic's mirror rows, the
// tenant's legacy source, the registered months, the retention floor)
// alone, no I/O, so a plan is tested without servers. Reader.Walk executes
// it into rows; Reader.Sources resolves it into its sources for a caller
// that reads each with statements of its own (the inbox's count).
type WalkPlan struct {
	Q      ListQuery
	Months []routing.Month
	Legacy routing.LegacySource
	None   bool // nothing to read: the read's answer is empty
	// oneMonth: a count's seqs above the cursor all lie in the table of
	// Months[0], none in the legacy table (OneMonth)
	oneMonth bool
}

// OneMonth is the month whose table holds every seq a count reads, when
// one does and the legacy table holds none: the inbox counts many topics
// of one month with one statement.
func (pl WalkPlan) OneMonth() (routing.Month, bool) {
	if !pl.oneMonth {
		return routing.Month{}, false
	}
	return pl.Months[0], true
}

// PlanCount plans an unread count of topic for user: the sources holding
// seqs above after (the caller's cursor), newest first — the mirror's
// months whose newest stored seq lies above it (the mirror is written in
// the transaction that stores the rows, so its max_seq is exact) and the
// legacy table bounded as a page bounds it. None when neither the mirror
// nor the legacy table holds a seq above after.
func PlanCount(topic string, user, after int64, mirror routing.TopicMirror, leg routing.LegacySource) WalkPlan {
	pl := WalkPlan{Q: ListQuery{Topic: topic, User: user, Order: Desc, Bound: math.MaxInt64}, Legacy: leg}
	if mirror.LastSeq() <= after && leg.Hi <= after {
		pl.None = true
		return pl
	}
	pl.Months = monthsAbove(mirror, after)
	pl.oneMonth = leg.Hi <= after && len(pl.Months) == 1
	return pl
}

// PlanLast plans the read of topic's newest stored message user may see
// (the topic list's last message): one row, newest first, over every
// month the mirror knows and the legacy table.
func PlanLast(topic string, user int64, mirror routing.TopicMirror, leg routing.LegacySource) WalkPlan {
	return WalkPlan{Q: ListQuery{Topic: topic, User: user, Order: Desc, Bound: math.MaxInt64, Limit: 1},
		Months: monthsAbove(mirror, 0), Legacy: leg}
}

// monthsAbove is the mirror's months holding a seq above seq, newest
// first (the mirror's rows are oldest first).
func monthsAbove(m routing.TopicMirror, seq int64) []routing.Month {
	var out []routing.Month
	for _, r := range slices.Backward(m.Rows) {
		if r.MaxSeq > seq {
			out = append(out, r.Month)
		}
	}
	return out
}

// Search is a search as its request asks for it: the messages of Topic
// User may see whose text matches Like (a LIKE … ESCAPE '!' pattern),
// created in [From, To), below Before (math.MaxInt64: the newest), a page
// of Limit.
type Search struct {
	Topic    string
	User     int64
	Before   int64
	Limit    int
	From, To time.Time
	Like     string
}

// SearchReads is what a search learns before it plans: the topic's mirror
// rows (oldest first), the tenant's registered months (oldest first), its
// legacy source and the topic's retention floor (0: nothing expired).
type SearchReads struct {
	Mirror     []routing.MirrorRow
	Registered []routing.Month
	Legacy     routing.LegacySource
	Floor      int64
}

// PlanSearch plans a search: one row more than the page (whether there is
// more), every source's query stopping at the retention floor — an
// archived month keeps the rows below it, a purge or a trim hides them by
// the floor alone — over the months of searchMonths and the legacy table,
// which may lack idx_topic_created and is walked by seq within the same
// bounds.
func PlanSearch(s Search, r SearchReads) WalkPlan {
	return WalkPlan{
		Q: ListQuery{Topic: s.Topic, User: s.User, Order: Desc, Bound: s.Before, Limit: s.Limit + 1,
			Floor: max(r.Floor-1, 0), Match: &TextMatch{From: s.From, To: s.To, Like: s.Like}},
		Months: searchMonths(r.Mirror, r.Registered, s.From, s.To),
		Legacy: r.Legacy,
	}
}

// searchMonths picks the months a search of [from, to) reads, newest first.
// A message's month is the active month when it was sent, which may lag
// the calendar at a month edge, so months come from the topic's mirror
// rows (min/max created_at per month) overlapping the window, not from the
// calendar. A topic the mirror does not know is read in the calendar months
// of the window and the one before.
func searchMonths(mirror []routing.MirrorRow, registered []routing.Month, from, to time.Time) []routing.Month {
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
	slices.Reverse(out)
	return out
}

// PlannedSource is one source of a plan as the executor resolved it:
// Cold when its month is archived — read through the read path (its
// archive with its overlay, ReadSource), never from a table it may have
// kept, which does not see the month's changes since.
type PlannedSource struct {
	Source
	Cold bool
}

// Sources resolves pl's months to their registered tables and orders
// them with the legacy table (sources), each marked cold or not: for a
// caller that reads the sources with statements of its own. None: no
// source.
func (s *Reader) Sources(ctx context.Context, tenant string, pl WalkPlan) ([]PlannedSource, error) {
	srcs, err := s.planSources(ctx, tenant, pl)
	if err != nil {
		return nil, err
	}
	out := make([]PlannedSource, len(srcs))
	for i, src := range srcs {
		out[i].Source = src
		if !src.Month.IsZero() {
			if out[i].Cold, err = s.Archived(ctx, tenant, src.Month); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Walk executes pl: reads its sources in order until it holds pl.Q.Limit
// rows (walkSources). It returns the rows and how many sources it read.
func (s *Reader) Walk(ctx context.Context, db *sql.DB, tenant string, pl WalkPlan) ([]message.Message, int, error) {
	srcs, err := s.planSources(ctx, tenant, pl)
	if err != nil {
		return nil, 0, err
	}
	return s.walkSources(ctx, db, tenant, pl.Q, srcs)
}

// planSources is pl's sources in order: its months' tables (a month not
// registered has none) and the legacy table.
func (s *Reader) planSources(ctx context.Context, tenant string, pl WalkPlan) ([]Source, error) {
	if pl.None {
		return nil, nil
	}
	tables, err := s.p.Router.Tables(ctx, tenant, pl.Months)
	if err != nil {
		return nil, err
	}
	return sources(pl.Q, tables, pl.Legacy), nil
}
