// Package query is the read path: every way a client reads a
// topic's messages — latest/before pages, since pages, one seq, context,
// search — plus the admin lookups. Clients never learn about months: their
// cursors are seqs, and the router (modules/routing) maps them to month
// tables, which are read one at a time, in order, until the page is full.
// The machinery under the pages (hot cache, deletion ranges, the walk over
// month tables) is modules/readpath's.
package query

import (
	"context"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
)

// Params wires a Service.
type Params struct {
	// Reader is the process's read path (modules/readpath).
	Reader   *readpath.Reader
	Redis    rueidis.Client
	KeySpace routing.KeySpace // redis.key_prefix: where every key and channel is named
	DBs      routing.DBs
	Router   *routing.Router
	Catalog  *routing.Catalog
	Routes   *routing.Routes
	Flight   *routing.Flight
	// Migrations answers whether a tenant migrates from its legacy table
	// (dual reads).
	Migrations *routing.Migrations
	// RouteCheck answers the admin route view (archived months from their
	// archives).
	RouteCheck *routecheck.Checker
}

// Service answers reads.
type Service struct {
	p  Params
	r  *readpath.Reader
	st *readpath.Store
}

// New builds the service.
func New(p Params) *Service {
	return &Service{p: p, r: p.Reader, st: p.Reader.Store()}
}

// Before is the page of up to limit visible messages with seq < before,
// newest first; before 0 means the latest page (readpath plans and reads
// it).
func (s *Service) Before(ctx context.Context, p httpapi.Principal, topic string, before int64, limit int) (readpath.BeforePage, error) {
	return s.r.Before(ctx, p, topic, before, limit)
}

// Since is the page of up to limit visible messages with seq > since,
// oldest first, never above the topic's forward bound (invariant 12;
// readpath plans and reads it).
func (s *Service) Since(ctx context.Context, p httpapi.Principal, topic string, since int64, limit int) (readpath.SincePage, error) {
	return s.r.Since(ctx, p, topic, since, limit)
}

// Bound is the topic's forward bound (routing.Flight.Bound), the bound of
// Since: its settled watermark is where a stream that gave no cursor
// starts, so that a seq still in flight below the last issued one is
// delivered once it settles.
func (s *Service) Bound(ctx context.Context, tenant, topic string) (routing.Bound, error) {
	b, err := s.p.Flight.Bound(ctx, tenant, topic)
	if err != nil {
		return routing.Bound{}, httpapi.Wrap(httpapi.CodeUnavailable, "settled watermark unavailable", err)
	}
	return b, nil
}

// Authorize answers whether p may read topic (members of its group, the
// tenant's admins): nil, or the error a read would answer.
func (s *Service) Authorize(ctx context.Context, p httpapi.Principal, topic string) error {
	return s.r.Authorize(ctx, p, topic)
}

// Get is one message by seq: the hot cache, else the month the route
// names (then its neighbour and the probe months). Recalled and deleted
// messages come back as tombstones; one the caller hid is not found.
func (s *Service) Get(ctx context.Context, p httpapi.Principal, topic string, seq int64) (message.Message, error) {
	if err := s.r.Authorize(ctx, p, topic); err != nil {
		return message.Message{}, err
	}
	start := time.Now()
	m, tables, err := s.get(ctx, p, topic, seq)
	s.r.Observe(tables, err == nil && tables == 0, time.Since(start).Seconds())
	return m, err
}

func (s *Service) get(ctx context.Context, p httpapi.Principal, topic string, seq int64) (message.Message, int, error) {
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return message.Message{}, 0, err
	}
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return message.Message{}, 0, err
	}
	// below the retention floor: removed, and said so
	if err := s.r.CheckExpired(ctx, db, keys, topic, seq); err != nil {
		return message.Message{}, 0, err
	}
	if m, ok, err := s.r.HotOne(ctx, keys, topic, seq); err == nil && ok {
		hv, err := s.r.HiddenOf(ctx, db, keys, topic, p.UserID)
		if err != nil {
			return message.Message{}, 0, err
		}
		hidden := hv.Ranges
		if !hv.Known {
			if hidden, err = s.st.HiddenRanges(ctx, db, topic, p.UserID, seq, 0); err != nil {
				return message.Message{}, 0, err
			}
		}
		if hidden.Hides(seq) {
			return message.Message{}, 0, readpath.ErrNotFound
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
	type lookup func() (message.Message, bool, error)
	reads := make([]lookup, 0, len(tables)+1)
	if seq <= tr.Legacy.Hi {
		// while the tenant migrates, the legacy table answers for its seqs
		reads = append(reads, func() (message.Message, bool, error) {
			return s.st.One(ctx, db, routing.LegacyQuoted(), topic, p.UserID, seq)
		})
	}
	if seq > tr.Legacy.Hi || !tr.Legacy.Split {
		for _, t := range tables {
			reads = append(reads, func() (message.Message, bool, error) { return s.r.OneIn(ctx, db, p.Tenant, t, topic, p.UserID, seq) })
		}
	}
	for i, read := range reads {
		m, ok, err := read()
		if err != nil {
			return message.Message{}, i + 1, err
		}
		if ok {
			s.r.RepairIfFallback(ctx, p.Tenant, topic, tr, true)
			return m, i + 1, nil
		}
	}
	return message.Message{}, len(tables), readpath.ErrNotFound
}

// Context is the target message with up to nBefore messages before it and
// nAfter after it, oldest first, crossing months as needed.
// Globally deleted neighbours stay as tombstones, hidden ones are left out.
func (s *Service) Context(ctx context.Context, p httpapi.Principal, topic string, seq int64, nBefore, nAfter int) ([]message.Message, error) {
	if err := s.r.Authorize(ctx, p, topic); err != nil {
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
		q := readpath.ListQuery{Topic: topic, User: p.UserID, Order: readpath.Desc, Bound: seq, Limit: nBefore, KeepDeleted: true}
		var n int
		if older, n, err = s.r.Scan(ctx, db, p.Tenant, q, nil, func(tr routing.TopicRoute) []routing.Month { return tr.Before(seq) }); err != nil {
			return nil, err
		}
		touched += n
	}
	if nAfter > 0 {
		q := readpath.ListQuery{Topic: topic, User: p.UserID, Order: readpath.Asc, Bound: seq, UpTo: readpath.Unbounded, Limit: nAfter, KeepDeleted: true}
		var n int
		if newer, n, err = s.r.Scan(ctx, db, p.Tenant, q, nil, func(tr routing.TopicRoute) []routing.Month { return tr.Since(seq) }); err != nil {
			return nil, err
		}
		touched += n
	}
	s.r.Observe(touched, false, time.Since(start).Seconds())
	slices.Reverse(older)
	out := append(older, target)
	return append(out, newer...), nil
}
