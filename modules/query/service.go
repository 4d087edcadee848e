// Package query is the read path: every way a client reads a
// topic's messages — latest/before pages, since pages, one seq, context,
// search — plus the admin lookups. Clients never learn about months: their
// cursors are seqs, and the router (modules/routing) maps them to month
// tables, which are read one at a time, in order, until the page is full.
package query

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"slices"
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

// ACL answers membership questions (acl.Checker); Resolve finishes a
// lookup whose acl.Cmds were pipelined with the page's own reads.
type ACL interface {
	Lookup(ctx context.Context, tenant, topic string, userID int64) (acl.Membership, error)
	Resolve(ctx context.Context, tenant, topic string, userID int64, res []rueidis.RedisResult) (acl.Membership, error)
}

// Params wires a Service.
type Params struct {
	Redis   rueidis.Client
	DBs     routing.DBs
	Router  *routing.Router
	Catalog *routing.Catalog
	Routes  *routing.Routes
	Flight  *routing.Flight
	ACL     ACL
	Scripts *routing.Scripts
	// Migrations gates changes while the tenant migrates from its legacy table.
	Migrations *routing.Migrations
	HiddenTTL  time.Duration // how long a caller's cached deletion ranges live (default 5m)
	// LocalTopics is how many topics' newest messages the process keeps a
	// copy of (recent), read for LocalMaxAge at most; either 0 keeps none.
	LocalTopics int
	LocalMaxAge time.Duration
	// LocalUsers is how many users' unread counts the process remembers
	// (readstate_memo.go), each for RememberedMaxAge at most; either 0 keeps
	// none.
	LocalUsers       int
	RememberedMaxAge time.Duration
	// LocalRoutes is how many topics' route mirrors the process remembers
	// for topic lists, each for RememberedMaxAge at most; either 0 keeps
	// none.
	LocalRoutes int
	// RecallWindow is how long after sending a sender may recall a
	// message (send.recall_window).
	RecallWindow time.Duration
	// MaxEditBody bounds an edit's body as send.max_body_bytes bounds a
	// send's (default 64 KiB).
	MaxEditBody int64
	Log         zerolog.Logger
	Registerer  prometheus.Registerer
}

// Service answers reads.
type Service struct {
	p      Params
	m      *metrics
	st     *store
	recent *recents
	memo   *badgeMemo
	routes *routeMemo
	bg     sync.WaitGroup // read frames being published (publishRead)
}

// New builds the service; Close waits for its read frames under way and
// releases its prepared statements.
func New(p Params) *Service {
	rc := newRecents(p.LocalTopics, p.LocalMaxAge)
	bm := newBadgeMemo(p.LocalUsers, p.RememberedMaxAge)
	rm := newRouteMemo(p.LocalRoutes, p.RememberedMaxAge)
	return &Service{p: p, m: newMetrics(p.Registerer, rc.topics, bm.held, rm.held), st: newStore(), recent: rc, memo: bm, routes: rm}
}

// Close waits for the read frames under way and releases the prepared
// statements.
func (s *Service) Close() {
	s.bg.Wait()
	s.st.close()
}

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

var (
	errForbidden = httpapi.Errorf(httpapi.CodePermissionDenied, "not a member of this topic")
	errNotFound  = httpapi.Errorf(httpapi.CodeNotFound, "no such message")
)

// authorize lets members read their topic and the tenant's admins read any.
func (s *Service) authorize(ctx context.Context, p httpapi.Principal, topic string) error {
	if err := routing.ValidTopic(topic); err != nil {
		return err
	}
	if p.Role == httpapi.RoleAdmin {
		return nil
	}
	return allowed(s.p.ACL.Lookup(ctx, p.Tenant, topic, p.UserID))
}

// allowed turns a membership lookup into the read permission.
func allowed(m acl.Membership, err error) error {
	if errors.Is(err, acl.ErrNoGroup) {
		return errForbidden
	}
	if err != nil {
		return err
	}
	if !m.Member {
		return errForbidden
	}
	return nil
}

// Before is the page of up to limit visible messages with seq < before,
// newest first; before 0 means the latest page.
func (s *Service) Before(ctx context.Context, p httpapi.Principal, topic string, before int64, limit int) (BeforePage, error) {
	start := time.Now()
	if before <= 0 {
		before = math.MaxInt64
	}
	keys, db, err := s.open(ctx, p, topic)
	if err != nil {
		return BeforePage{}, err
	}
	// a latest page is the hot cache's; a cursor into history likely MySQL's
	r, err := s.readPage(ctx, p, keys, db, topic, Desc, before, limit+1+hotSlack, pageAlso{route: before < math.MaxInt64})
	if err != nil {
		return BeforePage{}, err
	}
	page, ok := s.fromCache(ctx, db, p, keys, topic, r, before, min(before-1, r.last), 1, Desc, limit, r.v.lo())
	tables := 0
	if !ok {
		q := listQuery{topic: topic, user: p.UserID, order: Desc, bound: before, limit: limit + 1, hidNothing: r.hv.none()}
		if page, tables, err = s.scan(ctx, db, p.Tenant, q, r.route, func(tr routing.TopicRoute) []routing.Month { return tr.Before(before) }); err != nil {
			return BeforePage{}, err
		}
		if page, err = s.withHeld(ctx, db, p, topic, r, before, page); err != nil {
			return BeforePage{}, err
		}
	}
	s.m.observe(tables, ok, time.Since(start).Seconds())
	page, more := Truncate(page, limit)
	return BeforePage{Messages: nonNil(page), NextBefore: NextBefore(page), HasMore: more}, nil
}

// withHeld adds to a newest-first page read from MySQL what the page's
// hot-cache read holds below before and MySQL did not return (messages
// acknowledged but not persisted yet), minus what the caller hid.
func (s *Service) withHeld(ctx context.Context, db *sql.DB, p httpapi.Principal, topic string, r pageReads,
	before int64, page []message.Message) ([]message.Message, error) {
	held := r.v.held(before)
	if len(held) == 0 {
		return page, nil
	}
	hidden := r.hv.ranges
	if !r.hv.known {
		var err error
		if hidden, err = s.st.hidden(ctx, db, topic, p.UserID, held[len(held)-1].Seq, 0); err != nil {
			return nil, err
		}
	}
	visible := held[:0]
	for _, m := range held {
		if !hidden.Hides(m.Seq) {
			visible = append(visible, m)
		}
	}
	return Merge(page, visible, Desc), nil
}

// open validates the topic and returns the tenant's key builder and pool.
func (s *Service) open(ctx context.Context, p httpapi.Principal, topic string) (routing.Keys, *sql.DB, error) {
	if err := routing.ValidTopic(topic); err != nil {
		return routing.Keys{}, nil, err
	}
	keys, err := routing.KeysFor(p.Tenant)
	if err != nil {
		return routing.Keys{}, nil, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	return keys, db, err
}

// Since is the page of up to limit visible messages with seq > since,
// oldest first, never above the topic's settled watermark (invariant 12):
// a seq still in flight below a persisted one stops the page, so it cannot
// be jumped over.
func (s *Service) Since(ctx context.Context, p httpapi.Principal, topic string, since int64, limit int) (SincePage, error) {
	start := time.Now()
	keys, db, err := s.open(ctx, p, topic)
	if err != nil {
		return SincePage{}, err
	}
	r, err := s.readPage(ctx, p, keys, db, topic, Asc, since, limit+1+hotSlack, pageAlso{settled: true})
	if err != nil {
		return SincePage{}, err
	}
	// the watermark is a seq, never "unbounded": a topic whose counter
	// Redis does not hold has only what MySQL proves stored (0: nothing
	// above since, an empty page the client polls again)
	settled := r.settled
	var page []message.Message
	ok, tables := false, 0
	if settled > since {
		page, ok = s.fromCache(ctx, db, p, keys, topic, r, since, since+1, min(settled, r.last), Asc, limit, since)
		if !ok {
			q := listQuery{topic: topic, user: p.UserID, order: Asc, bound: since, upTo: settled, limit: limit + 1, hidNothing: r.hv.none()}
			if page, tables, err = s.scan(ctx, db, p.Tenant, q, nil, func(tr routing.TopicRoute) []routing.Month { return tr.Since(since) }); err != nil {
				return SincePage{}, err
			}
		}
	}
	s.m.observe(tables, ok, time.Since(start).Seconds())
	page, more := Truncate(dropFirst(page), limit)
	next := NextSince(page, since)
	hi := settled
	if more {
		hi = next
	}
	var gaps []int64
	if hi > since {
		// the page's round trip read every gap up to hi, after the
		// watermark (a seq settled by then that became a gap was one
		// already), or this process's copy below it holds them: gaps are
		// never taken back
		read := false
		if r.herr == nil && !r.regapped {
			gaps, read = r.v.gapsIn(since+1, hi)
		}
		if !read {
			if gaps, err = s.p.Flight.Gaps(ctx, p.Tenant, topic, since+1, hi); err != nil {
				return SincePage{}, err
			}
		}
	}
	through := max(hi, next)
	if len(gaps) > 0 {
		through = max(through, gaps[len(gaps)-1])
	}
	return SincePage{Messages: nonNil(page), NextSince: next, HasMore: more, Gaps: nonNilSeqs(gaps), Through: through}, nil
}

// Settled is the topic's settled watermark (routing.Flight.Settled), the
// bound of Since: where a stream that gave no cursor starts, so that a seq
// still in flight below the last issued one is delivered once it settles.
func (s *Service) Settled(ctx context.Context, tenant, topic string) (int64, error) {
	settled, err := s.p.Flight.Settled(ctx, tenant, topic)
	if err != nil {
		return 0, httpapi.Wrap(httpapi.CodeUnavailable, "settled watermark unavailable", err)
	}
	return settled, nil
}

func nonNil(ms []message.Message) []message.Message {
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

// scan reads month tables one at a time in the route's order until the
// page holds q.limit rows: never a UNION over history (invariant 7). It
// returns the rows and how many tables it touched. route holds the route's
// prefetched reads, or nil to read it now.
func (s *Service) scan(ctx context.Context, db *sql.DB, tenant string, q listQuery, route []rueidis.RedisResult,
	pick func(routing.TopicRoute) []routing.Month) ([]message.Message, int, error) {
	var tr routing.TopicRoute
	var err error
	if route != nil {
		tr, err = s.p.Router.RouteResolve(ctx, tenant, q.topic, route)
	} else {
		tr, err = s.p.Router.Route(ctx, tenant, q.topic)
	}
	if err != nil {
		return nil, 0, err
	}
	tables, err := s.p.Router.Tables(ctx, tenant, pick(tr))
	if err != nil {
		return nil, 0, err
	}
	page, touched, err := s.walkSources(ctx, db, q, sources(q, tables, tr.Legacy))
	if err != nil {
		return nil, touched, err
	}
	s.repairIfFallback(ctx, tenant, q.topic, tr, len(page) > 0)
	return page, touched, nil
}

// walkSources reads srcs (sources) in order, each for what the page still
// lacks (a source read whole for a page's worth), until the page holds
// q.limit rows, merging rows met twice by seq: every list read of a topic's
// messages — pages, context, search, the topic list's last message — walks
// its month tables and, while the tenant migrates, the legacy table this
// way. It returns the rows and how many tables it read.
func (s *Service) walkSources(ctx context.Context, db *sql.DB, q listQuery, srcs []source) ([]message.Message, int, error) {
	var page []message.Message
	touched := 0
	want := q.limit
	for _, src := range srcs {
		if len(page) >= want && !src.full {
			break
		}
		src.q.limit = want - len(page)
		if src.full {
			src.q.limit = want
		}
		rows, err := s.st.messages(ctx, db, src.q.build(src.table))
		if err != nil {
			return nil, touched, err
		}
		touched++
		page = Merge(page, rows, q.order)
	}
	return page, touched, nil
}

// source is one table a list page reads, with its share of the query.
type source struct {
	table string // quoted
	q     listQuery
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
func sources(q listQuery, tables []routing.Table, leg routing.LegacySource) []source {
	out := orderSources(q, tables, leg)
	if leg.Hi > 0 && !leg.Split {
		for i := range out {
			out[i].full = true
		}
	}
	return out
}

func orderSources(q listQuery, tables []routing.Table, leg routing.LegacySource) []source {
	months := make([]source, 0, len(tables)+1)
	mq := q
	if leg.Hi > 0 && leg.Split {
		if q.order == Desc {
			mq.floor = leg.Hi
		} else {
			mq.bound = max(q.bound, leg.Hi)
		}
	}
	if !(leg.Split && q.order == Desc && q.bound <= leg.Hi+1) {
		for _, t := range tables {
			months = append(months, source{table: t.Quoted(), q: mq})
		}
	}
	if leg.Hi <= 0 {
		return months
	}
	lq := q
	if q.order == Desc {
		if leg.Hi < math.MaxInt64 {
			lq.bound = min(q.bound, leg.Hi+1)
		}
		return append(months, source{table: routing.LegacyQuoted(), q: lq})
	}
	if q.bound >= leg.Hi {
		return months
	}
	lq.upTo = min(q.upTo, leg.Hi)
	return append([]source{{table: routing.LegacyQuoted(), q: lq}}, months...)
}

// repairIfFallback queues a route repair when a topic that neither Redis
// nor the mirror knows turned out to have rows.
func (s *Service) repairIfFallback(ctx context.Context, tenant, topic string, tr routing.TopicRoute, found bool) {
	if tr.Source != routing.RouteFromFallback || !found {
		return
	}
	if err := s.p.Router.QueueRepair(ctx, tenant, topic); err != nil {
		s.p.Log.Warn().Err(err).Str("tenant", tenant).Str("topic", topic).Msg("queue route repair")
	}
}

// fromCache answers a page from the hot cache read r.v (next to bound)
// when it provably covers every seq from `from` to `stop` the page walks
// (Redis answers only a complete page); ok false sends the
// page to MySQL. The caller's deletion ranges are r.hv; when Redis did not
// know them, those reaching above hiddenLo are read from MySQL, only once
// the hot cache is known to cover the page. A latest page keeps what it
// proved as this process's copy of the topic's newest stretch, and a page
// read over a copy extends it.
func (s *Service) fromCache(ctx context.Context, db *sql.DB, p httpapi.Principal, keys routing.Keys, topic string, r pageReads,
	bound, from, stop int64, o Order, limit int, hiddenLo int64) ([]message.Message, bool) {
	v, hidden := r.v, r.hv.ranges
	if r.herr != nil {
		s.p.Log.Warn().Err(r.herr).Str("topic", topic).Msg("hot cache read failed; reading MySQL")
		return nil, false
	}
	if r.last == 0 {
		return s.hotMiss()
	}
	k := topicKey{p.Tenant, topic}
	latest := o == Desc && bound == math.MaxInt64
	now := r.at
	if v.base != nil && v.base.hi > r.last {
		// the seq counter is below the copy: the copy is of a past the
		// topic no longer has, and the read above it proves nothing
		s.recent.drop(k)
		s.m.local.WithLabelValues(localReset).Inc()
		return s.hotMiss()
	}
	if v.base == nil && latest {
		v.base = newRecent(v.top, r.last, now)
	}
	if !r.hv.known {
		if _, ok, miss := walk(v, from, stop, o, limit, nil, false); !ok && v.covers(miss) {
			return s.hotMiss()
		}
		var err error
		if hidden, err = s.st.hidden(ctx, db, topic, p.UserID, hiddenLo, 0); err != nil {
			return nil, false
		}
	}
	page, ok, miss := walk(v, from, stop, o, limit, hidden, false)
	if !ok && !v.covers(miss) && r.hv.known {
		// the read (or the copy) ended before the page did (seqs it skips
		// in the way): read further once (with ranges read from MySQL
		// above hiddenLo only, MySQL answers instead)
		if r.v.base != nil {
			s.m.local.WithLabelValues(localFallback).Inc()
		}
		if c, err := s.hotReread(ctx, keys, topic, o, bound, hotFurther*(limit+1+hotSlack)); err == nil {
			v = hotView{top: c}
			if latest {
				v.base = newRecent(c, r.last, now)
			}
			page, ok, _ = walk(v, from, stop, o, limit, hidden, false)
		}
	} else if ok && r.v.base != nil {
		s.m.local.WithLabelValues(localHit).Inc()
	}
	s.keepRecent(k, v, r.v.base, latest, r.last, now)
	if !ok {
		return s.hotMiss()
	}
	s.m.hot.WithLabelValues("hit").Inc()
	return page, true
}

// keepRecent keeps what a page's view proved of the topic's newest
// stretch: its copy extended by the read above it, or — for a latest page
// whose copy could not reach the topic's last seq that way (the read above
// it was cut short) — the stretch below the last seq. held is the copy the
// page was read over (nil if none): kept as it is, it is not stored again.
func (s *Service) keepRecent(k topicKey, v hotView, held *recent, latest bool, last int64, now time.Time) {
	if v.base == nil {
		return
	}
	kept := v.base.extend(v.top)
	if latest && kept.hi < last {
		if r := newRecent(v.top, last, now); r != nil {
			kept = r
		}
	}
	if kept != held {
		s.recent.put(k, kept, now)
	}
}

func (s *Service) hotMiss() ([]message.Message, bool) {
	s.m.hot.WithLabelValues("miss").Inc()
	return nil, false
}

// Get is one message by seq: the hot cache, else the month the route
// names (then its neighbour and the probe months). Recalled and deleted
// messages come back as tombstones; one the caller hid is not found.
func (s *Service) Get(ctx context.Context, p httpapi.Principal, topic string, seq int64) (message.Message, error) {
	if err := s.authorize(ctx, p, topic); err != nil {
		return message.Message{}, err
	}
	start := time.Now()
	m, tables, err := s.get(ctx, p, topic, seq)
	s.m.observe(tables, err == nil && tables == 0, time.Since(start).Seconds())
	return m, err
}

func (s *Service) get(ctx context.Context, p httpapi.Principal, topic string, seq int64) (message.Message, int, error) {
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return message.Message{}, 0, err
	}
	keys, err := routing.KeysFor(p.Tenant)
	if err != nil {
		return message.Message{}, 0, err
	}
	if m, ok, err := s.hotOne(ctx, keys, topic, seq); err == nil && ok {
		hv, err := s.hiddenOf(ctx, db, keys, topic, p.UserID)
		if err != nil {
			return message.Message{}, 0, err
		}
		hidden := hv.ranges
		if !hv.known {
			if hidden, err = s.st.hidden(ctx, db, topic, p.UserID, seq, 0); err != nil {
				return message.Message{}, 0, err
			}
		}
		if hidden.Hides(seq) {
			return message.Message{}, 0, errNotFound
		}
		return m, 0, nil
	}
	tr, err := s.p.Router.Route(ctx, p.Tenant, topic)
	if err != nil {
		return message.Message{}, 0, err
	}
	tables, err := s.p.Router.Tables(ctx, p.Tenant, tr.BySeq(seq))
	if err != nil {
		return message.Message{}, 0, err
	}
	quoted := make([]string, 0, len(tables)+1)
	if seq <= tr.Legacy.Hi {
		// while the tenant migrates, the legacy table answers for its seqs
		quoted = append(quoted, routing.LegacyQuoted())
	}
	if seq > tr.Legacy.Hi || !tr.Legacy.Split {
		for _, t := range tables {
			quoted = append(quoted, t.Quoted())
		}
	}
	for i, t := range quoted {
		m, ok, err := s.st.one(ctx, db, t, topic, p.UserID, seq)
		if err != nil {
			return message.Message{}, i + 1, err
		}
		if ok {
			s.repairIfFallback(ctx, p.Tenant, topic, tr, true)
			return m, i + 1, nil
		}
	}
	return message.Message{}, len(tables), errNotFound
}

// Context is the target message with up to nBefore messages before it and
// nAfter after it, oldest first, crossing months as needed.
// Globally deleted neighbours stay as tombstones, hidden ones are left out.
func (s *Service) Context(ctx context.Context, p httpapi.Principal, topic string, seq int64, nBefore, nAfter int) ([]message.Message, error) {
	if err := s.authorize(ctx, p, topic); err != nil {
		return nil, err
	}
	start := time.Now()
	target, touched, err := s.get(ctx, p, topic, seq)
	if err != nil {
		return nil, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return nil, err
	}
	var older, newer []message.Message
	if nBefore > 0 {
		q := listQuery{topic: topic, user: p.UserID, order: Desc, bound: seq, limit: nBefore, keepDeleted: true}
		var n int
		if older, n, err = s.scan(ctx, db, p.Tenant, q, nil, func(tr routing.TopicRoute) []routing.Month { return tr.Before(seq) }); err != nil {
			return nil, err
		}
		touched += n
	}
	if nAfter > 0 {
		q := listQuery{topic: topic, user: p.UserID, order: Asc, bound: seq, upTo: unbounded, limit: nAfter, keepDeleted: true}
		var n int
		if newer, n, err = s.scan(ctx, db, p.Tenant, q, nil, func(tr routing.TopicRoute) []routing.Month { return tr.Since(seq) }); err != nil {
			return nil, err
		}
		touched += n
	}
	s.m.observe(touched, false, time.Since(start).Seconds())
	slices.Reverse(older)
	out := append(older, target)
	return append(out, newer...), nil
}
