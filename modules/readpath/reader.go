// Package readpath is the machinery under every read of a topic's
// messages, shared by the read roles' modules (query, inbox, stream) and
// the changes: the hot-cache reads and this process's copy of a topic's
// newest stretch, the caller's deletion ranges and their cache, the walk
// over a topic's month tables (and, while the tenant migrates, its legacy
// table), the statement cache and the rendering of pages; a read's
// membership decision is modules/acl's. It is a library, not a role: one
// Reader per process, built once by app and handed to the modules that
// read.
//
// A list page (Reader.Before, Reader.Since — query's pages, and through
// them the stream's catch-up) is planned, then executed:
//
//  1. readPage makes one pipelined Redis round trip: the caller's
//     membership (nothing read is used unless it allows the read), the
//     hot cache next to the cursor — above this process's copy of the
//     topic's newest stretch when the copy serves the page — with the
//     topic's message version and seq counter, the caller's deletion
//     ranges, and for a since page the forward bound (routing.Bound, read
//     first), for a before page into history the route.
//  2. planPage builds the page's plan from the request and those replies
//     alone, no I/O: whether the bound leaves anything above the cursor
//     (Bound.Forward), what the hot view proves of the page — the page
//     itself, a miss, or one of two follow-ups: the caller's ranges from
//     MySQL when Redis did not know them, one longer cache read — and
//     the MySQL query and side of the route for a miss.
//  3. run executes it: fetches a follow-up and asks the plan again (walk,
//     over), keeps what the page proved as the process's copy, or else
//     resolves the route (Redis, the mirror, the bounded fallback) to
//     month tables, orders them with the legacy table (sources) and reads
//     them one at a time until the page is full; a newest-first page adds
//     what the cache holds and MySQL does not yet (withHeld).
//  4. A since page lists the recorded gaps it stepped over — from the
//     round trip unless resolving the bound recorded gaps after it — and
//     how far it accounts for (Through), where the stream goes on.
//
// A read that walks a topic's tables outside a list page — a search, the
// topic list's last message, an unread count — is planned and executed
// the same way: PlanSearch, PlanLast and PlanCount build its WalkPlan
// (the query, the months newest first, the legacy source, or nothing to
// read) from what the caller already read (the topic's mirror, the legacy
// source, the registered months, the retention floor), no I/O; Reader.Walk
// executes it into rows, and Reader.Sources into its ordered sources, each
// marked archived or not, for the inbox's count, which reads them with
// statements of its own. The modules never order sources themselves.
package readpath

import (
	"context"
	"database/sql"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// Params wires a Reader.
type Params struct {
	Redis    rueidis.Client
	KeySpace routing.KeySpace // redis.key_prefix: where every key and channel is named
	DBs      routing.DBs
	Router   *routing.Router
	Catalog  *routing.Catalog // which months are archived
	// Cold reads archived months (nil: a read of one fails, ErrNoColdTier).
	Cold    ColdMonths
	Flight  *routing.Flight
	ACL     *acl.Checker
	Scripts *routing.Scripts
	// HiddenTTL is how long a caller's cached deletion ranges live (default 5m).
	HiddenTTL time.Duration
	// LocalTopics is how many topics' newest messages the process keeps a
	// copy of (recent), read for LocalMaxAge at most; either 0 keeps none.
	LocalTopics int
	LocalMaxAge time.Duration
	Log         zerolog.Logger
	Registerer  prometheus.Registerer
}

// Reader reads topics' messages for the modules that answer reads.
type Reader struct {
	p      Params
	m      *metrics
	st     *Store
	recent *recents
	// overlaid holds the tenant months ("tenant/YYYYMM") known to have had
	// overlay rows: they stay in the tenant's set (routing.MarkOverlay), so
	// this cache only ever grows, and a month in it is read without asking
	// Redis first
	overlaid sync.Map
}

// New builds the reader and registers its metrics; Close releases its
// prepared statements.
func New(p Params) *Reader {
	rc := newRecents(p.LocalTopics, p.LocalMaxAge)
	return &Reader{p: p, m: newMetrics(p.Registerer, rc.topics), st: newStore(), recent: rc}
}

// Close releases the prepared statements.
func (s *Reader) Close() { s.st.close() }

// Store is the reader's statement cache, for the statements of the modules
// that read through it.
func (s *Reader) Store() *Store { return s.st }

// Observe records one read request that touched n month tables; cached
// means the hot cache answered.
func (s *Reader) Observe(n int, cached bool, seconds float64) { s.m.observe(n, cached, seconds) }

// ErrNotFound answers a read of a message the caller may not see or that
// does not exist.
var ErrNotFound = httpapi.Errorf(httpapi.CodeNotFound, "no such message")

// BeforePage is a newest-first page.
type BeforePage struct {
	Messages   []message.Message `json:"messages"`
	NextBefore *int64            `json:"next_before"`
	HasMore    bool              `json:"has_more"`
}

// SincePage is an oldest-first page. Gaps lists the recorded gaps (seqs
// allocated and never persisted) the page stepped over, so a client knows
// they will never arrive.
type SincePage struct {
	Messages  []message.Message `json:"messages"`
	NextSince int64             `json:"next_since"`
	HasMore   bool              `json:"has_more"`
	Gaps      []int64           `json:"gaps"`
	// Through is the highest seq the page accounts for: every seq from
	// since+1 to it was returned, is a listed gap, or is not visible to
	// the caller (hidden, deleted for everyone). A follower (the stream)
	// continues from it; it is at least NextSince.
	Through int64 `json:"-"`
}

// Authorize is the membership decision of a read (acl.Checker.Authorize),
// for the modules that read through the reader.
func (s *Reader) Authorize(ctx context.Context, p httpapi.Principal, topic string) error {
	return s.p.ACL.Authorize(ctx, p, topic)
}

// Open validates the topic and returns the tenant's key builder and pool.
func (s *Reader) Open(ctx context.Context, p httpapi.Principal, topic string) (routing.Keys, *sql.DB, error) {
	if err := routing.ValidTopic(topic); err != nil {
		return routing.Keys{}, nil, err
	}
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return routing.Keys{}, nil, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	return keys, db, err
}

func NonNil(ms []message.Message) []message.Message {
	if ms == nil {
		return []message.Message{}
	}
	return ms
}

func nonNilSeqs(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// Scan reads month tables one at a time in the route's order until the
// page holds q.limit rows: never a UNION over history (invariant 7). It
// returns the rows and how many tables it touched. route holds the route's
// prefetched reads, or nil to read it now.
func (s *Reader) Scan(ctx context.Context, db *sql.DB, tenant string, q ListQuery, route []rueidis.RedisResult,
	pick func(routing.TopicRoute) []routing.Month) ([]message.Message, int, error) {
	var tr routing.TopicRoute
	var err error
	if route != nil {
		tr, err = s.p.Router.RouteResolve(ctx, tenant, q.Topic, route)
	} else {
		tr, err = s.p.Router.Route(ctx, tenant, q.Topic)
	}
	if err != nil {
		return nil, 0, err
	}
	tables, err := s.p.Router.Tables(ctx, tenant, pick(tr))
	if err != nil {
		return nil, 0, err
	}
	page, touched, err := s.walkSources(ctx, db, tenant, q, sources(q, tables, tr.Legacy))
	if err != nil {
		return nil, touched, err
	}
	s.RepairIfFallback(ctx, tenant, q.Topic, tr, len(page) > 0)
	return page, touched, nil
}

// walkSources reads srcs (sources) in order, each for what the page still
// lacks (a source read whole for a page's worth), until the page holds
// q.limit rows, merging rows met twice by seq: every list read of a topic's
// messages — pages, context, search, the topic list's last message — walks
// its month tables and, while the tenant migrates, the legacy table this
// way; an archived month is read from its archive (coldList). It returns
// the rows and how many sources it read.
func (s *Reader) walkSources(ctx context.Context, db *sql.DB, tenant string, q ListQuery, srcs []Source) ([]message.Message, int, error) {
	var page []message.Message
	touched := 0
	want := q.Limit
	for _, src := range srcs {
		if len(page) >= want && !src.full {
			break
		}
		src.Q.Limit = want - len(page)
		if src.full {
			src.Q.Limit = want
		}
		rows, err := s.ReadSource(ctx, db, tenant, src)
		if err != nil {
			return nil, touched, err
		}
		touched++
		page = merge(page, rows, q.Order)
	}
	return page, touched, nil
}

// ReadSource is one source's rows, from its table or its month's archive
// (with its overlay).
func (s *Reader) ReadSource(ctx context.Context, db *sql.DB, tenant string, src Source) ([]message.Message, error) {
	if !src.Month.IsZero() {
		cold, err := s.Archived(ctx, tenant, src.Month)
		if err != nil {
			return nil, err
		}
		if cold {
			return s.coldList(ctx, db, tenant, src.Month, src.Q)
		}
	}
	return s.st.Messages(ctx, db, src.Q.build(src.Table))
}

// Source is one table a list page reads, with its share of the query.
type Source struct {
	Table string        // quoted
	Month routing.Month // a month table's month (zero: the legacy table)
	Q     ListQuery
	full  bool // read whole (limit rows) even when the page is already full
}

// sources orders the tables of a list page — the route's month tables and,
// while the tenant migrates, the legacy table bounded by leg — so that
// each source holds only seqs beyond every row of the ones before it:
// the walk can stop as soon as the page is full (invariant 7). After
// cutover the legacy table answers for the seqs up to cutover_seq and the
// month tables above it (the backfill's copies below it are not read, so
// a half-copied month never hides a legacy row). Before cutover both are
// read whole and merged: the month tables hold seqs above every legacy one
// then — but a process whose state lags may read this way while the
// backfill already copies, so no source may end the walk early.
func sources(q ListQuery, tables []routing.Table, leg routing.LegacySource) []Source {
	out := orderSources(q, tables, leg)
	if leg.Hi > 0 && !leg.Split {
		for i := range out {
			out[i].full = true
		}
	}
	return out
}

func orderSources(q ListQuery, tables []routing.Table, leg routing.LegacySource) []Source {
	months := make([]Source, 0, len(tables)+1)
	mq := q
	if leg.Hi > 0 && leg.Split {
		if q.Order == Desc {
			mq.Floor = max(q.Floor, leg.Hi)
		} else {
			mq.Bound = max(q.Bound, leg.Hi)
		}
	}
	if !(leg.Split && q.Order == Desc && q.Bound <= leg.Hi+1) {
		for _, t := range tables {
			months = append(months, Source{Table: t.Quoted(), Month: t.Month(), Q: mq})
		}
	}
	if leg.Hi <= 0 {
		return months
	}
	lq := q
	if q.Order == Desc {
		if leg.Hi < math.MaxInt64 {
			lq.Bound = min(q.Bound, leg.Hi+1)
		}
		return append(months, Source{Table: routing.LegacyQuoted(), Q: lq})
	}
	if q.Bound >= leg.Hi {
		return months
	}
	lq.UpTo = min(q.UpTo, leg.Hi)
	return append([]Source{{Table: routing.LegacyQuoted(), Q: lq}}, months...)
}

// RepairIfFallback queues a route repair when a topic that neither Redis
// nor the mirror knows turned out to have rows.
func (s *Reader) RepairIfFallback(ctx context.Context, tenant, topic string, tr routing.TopicRoute, found bool) {
	if tr.Source != routing.RouteFromFallback || !found {
		return
	}
	if err := s.p.Router.QueueRepair(ctx, tenant, topic); err != nil {
		s.p.Log.Warn().Err(err).Str("tenant", tenant).Str("topic", topic).Msg("queue route repair")
	}
}
