package persist

import (
	"sort"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// record is one polled Kafka record on its way to a month table.
type record struct {
	part      *partOffsets
	partition int32
	offset    int64
	key       []byte
	value     []byte
	ts        time.Time // the Kafka record timestamp: persist latency starts here
	ev        *message.Event
	month     routing.Month
	seq       uint64 // admission order in this process
}

// batchKey is what one transaction may cover: one tenant database, one
// month table.
type batchKey struct {
	tenant string
	month  routing.Month
}

type batch struct {
	key     batchKey
	stripes uint64 // the topic stripes its records belong to (stripeOf), one bit each
	recs    []*record
	since   time.Time // when the first record joined: the linger runs from here
	first   uint64    // admission order of its first record

	// set by the scheduler and process for a batch that ran
	probe    bool      // dispatched as its parked tenant's probe
	attempts int       // failed attempts of a class with a limit (missing table, unclassified)
	retry    []*record // what the attempt left to retry (nil: all done)
	fail     failure   // why, when retry is set
	err      error     // the error, when retry is set
}

// maxStripes bounds the topic stripes (a batch holds them as bits of a
// uint64).
const maxStripes = 64

// stripeOf is the stripe of a topic among n: a topic is always in the same
// one (FNV-1a of its name).
func stripeOf(topic string, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(topic); i++ {
		h ^= uint32(topic[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// openKey is where the grouper collects records: a tenant, a month and a
// topic stripe.
type openKey struct {
	batchKey
	stripe int
}

// grouper accumulates records into batches by tenant + month; a batch is
// ready when it holds size records or its first record waited linger.
//
// Within a tenant + month the records are kept apart by topic stripe, so
// that the batches a busy tenant fills run side by side on disjoint topics:
// two transactions that upsert the same topic's mirror row wait for each
// other's commit (a row lock held through the fsync), and with a few hundred
// topics per batch almost any two batches of one tenant share some. When the
// linger ends, the stripes' partial batches of a tenant + month are joined
// again into as few batches as size allows, so a quiet tenant still writes
// one transaction per linger.
type grouper struct {
	size    int
	linger  time.Duration
	stripes int
	open    map[openKey]*batch
}

func newGrouper(size int, linger time.Duration, stripes int) *grouper {
	return &grouper{size: size, linger: linger, stripes: min(max(stripes, 1), maxStripes), open: map[openKey]*batch{}}
}

// add puts r into its batch and returns the batch if that filled it.
func (g *grouper) add(r *record, now time.Time) *batch {
	stripe := stripeOf(r.ev.Topic, g.stripes)
	k := openKey{batchKey{tenant: r.ev.Tenant, month: r.month}, stripe}
	b := g.open[k]
	if b == nil {
		b = &batch{key: k.batchKey, stripes: 1 << stripe, since: now, first: r.seq}
		g.open[k] = b
	}
	b.recs = append(b.recs, r)
	if len(b.recs) >= g.size {
		delete(g.open, k)
		return b
	}
	return nil
}

// due removes and returns the batches whose linger has passed (all of them
// when flush is set), oldest first. The linger of a tenant + month runs from
// its oldest record: once it has passed, every stripe's batch of it is due.
// A tenant that holds is left to fill its batches (scheduler.holds).
func (g *grouper) due(now time.Time, flush bool, holds func(tenant string) bool) []*batch {
	var expired map[batchKey]bool
	for _, b := range g.open {
		if flush || (now.Sub(b.since) >= g.linger && !holds(b.key.tenant)) {
			if expired == nil {
				expired = map[batchKey]bool{}
			}
			expired[b.key] = true
		}
	}
	return g.take(func(b *batch) bool { return expired[b.key] })
}

// before removes and returns the open batches of b's tenant for other
// months that hold records admitted before b's first one, oldest first:
// they are queued ahead of b, so a tenant's months are written in the order
// Kafka delivered them (an original is stored before its retry across the
// boundary).
func (g *grouper) before(b *batch) []*batch {
	return g.take(func(o *batch) bool {
		return o.key.tenant == b.key.tenant && o.key.month != b.key.month && o.first < b.first
	})
}

// take removes the open batches pick selects and joins each tenant +
// month's into as few as size allows, oldest first.
func (g *grouper) take(pick func(*batch) bool) []*batch {
	var picked []*batch
	for k, b := range g.open {
		if pick(b) {
			picked = append(picked, b)
			delete(g.open, k)
		}
	}
	sort.Slice(picked, func(i, j int) bool { return picked[i].first < picked[j].first })
	var out []*batch
	into := map[batchKey]*batch{} // the batch of each key still taking stripes
	for _, b := range picked {
		j := into[b.key]
		if j == nil || len(j.recs)+len(b.recs) > g.size {
			into[b.key] = b
			out = append(out, b)
			continue
		}
		j.recs = append(j.recs, b.recs...)
		j.stripes |= b.stripes
		j.since = minTime(j.since, b.since)
	}
	return out
}

// wait is how long until the next batch is due; ok is false with none open
// but those of tenants that hold.
func (g *grouper) wait(now time.Time, holds func(tenant string) bool) (time.Duration, bool) {
	var first time.Time
	for _, b := range g.open {
		if (first.IsZero() || b.since.Before(first)) && !holds(b.key.tenant) {
			first = b.since
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return max(0, g.linger-now.Sub(first)), true
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// scheduler runs at most writers batches at once, and never two batches of
// one tenant for different months at the same time: the cross-month dedup
// probe of one would otherwise miss the other's uncommitted rows (an
// original and its retry across the boundary sit in the same partition, so
// within one process this ordering is all it takes; see store.go). Nor does
// it run two batches of one tenant that share a topic stripe (grouper): a
// tenant's concurrent batches touch disjoint topics, so none waits on
// another's mirror rows, and a topic's batches are stored in turn.
//
// A tenant whose batch failed and must be retried is parked: its batches
// stay queued (uncommitted) while every other tenant's run, and once its
// backoff has passed one batch — the one that failed, first in its queue —
// runs as a probe. The probe's success resumes the tenant; its failure
// parks it again with a longer backoff. So a tenant whose database is down
// costs one writer per backoff period, not every writer for as long as the
// outage lasts.
type scheduler struct {
	writers int
	queue   []*batch
	running int
	tenants map[string]tenantRun
	lanes   map[string]*lane // parked tenants
	changed bool             // the parked batches changed since parked() was read
}

type tenantRun struct {
	month   routing.Month
	n       int
	stripes uint64 // of its running batches
}

// lane is a parked tenant's retry state.
type lane struct {
	until   time.Time // its probe may run from then on
	fails   int       // consecutive failed attempts: the backoff's exponent
	probing bool      // its probe is running
}

func newScheduler(writers int) *scheduler {
	return &scheduler{writers: max(1, writers), tenants: map[string]tenantRun{}, lanes: map[string]*lane{}}
}

func (s *scheduler) push(b *batch) {
	s.queue = append(s.queue, b)
	if s.lanes[b.key.tenant] != nil {
		s.changed = true
	}
}

// next takes the first queued batch that may run at now, in queue order; a
// batch never overtakes an older queued batch of its tenant that waits for
// another month or a parked tenant's backoff (it may overtake one of the
// same month that waits for a stripe: their topics differ), and a parked
// tenant runs only its probe, once its backoff has passed.
func (s *scheduler) next(now time.Time) *batch {
	if s.busy() {
		return nil
	}
	var blocked map[string]bool
	for i, b := range s.queue {
		t := b.key.tenant
		tr, busy := s.tenants[t]
		l := s.lanes[t]
		if blocked[t] || (busy && tr.month != b.key.month) || (l != nil && (l.probing || now.Before(l.until))) {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[t] = true
			continue
		}
		if tr.stripes&b.stripes != 0 {
			continue
		}
		if l != nil {
			l.probing, b.probe = true, true
			s.changed = true
		}
		s.queue = append(s.queue[:i], s.queue[i+1:]...)
		s.running++
		s.tenants[t] = tenantRun{month: b.key.month, n: tr.n + 1, stripes: tr.stripes | b.stripes}
		return b
	}
	return nil
}

// done releases a batch taken by next (a parked tenant's probe included:
// park or resume says what follows it).
func (s *scheduler) done(b *batch) {
	s.running--
	if l := s.lanes[b.key.tenant]; l != nil && b.probe {
		l.probing = false
	}
	tr := s.tenants[b.key.tenant]
	if tr.n <= 1 {
		delete(s.tenants, b.key.tenant)
		return
	}
	tr.n--
	tr.stripes &^= b.stripes
	s.tenants[b.key.tenant] = tr
}

// park queues b (done, with records left to retry) ahead of its tenant's
// other batches and parks the tenant for delay(n), n its consecutive
// failures so far; it returns the delay and the failures now (1: the
// tenant was not parked before).
func (s *scheduler) park(b *batch, now time.Time, delay func(n int) time.Duration) (time.Duration, int) {
	l := s.lanes[b.key.tenant]
	if l == nil {
		l = &lane{}
		s.lanes[b.key.tenant] = l
	}
	d := delay(l.fails)
	l.fails++
	s.changed = true
	l.until = now.Add(d)
	b.probe = false
	s.queue = append([]*batch{b}, s.queue...)
	return d, l.fails
}

// resume ends the tenant's parking when b, its probe, succeeded; it reports
// whether it did.
func (s *scheduler) resume(b *batch) bool {
	if !b.probe || s.lanes[b.key.tenant] == nil {
		return false
	}
	b.probe = false
	delete(s.lanes, b.key.tenant)
	s.changed = true
	return true
}

// wake is how long until the next parked tenant's backoff ends; ok is false
// when none is still to end. (A probe whose backoff has ended and that next
// did not take waits for a writer or its tenant's other month: a batch's
// end wakes the loop then.)
func (s *scheduler) wake(now time.Time) (d time.Duration, ok bool) {
	for _, l := range s.lanes {
		if l.probing || !l.until.After(now) {
			continue
		}
		if w := l.until.Sub(now); !ok || w < d {
			d, ok = w, true
		}
	}
	return d, ok
}

// parked is how many tenants are parked and how many events wait queued
// behind them, by partition.
func (s *scheduler) parked() (tenants int, events map[*partOffsets]int) {
	events = map[*partOffsets]int{}
	for _, b := range s.queue {
		if s.lanes[b.key.tenant] != nil {
			for _, r := range b.recs {
				events[r.part]++
			}
		}
	}
	return len(s.lanes), events
}

// busy reports that every writer runs a batch.
func (s *scheduler) busy() bool { return s.running >= s.writers }

// holds reports that the tenant's part-full batches should keep filling
// past the linger: every writer is busy, some with this tenant's batches,
// so a batch of it could only queue — a busy tenant's batches stay full.
// A tenant with nothing running (a quiet one, or a parked one) does not
// hold: its batch queues at the linger and is not kept behind a busy
// tenant's. A batch's end wakes the loop, which asks again.
func (s *scheduler) holds(tenant string) bool {
	_, running := s.tenants[tenant]
	return running && s.busy()
}

// idle reports that no batch runs; after next returned nil, whatever is
// still queued belongs to parked tenants.
func (s *scheduler) idle() bool { return s.running == 0 }
