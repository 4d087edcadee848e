package persist

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// errNotWritable is a month registered but not (yet) taking writes
// (prepared): handled like a missing table, retried and alerted.
var errNotWritable = errors.New("month table is not writable yet")

// process makes one attempt at b and settles what it can (never a silent
// skip): stored, compensated, or — for events the database refuses, found
// by splitting the batch (isolate) — dead-lettered at once, so the rest is
// stored. What is left to retry (the database is down or busy, the month
// table is missing, an error persist does not know) is left in b.retry with
// its failure; the loop then parks the tenant and retries after a backoff
// with jitter, while other tenants' batches keep running. When ctx ends the
// rest stays uncommitted.
func (s *Service) process(ctx context.Context, b *batch) {
	b.retry, b.err = nil, nil
	err := s.claim(ctx, b)
	if err == nil {
		if len(b.recs) == 0 {
			return
		}
		err = s.try(ctx, b.key, b.recs)
	}
	if err == nil {
		return
	}
	f := classify(ctx, err)
	switch f {
	case aborted:
		return
	case fatal:
		s.deadLetter(ctx, b.recs, f.String(), err)
		return
	case permanent:
		b.retry, f, err = s.isolate(ctx, b.key, b.recs, err, false)
	case missingTable, unclassified:
		if f == missingTable {
			s.p.Metrics.ShardMissing.WithLabelValues(b.key.tenant).Inc()
		}
		b.attempts++
		switch {
		case b.attempts <= s.p.Config.MaxRetries:
			b.retry = b.recs
		case f == missingTable:
			s.deadLetter(ctx, b.recs, f.String(), err)
		default:
			b.retry, f, err = s.isolate(ctx, b.key, b.recs, err, true)
		}
	default:
		b.retry = b.recs
	}
	if len(b.retry) > 0 {
		b.fail, b.err = f, err
	}
}

// claim decides the batch's seqs in Redis before anything is stored
// (routing.Flight.Claim, invariant 12): the events of seqs abandoned —
// timed out into gaps that readers walked past, their sends answered 503 —
// are done without a row, and every other seq can no longer time out while
// the batch is stored. An error leaves the batch as it was, to be retried
// like a database outage: storing an event unclaimed could put a row under
// a seq readers already skipped.
func (s *Service) claim(ctx context.Context, b *batch) error {
	seqs := make(map[string][]int64)
	for _, r := range b.recs {
		seqs[r.ev.Topic] = append(seqs[r.ev.Topic], r.ev.SeqID)
	}
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	abandoned, err := s.p.Flight.Claim(rctx, b.key.tenant, seqs)
	if err != nil || len(abandoned) == 0 {
		return err
	}
	var dropped []*record
	kept := b.recs[:0]
	for _, r := range b.recs {
		if slices.Contains(abandoned[r.ev.Topic], r.ev.SeqID) {
			dropped = append(dropped, r)
		} else {
			kept = append(kept, r)
		}
	}
	b.recs = kept
	s.m.persisted.WithLabelValues(b.key.month.String(), statusAbandoned).Add(float64(len(dropped)))
	s.p.Log.Warn().Str("tenant", b.key.tenant).Int("events", len(dropped)).
		Msg("persist: events of seqs that timed out into gaps dropped; their sends were answered 503 and retry under new seqs")
	s.finish(dropped)
	return nil
}

// isolate handles recs that failed together with err, a refusal of their
// data (or, when exhausted, an error that outlasted persist.max_retries):
// a single event is dead-lettered at once with reason "rejected" and its
// seq recorded as a gap; a larger batch is halved and each half tried
// again, so k refused events among n cost about 2·k·log2(n) attempts and
// every other event is stored. It returns the records that failed
// otherwise (the database went away meanwhile), with that failure.
func (s *Service) isolate(ctx context.Context, key batchKey, recs []*record, err error, exhausted bool) (rest []*record, f failure, ferr error) {
	if len(recs) == 1 {
		s.deadLetter(ctx, recs, permanent.String(), err)
		return nil, permanent, nil
	}
	s.p.Log.Warn().Err(err).Str("tenant", key.tenant).Str("month", key.month.String()).
		Int("events", len(recs)).Msg("persist: batch refused; splitting it to find the events refused")
	mid := len(recs) / 2
	f = permanent
	for _, half := range [][]*record{recs[:mid:mid], recs[mid:]} {
		err := s.try(ctx, key, half)
		if err == nil {
			continue
		}
		hf := classify(ctx, err)
		switch {
		case hf == aborted:
			return nil, aborted, err
		case hf == fatal:
			s.deadLetter(ctx, half, hf.String(), err)
			continue
		case hf == permanent || (exhausted && hf == unclassified):
			var r []*record
			if r, hf, err = s.isolate(ctx, key, half, err, exhausted); len(r) == 0 {
				continue
			}
			half = r
		}
		if hf == aborted {
			return nil, aborted, err
		}
		rest, f, ferr = append(rest, half...), hf, err
	}
	return rest, f, ferr
}

// retryDelay is the wait before retry n (0-based): exponential from
// persist.retry_backoff up to retry_backoff_max, with jitter — a uniformly
// random half of it — so that writers that failed together (a deadlock, a
// database coming back) do not retry in lockstep.
func (s *Service) retryDelay(n int) time.Duration {
	d := backoff(s.p.Config.RetryBackoff, s.p.Config.RetryBackoffMax, n)
	return d/2 + rand.N(d/2+1)
}

// backoff doubles from base up to limit.
func backoff(base, limit time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d < limit; i++ {
		d *= 2
	}
	return min(max(d, time.Millisecond), max(limit, time.Millisecond))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// try makes one attempt: catalog check first, then
// the transaction, then the Redis follow-ups. Records are done when it
// returns nil.
func (s *Service) try(ctx context.Context, key batchKey, recs []*record) error {
	start := time.Now()
	table, status, err := s.p.Catalog.Table(ctx, key.tenant, key.month)
	if err != nil {
		return err
	}
	switch {
	case status.AcceptsWrites():
	case status == routing.StatusSealed || status == routing.StatusArchived:
		return s.compensate(ctx, key, recs, status)
	default:
		return fmt.Errorf("%w: %s is %s", errNotWritable, table.Name(), status)
	}
	db, err := s.p.DBs.DB(ctx, key.tenant)
	if err != nil {
		return err
	}
	neighbours, err := s.neighbours(ctx, key, recs)
	if err != nil {
		return err
	}
	// held from before the commit until the route merge (see routeMu); the
	// follow-up goroutine releases it
	s.routeMu.RLock()
	res, err := writeBatch(ctx, db, table, neighbours, loseOne(recs))
	if err != nil {
		s.routeMu.RUnlock()
		return err
	}
	s.committed()
	now := time.Now()
	for _, r := range res.inserted {
		s.m.latency.Observe(now.Sub(r.ts).Seconds())
	}
	s.m.batchSize.Observe(float64(len(recs)))
	s.m.batchTime.Observe(now.Sub(start).Seconds())
	// The Redis follow-ups run beside the next batch's transaction (the
	// writer slot is free once the DB committed); the records are done —
	// their offsets committable — only when the follow-ups are, so a crash
	// before then replays the batch and repeats them.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		repairs := s.afterCommit(ctx, key, res)
		// the merge is done: a repair may replace routes again (routeMu).
		// Only the durable repair queue is retried, and without the lock:
		// a tenant database gone right after the commit then holds back
		// this batch's offsets, not — through a repair waiting for the lock,
		// which blocks every later reader — every tenant's batches; and the
		// Redis steps are not repeated (a second merge would count twice).
		s.routeMu.RUnlock()
		for n := 0; len(repairs) > 0; n++ {
			err := s.enqueueRepairs(ctx, key, repairs, "redis follow-up after commit")
			if err == nil {
				break
			}
			s.p.Log.Warn().Err(err).Str("tenant", key.tenant).Msg("persist: queueing route repairs after commit failed; retrying")
			if !sleep(ctx, s.retryDelay(n)) {
				return // abandoned uncommitted: the batch comes again
			}
		}
		m := key.month.String()
		s.m.persisted.WithLabelValues(m, statusInserted).Add(float64(len(res.inserted)))
		s.m.persisted.WithLabelValues(m, statusReplayed).Add(float64(len(res.replayed)))
		s.m.persisted.WithLabelValues(m, statusDuplicate).Add(float64(len(res.dedup)))
		s.m.dedupHits.Add(float64(len(res.dedup)))
		s.finish(recs)
		s.touch(key.tenant)
		if s.p.OnBatch != nil {
			s.p.OnBatch(len(recs), time.Since(start))
		}
	}()
	return nil
}

// neighbours are the registered months either side of the batch's month
// that the cross-month dedup probes (store.go); archived months may be gone.
//
// The previous month is probed only if it was ever active (else no send
// allocated into it and it holds no rows) and the batch's oldest event was
// created within persist.dedup_retention of the moment it stopped being
// active: a retry after that is outside the dedup window, as a dedup row
// would have expired. So in steady
// state a month's batches probe nothing; in the week after a switch they
// pay one indexed read per event.
//
// The next month is probed only when the batch's month is older than the
// active month. While it is the active month, the next one has never been
// active, so no send allocated into it and it holds no rows; a retry that
// lands there after a switch comes later in the same partition, so its own
// batch runs after this one (scheduler) and finds this one's rows with its
// previous-month probe. If Redis does not answer, it is probed.
func (s *Service) neighbours(ctx context.Context, key batchKey, recs []*record) ([]routing.Table, error) {
	hist, err := s.history(ctx, key)
	if err != nil {
		return nil, err
	}
	var candidates []routing.Month
	if prev, ok := hist[key.month.Prev()]; ok && prev.ActivatedAt.Valid {
		oldest := recs[0].ev.CreatedAt.Time
		for _, r := range recs {
			if r.ev.CreatedAt.Before(oldest) {
				oldest = r.ev.CreatedAt.Time
			}
		}
		if !prev.DeactivatedAt.Valid || s.p.Config.DedupRetention <= 0 ||
			oldest.Before(prev.DeactivatedAt.Time.Add(s.p.Config.DedupRetention)) {
			candidates = append(candidates, key.month.Prev())
		}
	}
	if active, err := s.activeMonth(ctx, key.tenant); err != nil || key.month.Before(active) {
		candidates = append(candidates, key.month.Next())
	}
	var out []routing.Table
	for _, m := range candidates {
		sh, ok := hist[m]
		if !ok || sh.Status == routing.StatusArchived {
			continue
		}
		out = append(out, sh.Table)
	}
	return out, nil
}

// historyTTL is how long a tenant's catalog snapshot (activation times)
// serves the dedup decision; see history.
const historyTTL = 5 * time.Second

type shardHistory struct {
	at     time.Time
	shards map[routing.Month]routing.Shard
}

// history is the tenant's catalog with activation times. A snapshot that
// does not show the batch's month as activated predates that activation and
// is read again: months activate in order, so a snapshot that shows it also
// shows every activation of the month before.
func (s *Service) history(ctx context.Context, key batchKey) (map[routing.Month]routing.Shard, error) {
	s.histMu.Lock()
	h, ok := s.hist[key.tenant]
	s.histMu.Unlock()
	if ok && time.Since(h.at) < historyTTL && h.shards[key.month].ActivatedAt.Valid {
		return h.shards, nil
	}
	list, err := s.p.Catalog.List(ctx, key.tenant)
	if err != nil {
		return nil, err
	}
	h = shardHistory{at: time.Now(), shards: make(map[routing.Month]routing.Shard, len(list))}
	for _, sh := range list {
		h.shards[sh.Month] = sh
	}
	s.histMu.Lock()
	s.hist[key.tenant] = h
	s.histMu.Unlock()
	return h.shards, nil
}

// activeMonth is the tenant's active month as Redis holds it.
func (s *Service) activeMonth(ctx context.Context, tenant string) (routing.Month, error) {
	keys, err := s.p.KeySpace.Tenant(tenant)
	if err != nil {
		return routing.Month{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	v, err := s.p.Redis.Do(rctx, s.p.Redis.B().Get().Key(keys.ActiveMonth()).Build()).ToString()
	if err != nil {
		return routing.Month{}, err
	}
	return routing.ParseMonth(v)
}

// redisTimeout bounds the Redis follow-ups of a committed batch: a Redis
// outage sends the work to the repair queue instead of stalling persist.
const redisTimeout = 3 * time.Second

// afterCommit does the Redis follow-ups of a committed batch: routes
// (counting only rows this commit inserted), the pending set (invariant 12,
// docs/invariants.md) and the idempotency status. It returns the topics to
// queue in the durable repair queue: those whose steps failed, and those of
// a redelivered batch (rows already there), which may have lost these steps
// in a crash right after its commit — a repair rebuilds the route from the
// MySQL mirror.
//
// A batch is one tenant's, and all its keys share the tenant hash tag, so
// the three steps of every topic of the batch go in one round trip
// (routing.Routes.Settle: with 10,000 topics a 500-event batch touches
// ~500 topics — a few script calls, not 1,500 commands). The order per
// topic is kept, route merged, then pending cleared, then idempotency done,
// in one script run; if the call fails, every topic is repaired.
func (s *Service) afterCommit(ctx context.Context, key batchKey, res writeResult) []*topicRange {
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	inserted, replayed := res.ranges, topicRanges(res.replayed)
	repairs := slices.Clone(replayed)
	keys, err := s.p.KeySpace.Tenant(key.tenant)
	if err != nil {
		return append(repairs, inserted...)
	}
	settle := make([]routing.Settlement, 0, len(inserted)+len(replayed))
	for _, tr := range inserted {
		settle = append(settle, settlement(keys, tr, []routing.MonthRange{tr.MonthRange}))
	}
	// replayed topics are repaired anyway; clearing them now keeps readers
	// from waiting for the repair pass
	for _, tr := range replayed {
		settle = append(settle, settlement(keys, tr, nil))
	}
	if err := s.p.Routes.Settle(rctx, key.tenant, settle); err != nil {
		s.p.Log.Warn().Err(err).Str("tenant", key.tenant).Int("topics", len(inserted)).
			Msg("persist: redis follow-up failed; queued for repair")
		repairs = append(repairs, inserted...)
	}
	for _, r := range res.dedup {
		// the duplicate's seq will never hold a row: a known gap, so readers
		// do not wait for it, and abandoned, so its send is never answered
		// 201 after this
		if err := s.p.Flight.RecordDuplicate(rctx, key.tenant, r.ev.Topic, r.ev.SeqID); err != nil {
			s.p.Log.Warn().Err(err).Str("tenant", key.tenant).Msg("persist: record gap of a duplicate failed")
		}
	}
	// the duplicate's idempotency record is left as it is: it holds the
	// event of the dropped seq, which must not answer a retry as done — the
	// retry finds the seq a gap and the stored message through MySQL
	return repairs
}

// settlement is a topic's Redis follow-up: ranges merged into its route, its
// seqs out of the pending set, its records' idempotency done.
func settlement(keys routing.Keys, tr *topicRange, ranges []routing.MonthRange) routing.Settlement {
	st := routing.Settlement{Topic: tr.topic, Ranges: ranges, Seqs: make([]int64, len(tr.recs)), Idem: idemKeys(keys, tr.recs)}
	for i, r := range tr.recs {
		st.Seqs[i] = r.ev.SeqID
	}
	return st
}

// idemKeys are the send idempotency records of recs.
func idemKeys(keys routing.Keys, recs []*record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = keys.Idempotency(r.ev.Topic, int64(r.ev.FromUser), r.ev.ClientMsgID)
	}
	return out
}
