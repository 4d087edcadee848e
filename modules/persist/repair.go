package persist

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// enqueueRepairs records, durably in the tenant database, the topics whose
// Redis follow-ups after a commit failed or may have been lost.
func (s *Service) enqueueRepairs(ctx context.Context, key batchKey, trs []*topicRange, reason string) error {
	db, err := s.p.DBs.DB(ctx, key.tenant)
	if err != nil {
		return err
	}
	entries := make([]routing.RouteRepair, len(trs))
	for i, tr := range trs {
		entries[i] = routing.RouteRepair{Topic: tr.topic, Month: key.month, MinSeq: tr.MinSeq, MaxSeq: tr.MaxSeq}
	}
	if err := routing.QueueRouteRepairs(ctx, db, reason, entries); err != nil {
		return fmt.Errorf("persist: %w", err)
	}
	s.wake(key.tenant)
	return nil
}

// touchEvery bounds how often committed batches wake a tenant's repair
// pass (which also advances its routes-complete watermark).
const touchEvery = 5 * time.Second

// touch wakes the tenant's repair pass after a commit, at most every
// touchEvery.
func (s *Service) touch(tenant string) {
	now := time.Now()
	s.touchMu.Lock()
	if now.Sub(s.touched[tenant]) < touchEvery {
		s.touchMu.Unlock()
		return
	}
	s.touched[tenant] = now
	s.touchMu.Unlock()
	s.wake(tenant)
}

func (s *Service) wake(tenant string) {
	select {
	case s.dirty <- tenant:
	default: // the periodic scan finds it
	}
}

const (
	repairInterval = 500 * time.Millisecond
	repairScan     = time.Minute // every tenant, in case a signal was dropped
	repairBatch    = 100
)

// repairLoop works off the route repair queues: at start and every
// repairScan for every tenant, in between for tenants this process queued
// work for.
func (s *Service) repairLoop(ctx context.Context) {
	dirty := map[string]bool{}
	all := func() {
		for _, t := range s.p.Tenants() {
			dirty[t] = true
		}
	}
	all()
	tick := time.NewTicker(repairInterval)
	defer tick.Stop()
	scan := time.NewTicker(repairScan)
	defer scan.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-s.dirty:
			dirty[t] = true
			continue
		case <-scan.C:
			all()
		case <-tick.C:
		}
		for t := range dirty {
			left, err := s.repairTenant(ctx, t)
			if err == nil {
				err = s.advanceRoutesComplete(ctx, t)
			}
			if err != nil {
				s.p.Log.Debug().Err(err).Str("tenant", t).Msg("persist: route repair pass failed")
				continue
			}
			if left == 0 {
				delete(dirty, t)
			}
		}
	}
}

// repairTenant works off up to repairBatch entries and returns how many are
// left (the backlog gauge).
func (s *Service) repairTenant(ctx context.Context, tenant string) (int, error) {
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		return 0, err
	}
	entries, err := routing.RouteRepairs(ctx, db, repairBatch)
	if err != nil {
		return 0, err
	}
	done := map[string]bool{} // one route rebuild per topic and pass
	for _, e := range entries {
		err := s.repairOne(ctx, tenant, db, e, !done[e.Topic])
		if err != nil {
			s.m.repairs.WithLabelValues("failed").Inc()
			if uerr := routing.RouteRepairFailed(ctx, db, e.ID, truncate(err.Error(), 500)); uerr != nil {
				return 0, uerr
			}
			break // Redis is likely still down: try again next pass
		}
		done[e.Topic] = true
		if err := routing.RouteRepairDone(ctx, db, e.ID); err != nil {
			return 0, err
		}
		s.m.repairs.WithLabelValues("done").Inc()
	}
	left, err := routing.RouteRepairBacklog(ctx, db, routing.Month{})
	if err != nil {
		return 0, err
	}
	s.m.backlog.WithLabelValues(tenant).Set(float64(left))
	return left, nil
}

// repairOne rebuilds the topic's Redis route from the MySQL mirror (the
// source of truth, invariant 6, docs/invariants.md) and finishes the pending set and the
// idempotency records of the rows the entry covers.
func (s *Service) repairOne(ctx context.Context, tenant string, db *sql.DB, e routing.RouteRepair, rebuild bool) error {
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	if rebuild {
		if err := s.rebuildRoute(ctx, rctx, tenant, db, e.Topic); err != nil {
			return err
		}
	}
	table, _, err := s.p.Catalog.Table(ctx, tenant, e.Month)
	if err != nil {
		return err
	}
	rows, err := sq.Select("seqid", "from_user", "client_msg_id").From(table.Quoted()).
		Where(sq.Eq{"topic": e.Topic}).Where(sq.GtOrEq{"seqid": e.MinSeq}).Where(sq.LtOrEq{"seqid": e.MaxSeq}).
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return err
	}
	var recs []*record
	st := routing.Settlement{Topic: e.Topic}
	for rows.Next() {
		var ev message.Event
		var cmid sql.NullString
		var from int64
		if err := rows.Scan(&ev.SeqID, &from, &cmid); err != nil {
			rows.Close()
			return err
		}
		ev.Topic, ev.FromUser, ev.ClientMsgID = e.Topic, message.ID(from), cmid.String
		st.Seqs = append(st.Seqs, ev.SeqID)
		if cmid.Valid {
			recs = append(recs, &record{ev: &ev})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	keys, err := s.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	st.Idem = idemKeys(keys, recs)
	return s.p.Routes.Settle(rctx, tenant, []routing.Settlement{st})
}

// rebuildRoute replaces the Redis route with the mirror while no batch of
// this process is between its commit and its merge (see routeMu).
func (s *Service) rebuildRoute(ctx, rctx context.Context, tenant string, db *sql.DB, topic string) error {
	s.routeMu.Lock()
	defer s.routeMu.Unlock()
	ranges, err := routing.LoadMirror(ctx, db, topic)
	if err != nil {
		return err
	}
	return s.p.Routes.Replace(rctx, tenant, topic, ranges)
}

// advanceRoutesComplete moves the tenant's "routes complete through month
// m" watermark (routing.MarkRoutesComplete; reads then skip probing months
// up to m for rows a stale route might not know) to the newest m such that
// every month up to it is sealed or archived — no more commits reach it,
// late events go to the compensation queue — and no repair entry up to it
// is waiting. A replay after `shard unseal` commits and merges in one step;
// only if that merge fails is the row unrouted until its repair runs.
func (s *Service) advanceRoutesComplete(ctx context.Context, tenant string) error {
	shards, err := s.p.Catalog.List(ctx, tenant)
	if err != nil {
		return err
	}
	var through routing.Month
	for _, sh := range shards {
		if sh.Status != routing.StatusSealed && sh.Status != routing.StatusArchived {
			break
		}
		through = sh.Month
	}
	if through.IsZero() {
		return nil
	}
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	waiting, err := routing.RouteRepairBacklog(ctx, db, through)
	if err != nil {
		return err
	}
	if waiting > 0 {
		return nil
	}
	keys, err := s.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	return routing.MarkRoutesComplete(rctx, s.p.Redis, keys, through)
}
