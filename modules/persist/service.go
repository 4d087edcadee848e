// Package persist is the Kafka → MySQL writer: a
// consumer group with manual commits that stores each event in the month
// table its shard_month names, exactly once in effect on an at-least-once
// log, then updates the Redis routes, the pending set and the idempotency
// status. Events it cannot store go to the dead-letter topic or, for a sealed
// month, to the compensation queue — never silently away.
package persist

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
)

// Params are what the persist role needs.
type Params struct {
	Config     config.Persist
	Kafka      config.Kafka // topic, dlq_topic, group
	KafkaConn  []kgo.Opt    // seed brokers, TLS, SASL
	DBs        routing.DBs
	Tenants    func() []string // configured tenants: the repair worker's first scan
	Redis      rueidis.Client
	KeySpace   routing.KeySpace // redis.key_prefix: where every key and channel is named
	Scripts    *routing.Scripts
	Catalog    *routing.Catalog
	Flight     *routing.Flight
	Routes     *routing.Routes
	Metrics    *routing.Metrics
	Log        zerolog.Logger
	Registerer prometheus.Registerer
	// Writers is how many batch transactions run at once (default 4).
	Writers int
	// OnBatch, if set, sees every stored batch: its size and how long it
	// took from dispatch to done — commit and Redis follow-ups (the
	// benchmark's p50/p99).
	OnBatch func(n int, d time.Duration)
}

// DefaultWriters is Params.Writers when unset.
const DefaultWriters = 4

// Service is one persist consumer.
type Service struct {
	p  Params
	m  *metrics
	cl *kgo.Client

	crashAfter int64       // test hook, see crash.go
	running    atomic.Bool // Run was called

	mu    sync.Mutex
	parts map[int32]*partOffsets // the current assignment of kafka.topic

	admitted uint64 // records admitted so far (poll goroutine only)

	// routeMu orders route updates: a batch holds it shared from before its
	// DB commit until its route merge is done; a repair holds it exclusively
	// while it reads the mirror and replaces the Redis route. So no merge of
	// a batch the repair's mirror read already includes can land after the
	// replace and count it twice. (A topic lives in one partition, owned by
	// one process, so this process-local lock is enough.)
	routeMu sync.RWMutex

	histMu sync.Mutex
	hist   map[string]shardHistory // tenant → catalog snapshot for the dedup probe

	touchMu sync.Mutex
	touched map[string]time.Time // tenant → last wake-up of its repair pass

	capMu     sync.Mutex
	capCond   *sync.Cond
	inflight  int // records polled and not yet done
	parked    int // of them, queued behind parked tenants
	maxIn     int // records in flight outside parked tenants
	maxParked int // records queued behind parked tenants

	in         chan []*record
	done       chan *batch
	commitKick chan struct{}
	dirty      chan string // tenants with possible repair work

	work       context.Context // batches run under it; cancelled to abandon them
	cancelWork context.CancelFunc
	finished   chan struct{}
	wg         sync.WaitGroup
}

// New builds the consumer; nothing is consumed until Run.
func New(p Params) (*Service, error) {
	if p.Writers <= 0 {
		p.Writers = DefaultWriters
	}
	if p.Config.MaxParked <= 0 {
		// unset (a caller that builds its own config): the default budget,
		// never a zero one that would stop polling for good
		p.Config.MaxParked = config.Default().Persist.MaxParked
	}
	s := &Service{
		p:          p,
		crashAfter: crashAfterFromEnv(),
		parts:      map[int32]*partOffsets{},
		touched:    map[string]time.Time{},
		hist:       map[string]shardHistory{},
		maxIn:      4 * p.Writers * p.Config.BatchSize,
		maxParked:  p.Config.MaxParked,
		in:         make(chan []*record),
		done:       make(chan *batch, p.Writers),
		commitKick: make(chan struct{}, 1),
		dirty:      make(chan string, 64),
		finished:   make(chan struct{}),
	}
	s.capCond = sync.NewCond(&s.capMu)
	s.m = newMetrics(p.Registerer, s.inFlight)
	if p.Tenants != nil {
		// at 0 from the start: the late-event alert sees the first as an increase
		for _, t := range p.Tenants() {
			s.m.lateEvents.WithLabelValues(t)
		}
	}
	s.work, s.cancelWork = context.WithCancel(context.Background())
	cl, err := kgo.NewClient(append(slices.Clone(p.KafkaConn),
		kgo.ConsumerGroup(p.Kafka.Group),
		kgo.ConsumeTopics(p.Kafka.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		// Polls and rebalances take turns: every polled record is tracked
		// before a revocation can run, so the revoke handler sees it.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
		// a member that died (kill -9, crash) holds its partitions until its
		// session expires: keep that short so a restarted or surviving
		// member takes over within seconds, not Kafka's default 45 s
		kgo.SessionTimeout(10*time.Second),
		// a member that dies in the middle of a rebalance is only dropped
		// when the rebalance timeout runs out: every other member of the
		// group stops consuming until then. Kafka's default (60 s) would
		// stall persistence for a minute; this is long enough for a
		// revocation to drain (revokeWait) and commit.
		kgo.RebalanceTimeout(rebalanceTimeout),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
	)...)
	if err != nil {
		return nil, fmt.Errorf("persist: kafka client: %w", err)
	}
	s.cl = cl
	return s, nil
}

// Run consumes until ctx ends, then stops polling, lets the batches in hand
// finish (Stop bounds how long), commits what completed and leaves the group.
func (s *Service) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("persist: Run called twice")
	}
	defer close(s.finished)
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); s.loop() }()
	commitCtx, stopCommit := context.WithCancel(context.Background())
	commitDone := make(chan struct{})
	go func() { defer close(commitDone); s.committer(commitCtx) }()
	repairDone := make(chan struct{})
	go func() { defer close(repairDone); s.repairLoop(ctx) }()
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); s.progressLoop(ctx) }()

	s.poll(ctx)
	// asked to finish: batches still retrying after drainTimeout are
	// abandoned uncommitted (their events come again on restart)
	abandon := time.AfterFunc(drainTimeout, func() { s.cancelWork(); s.capCond.Broadcast() })
	defer abandon.Stop()
	close(s.in)
	<-loopDone
	s.wg.Wait()
	stopCommit()
	<-commitDone
	<-repairDone
	<-progressDone
	finalCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	s.commit(finalCtx)
	cancel()
	s.cl.Close()
	s.cancelWork()
	return nil
}

// Stop waits for Run to drain (Run bounds that by drainTimeout itself);
// when ctx ends first the batches still retrying are abandoned uncommitted
// (their events come again on restart).
func (s *Service) Stop(ctx context.Context) error {
	if s.running.CompareAndSwap(false, true) {
		// never ran (the process failed to start): nothing to drain
		s.cancelWork()
		s.cl.Close()
		return nil
	}
	select {
	case <-s.finished:
		return nil
	case <-ctx.Done():
	case <-time.After(drainTimeout):
	}
	s.cancelWork()
	s.capCond.Broadcast()
	<-s.finished
	return nil
}

// drainTimeout bounds how long a stop waits for batches still retrying.
const drainTimeout = 10 * time.Second

func (s *Service) poll(ctx context.Context) {
	stop := context.AfterFunc(ctx, s.capCond.Broadcast)
	defer stop()
	for {
		if !s.waitCapacity(ctx) {
			return
		}
		fs := s.cl.PollRecords(ctx, s.p.Config.BatchSize*s.p.Writers)
		if fs.IsClientClosed() || ctx.Err() != nil {
			s.cl.AllowRebalance()
			return
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				s.p.Log.Warn().Err(err).Str("topic", topic).Int32("partition", p).Msg("persist: fetch error")
			}
		})
		recs := s.admit(fs)
		s.cl.AllowRebalance()
		if len(recs) == 0 {
			continue
		}
		s.in <- recs
	}
}

// admit tracks every polled record of a current assignment and decodes it.
func (s *Service) admit(fs kgo.Fetches) []*record {
	var out []*record
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		s.mu.Lock()
		po := s.parts[fp.Partition]
		s.mu.Unlock()
		if po == nil {
			return
		}
		lastOff := fp.Records[len(fp.Records)-1].Offset
		s.m.lag.WithLabelValues(strconv.Itoa(int(fp.Partition))).Set(float64(max(0, fp.HighWatermark-lastOff-1)))
		for _, kr := range fp.Records {
			if !po.admit(kr.Offset, kr.LeaderEpoch) {
				continue
			}
			s.admitted++
			r := &record{part: po, partition: kr.Partition, offset: kr.Offset, key: kr.Key, value: kr.Value,
				ts: kr.Timestamp, seq: s.admitted}
			r.ev, r.month, _ = DecodeEvent(kr.Value)
			out = append(out, r)
		}
	})
	s.capMu.Lock()
	s.inflight += len(out)
	s.capMu.Unlock()
	return out
}

// waitCapacity holds polling while too many records are in flight. Records
// queued behind parked tenants have a budget of their own
// (persist.max_parked): one tenant's outage does not use up the capacity the
// others flow through, until it has parked that many events — then polling
// waits for everyone, as memory is bounded.
func (s *Service) waitCapacity(ctx context.Context) bool {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	for (s.inflight-s.parked >= s.maxIn || s.parked >= s.maxParked) && ctx.Err() == nil && s.work.Err() == nil {
		s.m.pollPaused.Set(1)
		s.capCond.Wait()
	}
	s.m.pollPaused.Set(0)
	return ctx.Err() == nil && s.work.Err() == nil
}

// setParked publishes, when the scheduler's parked batches changed, the
// parked tenants and events: to the metrics, the polling budget and each
// partition (revocations do not wait for parked records). prev holds the
// partitions' counts published last; loop goroutine only.
func (s *Service) setParked(sch *scheduler, prev map[*partOffsets]int) {
	if !sch.changed {
		return
	}
	sch.changed = false
	tenants, byPart := sch.parked()
	events := 0
	for po, n := range byPart {
		events += n
		if prev[po] != n {
			po.setParked(n)
		}
	}
	for po := range prev {
		if _, ok := byPart[po]; !ok {
			po.setParked(0)
		}
	}
	clear(prev)
	maps.Copy(prev, byPart)
	s.m.parkedTenants.Set(float64(tenants))
	s.m.parkedEvents.Set(float64(events))
	s.capMu.Lock()
	changed := s.parked != events
	s.parked = events
	s.capMu.Unlock()
	if changed {
		s.capCond.Broadcast()
	}
}

// finish marks records done: their offsets may be committed.
func (s *Service) finish(recs []*record) {
	for _, r := range recs {
		r.part.complete(r.offset)
	}
	s.release(len(recs))
	select {
	case s.commitKick <- struct{}{}:
	default:
	}
}

// inFlight is the number of records polled and not yet done.
func (s *Service) inFlight() float64 {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	return float64(s.inflight)
}

// release returns capacity for records done or dropped.
func (s *Service) release(n int) {
	if n == 0 {
		return
	}
	s.capMu.Lock()
	s.inflight -= n
	s.capMu.Unlock()
	s.capCond.Broadcast()
}

// loop groups records into batches and hands them to writers; a batch that
// comes back with records to retry parks its tenant (scheduler).
func (s *Service) loop() {
	g := newGrouper(s.p.Config.BatchSize, s.p.Config.BatchLinger, s.p.Writers)
	sch := newScheduler(s.p.Writers)
	parked := map[*partOffsets]int{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// on return, parked tenants' batches are abandoned uncommitted: they
	// come again from the committed offsets
	in := s.in
	for {
		now := time.Now()
		for b := sch.next(now); b != nil; b = sch.next(now) {
			s.dispatch(sch, b)
		}
		s.setParked(sch, parked)
		if in == nil && sch.idle() {
			return
		}
		var due <-chan time.Time
		d, ok := g.wait(now, sch.holds)
		if w, waiting := sch.wake(now); waiting && (!ok || w < d) {
			d, ok = w, true
		}
		if ok {
			timer.Reset(d)
			due = timer.C
		}
		select {
		case recs, ok := <-in:
			if !ok {
				in = nil
				for _, b := range g.due(time.Now(), true, sch.holds) {
					sch.push(b)
				}
				continue
			}
			now := time.Now()
			for _, r := range recs {
				if r.ev == nil {
					s.wg.Add(1)
					go func() {
						defer s.wg.Done()
						_, _, err := DecodeEvent(r.value)
						s.deadLetter(s.work, []*record{r}, reasonMalformed, err)
					}()
					continue
				}
				if b := g.add(r, now); b != nil {
					for _, o := range g.before(b) {
						sch.push(o)
					}
					sch.push(b)
				}
			}
		case <-due:
			for _, b := range g.due(time.Now(), false, sch.holds) {
				sch.push(b)
			}
		case b := <-s.done:
			sch.done(b)
			s.settle(sch, b)
		}
	}
}

// settle parks the tenant of a batch that left records to retry, or resumes
// a parked tenant whose probe went through.
func (s *Service) settle(sch *scheduler, b *batch) {
	k := b.key
	if len(b.retry) == 0 || b.fail == aborted || s.work.Err() != nil {
		if sch.resume(b) {
			s.p.Log.Info().Str("tenant", k.tenant).Msg("persist: tenant resumed")
		}
		return
	}
	b.recs, b.retry = b.retry, nil
	delay := s.retryDelay
	if b.fail == moved {
		delay = func(int) time.Duration { return movedRetry }
	}
	d, fails := sch.park(b, time.Now(), delay)
	s.m.retries.WithLabelValues(b.fail.String()).Inc()
	s.m.persisted.WithLabelValues(k.month.String(), statusRetry).Add(float64(len(b.recs)))
	// a warning when the tenant is parked and every parkedLogEvery
	// failures after (a move's switch retries every 100 ms); the rest at
	// debug, counted in imshard_persist_retries_total
	ev := s.p.Log.Debug()
	if fails == 1 || fails%parkedLogEvery == 0 {
		ev = s.p.Log.Warn()
	}
	ev.Err(b.err).Str("tenant", k.tenant).Str("month", k.month.String()).Int("events", len(b.recs)).
		Str("reason", b.fail.String()).Int("failures", fails).Dur("retry_in", d).Msg("persist: batch failed; tenant parked, others proceed")
}

// parkedLogEvery is how many failures of a parked tenant pass between two
// warnings about it.
const parkedLogEvery = 100

func (s *Service) dispatch(sch *scheduler, b *batch) {
	kept := b.recs[:0]
	for _, r := range b.recs {
		if !r.part.isRevoked() {
			kept = append(kept, r)
		}
	}
	s.release(len(b.recs) - len(kept))
	b.recs = kept
	if len(kept) == 0 {
		sch.done(b)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.process(s.work, b)
		s.done <- b
	}()
}

// assigned starts tracking newly assigned partitions.
func (s *Service) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range m[s.p.Kafka.Topic] {
		s.parts[p] = newPartOffsets()
	}
	s.p.Log.Info().Ints32("partitions", m[s.p.Kafka.Topic]).Msg("persist: partitions assigned")
}

// revoked runs before partitions move to another member: the batches that
// hold their records get a bounded time to finish (records parked behind a
// tenant that waits for a retry are not waited for), the completed prefix
// is committed, and whatever is left is abandoned uncommitted — the new
// owner reprocesses it, and the unique keys make that a no-op.
func (s *Service) revoked(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	parts := s.detach(m)
	deadline := time.Now().Add(revokeWait)
	for _, po := range parts {
		for po.pending() > 0 && time.Now().Before(deadline) && ctx.Err() == nil && s.work.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	s.commitParts(ctx, parts)
	for _, po := range parts {
		po.revoke()
	}
}

// revokeWait bounds how long a revocation waits for in-flight batches; it
// is well inside the group's rebalance timeout, which leaves the commit
// that follows it time to finish.
const (
	revokeWait       = 15 * time.Second
	rebalanceTimeout = 25 * time.Second
)

// lost partitions cannot be committed any more: abandon them.
func (s *Service) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	for _, po := range s.detach(m) {
		po.revoke()
	}
}

func (s *Service) detach(m map[string][]int32) map[int32]*partOffsets {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int32]*partOffsets{}
	for _, p := range m[s.p.Kafka.Topic] {
		if po := s.parts[p]; po != nil {
			out[p] = po
			delete(s.parts, p)
		}
		// the partition's lag is its new owner's to report
		s.m.lag.DeleteLabelValues(strconv.Itoa(int(p)))
	}
	return out
}

// committer commits the completed prefixes shortly after batches finish.
func (s *Service) committer(ctx context.Context) {
	t := time.NewTicker(commitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.commitKick:
		case <-t.C:
		}
		s.commit(ctx)
		// one commit per interval at most, however many batches finish
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

const commitInterval = 100 * time.Millisecond

func (s *Service) commit(ctx context.Context) {
	s.mu.Lock()
	parts := make(map[int32]*partOffsets, len(s.parts))
	for p, po := range s.parts {
		parts[p] = po
	}
	s.mu.Unlock()
	s.commitParts(ctx, parts)
}

// commitParts commits, for each partition, one past its contiguous completed
// prefix — never past a record that is still being written.
func (s *Service) commitParts(ctx context.Context, parts map[int32]*partOffsets) {
	offsets := map[int32]kgo.EpochOffset{}
	for p, po := range parts {
		if next, epoch, ok := po.toCommit(); ok {
			offsets[p] = kgo.EpochOffset{Epoch: epoch, Offset: next}
		}
	}
	if len(offsets) == 0 {
		return
	}
	s.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{s.p.Kafka.Topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				s.p.Log.Warn().Err(err).Msg("persist: offset commit failed; will retry")
				return
			}
			for _, t := range resp.Topics {
				for _, pr := range t.Partitions {
					if err := kerr.ErrorForCode(pr.ErrorCode); err != nil {
						s.p.Log.Warn().Err(err).Int32("partition", pr.Partition).Msg("persist: offset commit refused; will retry")
						continue
					}
					if po := parts[pr.Partition]; po != nil {
						po.markCommitted(offsets[pr.Partition].Offset)
					}
				}
			}
		})
}
