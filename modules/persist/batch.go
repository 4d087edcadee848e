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
// month table (seed 000 §5.2: 按 tenant + shard_month 分组批量写入).
type batchKey struct {
	tenant string
	month  routing.Month
}

type batch struct {
	key   batchKey
	recs  []*record
	since time.Time // when the first record joined: the linger runs from here
	first uint64    // admission order of its first record
}

// grouper accumulates records into batches by tenant + month; a batch is
// ready when it holds size records or its first record waited linger.
type grouper struct {
	size   int
	linger time.Duration
	open   map[batchKey]*batch
}

func newGrouper(size int, linger time.Duration) *grouper {
	return &grouper{size: size, linger: linger, open: map[batchKey]*batch{}}
}

// add puts r into its batch and returns the batch if that filled it.
func (g *grouper) add(r *record, now time.Time) *batch {
	k := batchKey{tenant: r.ev.Tenant, month: r.month}
	b := g.open[k]
	if b == nil {
		b = &batch{key: k, since: now, first: r.seq}
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
// when flush is set), oldest first.
func (g *grouper) due(now time.Time, flush bool) []*batch {
	return g.take(func(b *batch) bool { return flush || now.Sub(b.since) >= g.linger })
}

// before removes and returns the open batches of b's tenant that hold
// records admitted before b's first one, oldest first: they are queued ahead
// of b, so a tenant's months are written in the order Kafka delivered them
// (an original is stored before its retry across the boundary).
func (g *grouper) before(b *batch) []*batch {
	return g.take(func(o *batch) bool { return o.key.tenant == b.key.tenant && o.first < b.first })
}

func (g *grouper) take(pick func(*batch) bool) []*batch {
	var out []*batch
	for k, b := range g.open {
		if pick(b) {
			out = append(out, b)
			delete(g.open, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first < out[j].first })
	return out
}

// wait is how long until the next batch is due; ok is false with none open.
func (g *grouper) wait(now time.Time) (time.Duration, bool) {
	var first time.Time
	for _, b := range g.open {
		if first.IsZero() || b.since.Before(first) {
			first = b.since
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return max(0, g.linger-now.Sub(first)), true
}

// scheduler runs at most writers batches at once, and never two batches of
// one tenant for different months at the same time: the cross-month dedup
// probe of one would otherwise miss the other's uncommitted rows (an
// original and its retry across the boundary sit in the same partition, so
// within one process this ordering is all it takes; see store.go).
type scheduler struct {
	writers int
	queue   []*batch
	running int
	tenants map[string]tenantRun
}

type tenantRun struct {
	month routing.Month
	n     int
}

func newScheduler(writers int) *scheduler {
	return &scheduler{writers: max(1, writers), tenants: map[string]tenantRun{}}
}

func (s *scheduler) push(b *batch) { s.queue = append(s.queue, b) }

// next takes the first queued batch that may run now, in queue order; a
// batch never overtakes an older queued batch of its tenant.
func (s *scheduler) next() *batch {
	if s.running >= s.writers {
		return nil
	}
	var blocked map[string]bool
	for i, b := range s.queue {
		tr, busy := s.tenants[b.key.tenant]
		if blocked[b.key.tenant] || (busy && tr.month != b.key.month) {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[b.key.tenant] = true
			continue
		}
		s.queue = append(s.queue[:i], s.queue[i+1:]...)
		s.running++
		s.tenants[b.key.tenant] = tenantRun{month: b.key.month, n: tr.n + 1}
		return b
	}
	return nil
}

// done releases a batch taken by next.
func (s *scheduler) done(b *batch) {
	s.running--
	tr := s.tenants[b.key.tenant]
	if tr.n <= 1 {
		delete(s.tenants, b.key.tenant)
		return
	}
	tr.n--
	s.tenants[b.key.tenant] = tr
}

func (s *scheduler) idle() bool { return s.running == 0 && len(s.queue) == 0 }
