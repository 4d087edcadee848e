package routing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"
)

const reservationsTable = "im_seq_reservations"

// Allocation is what one Lua call hands out: the topic's next seq and the
// month it is frozen to (invariant 2, docs/invariants.md).
type Allocation struct {
	Seq   int64
	Month Month
}

// Errors of activation; `shard activate` prints them as the reason.
var (
	ErrMonthNotWritable = errors.New("month table is not writable")
	ErrMonthInFuture    = errors.New("month is after the Redis-time month")
	ErrMonthOlder       = errors.New("month is older than the active month")
)

// AllocatorParams wires an Allocator.
type AllocatorParams struct {
	Redis       rueidis.Client
	KeySpace    KeySpace
	DBs         DBs
	Catalog     *Catalog
	Scripts     *Scripts
	Metrics     *Metrics
	Log         zerolog.Logger
	AutoAdvance bool  // shard.auto_advance
	ReserveStep int64 // send.seq_reserve_step
}

// Allocator hands out (seq, month) pairs. The fast path is one FCALL; the
// slow paths — recovering a lost active month, recording a month switch,
// seeding a lost counter, extending the durable reservation — touch MySQL
// and then retry the script.
type Allocator struct {
	p     AllocatorParams
	clock Clock

	inflight sync.Map // tenant/topic → struct{}: one background reservation each

	// background reservations run under ctx, which Close cancels; closed
	// (under mu) keeps a reservation from starting once Close waits
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// NewAllocator builds an allocator; Close waits for background reservations.
func NewAllocator(p AllocatorParams) *Allocator {
	if p.ReserveStep <= 0 {
		p.ReserveStep = 1000
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Allocator{p: p, clock: NewClock(p.Redis), ctx: ctx, cancel: cancel}
}

// Close stops new background reservations, cancels running ones and waits
// for them.
func (a *Allocator) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
}

// maxSlowPaths bounds the retries of one allocation: each slow path fixes one
// cause, and there are five.
const maxSlowPaths = 10

// Allocate returns the next seq of topic and the tenant's active month.
func (a *Allocator) Allocate(ctx context.Context, tenant, topic string) (Allocation, error) {
	if err := ValidTopic(topic); err != nil {
		return Allocation{}, err
	}
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return Allocation{}, err
	}
	args, ks := a.Args(), keys.alloc(topic)
	for range maxSlowPaths {
		reply, err := a.p.Scripts.Fenced.Alloc(ctx, a.p.Redis, ks, args).ToArray()
		if err != nil {
			return Allocation{}, fmt.Errorf("alloc: %w", err)
		}
		status, err := reply[0].AsInt64()
		if err != nil {
			return Allocation{}, fmt.Errorf("alloc: reply: %w", err)
		}
		if status == 0 {
			return a.Allocated(tenant, topic, reply)
		}
		if err := a.Resolve(ctx, tenant, topic, status, reply); err != nil {
			return Allocation{}, err
		}
	}
	return Allocation{}, fmt.Errorf("alloc: %s/%s: no allocation after %d slow paths", tenant, topic, maxSlowPaths)
}

// Args are the allocation's arguments (auto_advance, low-water distance),
// as the library's alloc and send functions take them after their own.
func (a *Allocator) Args() []string {
	auto := "0"
	if a.p.AutoAdvance {
		auto = "1"
	}
	return []string{auto, strconv.FormatInt(a.p.ReserveStep/2, 10)}
}

// Resolve does what an allocation reply with a non-zero status asks (see
// lua/fenced.lua, alloc): recover the active month, activate a due month,
// seed a lost counter, reserve the next step, or rebuild the migration gate
// — all through MySQL — so that the caller can call again. A gate that
// refuses sends is converged with MySQL first (a command that moved the
// state may have died before it opened the gate again): the send is
// refused with the state MySQL holds, or the caller calls again.
func (a *Allocator) Resolve(ctx context.Context, tenant, topic string, status int64, reply []rueidis.RedisMessage) error {
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	switch status {
	case 1:
		a.p.Metrics.AllocRetries.WithLabelValues("recover").Inc()
		_, err := a.RecoverActive(ctx, tenant)
		return err
	case 2:
		a.p.Metrics.AllocRetries.WithLabelValues("advance").Inc()
		s, _ := reply[1].ToString()
		m, err := ParseMonth(s)
		if err != nil {
			return fmt.Errorf("alloc: ready month %q: %w", s, err)
		}
		if err := a.Activate(ctx, tenant, m, "auto"); err != nil && !errors.Is(err, ErrMonthOlder) {
			return err
		}
		return nil
	case 3:
		a.p.Metrics.AllocRetries.WithLabelValues("seed").Inc()
		return a.seed(ctx, tenant, topic, keys)
	case 4:
		a.p.Metrics.AllocRetries.WithLabelValues("reserve").Inc()
		hw, _ := reply[1].AsInt64()
		return a.reserve(ctx, tenant, topic, keys, hw)
	case allocGateShut, allocGateUnknown:
		a.p.Metrics.AllocRetries.WithLabelValues("migration_gate").Inc()
		db, err := a.p.DBs.DB(ctx, tenant)
		if err != nil {
			return err
		}
		st, err := ConvergeMigrationGate(ctx, a.p.Redis, a.p.Scripts.Fenced, a.p.KeySpace, db, tenant)
		if err != nil {
			return err
		}
		if st.RefusesSends() {
			return &ErrMigrationPending{State: st}
		}
		return nil
	}
	return fmt.Errorf("alloc: unknown status %d", status)
}

// Allocated reads an allocation reply of status 0 ({0, seq, month, ask, …})
// and starts the reservation ahead it asks for.
func (a *Allocator) Allocated(tenant, topic string, reply []rueidis.RedisMessage) (Allocation, error) {
	seq, err := reply[1].AsInt64()
	if err != nil {
		return Allocation{}, fmt.Errorf("alloc: seq: %w", err)
	}
	ms, _ := reply[2].ToString()
	m, err := ParseMonth(ms)
	if err != nil {
		return Allocation{}, fmt.Errorf("alloc: active month %q in Redis: %w", ms, err)
	}
	if ask, _ := reply[3].AsInt64(); ask > 0 {
		a.reserveAhead(tenant, topic, ask)
	}
	return Allocation{Seq: seq, Month: m}, nil
}

// reserveAhead extends the reservation in the background before it runs
// out, so the synchronous MySQL round trip stays off the hot path.
func (a *Allocator) reserveAhead(tenant, topic string, hw int64) {
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return
	}
	id := tenant + "/" + topic
	if _, busy := a.inflight.LoadOrStore(id, struct{}{}); busy {
		return
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		a.inflight.Delete(id)
		return
	}
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		defer a.inflight.Delete(id)
		if err := a.reserve(a.ctx, tenant, topic, keys, hw); err != nil {
			a.p.Log.Warn().Err(err).Str("tenant", tenant).Str("topic", topic).Msg("background seq reservation failed; the next allocation past the high-water retries it")
		}
	}()
}

// reserveMovedWait bounds how long a reservation refused by the tenant's
// placement fence waits for the switch to end (a switch holds writes about
// a second, and the process follows the new placement within
// mysql.placement_poll); reserveMovedRetry is the pause between attempts.
const (
	reserveMovedWait  = 5 * time.Second
	reserveMovedRetry = 50 * time.Millisecond
)

// reserve raises the durable high-water to observed+step in MySQL, then in
// Redis. GREATEST keeps it monotonic and makes concurrent reservations from
// the same observation collapse into one step. A reservation refused by the
// fence (a move's switch) is tried again, on the pool of the placement the
// process follows by then, for up to reserveMovedWait: the send that needs
// it waits out the switch instead of failing, and the fence still lets
// nothing through to the source.
func (a *Allocator) reserve(ctx context.Context, tenant, topic string, keys Keys, observed int64) error {
	want := observed + a.p.ReserveStep
	var db *sql.DB
	write := func() error {
		var err error
		if db, err = a.p.DBs.DB(ctx, tenant); err != nil {
			return err
		}
		return Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := sq.Insert(reservationsTable).Columns("topic", "reserved_hi").Values(topic, want).
				Suffix("ON DUPLICATE KEY UPDATE reserved_hi = GREATEST(reserved_hi, VALUES(reserved_hi))").
				RunWith(tx).ExecContext(ctx)
			return err
		})
	}
	if err := waitMoved(ctx, write); err != nil {
		a.p.Metrics.SeqReserve.WithLabelValues("error").Inc()
		return fmt.Errorf("alloc: reserve %s/%s: %w", tenant, topic, err)
	}
	hi, err := reservedHi(ctx, db, topic)
	if err != nil {
		return err
	}
	a.p.Metrics.SeqReserve.WithLabelValues("ok").Inc()
	if err := a.p.Scripts.Fenced.Extend(ctx, a.p.Redis, keys.seqState(topic),
		[]string{strconv.FormatInt(hi, 10)}).Error(); err != nil {
		return fmt.Errorf("alloc: extend %s/%s: %w", tenant, topic, err)
	}
	return nil
}

// seed restores a lost or stale counter at the durable high-water
// (seedCounter) before the send calls again.
func (a *Allocator) seed(ctx context.Context, tenant, topic string, keys Keys) error {
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	hi, err := reservedHi(ctx, db, topic)
	if err != nil {
		return err
	}
	n, err := seedCounter(ctx, a.p.Redis, a.p.Scripts.Fenced, db, a.p.Metrics, topic, keys, hi)
	if err != nil {
		return fmt.Errorf("alloc: seed %s/%s: %w", tenant, topic, err)
	}
	if n > 0 && hi > 0 {
		a.p.Log.Warn().Str("tenant", tenant).Str("topic", topic).Int64("resume_above", hi).
			Msg("seq counter was lost in Redis; resumed above the durable reservation")
	}
	return nil
}

// seedCounter restores a lost or stale counter at the durable high-water
// hi: every seq ever handed out is at or below it, so the topic resumes
// above all of them (a forward jump, never a repeat). The same call fences
// the seqs from the first one MySQL does not prove stored up to the new
// counter (lua/fenced.lua, seed): their pending entries were lost with the
// counter, and some may still be on their way through Kafka (invariant 12,
// docs/invariants.md). The proof is read before the call, so it can only
// be older than the call: the fence can only start lower than it must.
// A send runs it (Allocator) and so does a reader that finds no counter
// (Flight.BoundResolve): the fence's lift is what records the gaps lost
// with Redis, and a topic nobody sends to must get it too. It returns the
// script's reply (2 seeded and fenced, 1 seeded, 0 already seeded);
// metrics nil counts nothing.
func seedCounter(ctx context.Context, rdb rueidis.Client, lib *FencedLib, db sq.BaseRunner, metrics *Metrics, topic string, keys Keys, hi int64) (int64, error) {
	ranges, err := LoadMirror(ctx, db, topic)
	if err != nil {
		return 0, err
	}
	// seqs at or below a migration's cutover are the legacy table's: none
	// of them ever went through Kafka, so none is fenced
	cut, err := CutoverSeq(ctx, db, topic)
	if err != nil {
		return 0, err
	}
	// seqs below the retention floor were issued once, whatever is left
	floor, err := LoadFloor(ctx, db, topic)
	if err != nil {
		return 0, err
	}
	from := max(MirrorBoundAbove(ranges, floor).Settled, cut) + 1
	n, err := lib.Seed(ctx, rdb, append(keys.seqState(topic), keys.Pending(topic)),
		[]string{strconv.FormatInt(hi, 10), strconv.FormatInt(from, 10)}).AsInt64()
	if err != nil {
		return 0, err
	}
	if metrics != nil {
		if n == 2 {
			metrics.SeqFences.WithLabelValues(fenceRaised).Inc()
		}
		if n > 0 && hi > 0 {
			metrics.SeqResumed.Inc()
		}
	}
	return n, nil
}

func reservedHi(ctx context.Context, db sq.BaseRunner, topic string) (int64, error) {
	var hi int64
	err := sq.Select("reserved_hi").From(reservationsTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&hi)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("alloc: read reservation of %s: %w", topic, err)
	}
	return hi, nil
}

// ReservedHi is the durable seq high-water of a topic (0 if none yet).
func (a *Allocator) ReservedHi(ctx context.Context, tenant, topic string) (int64, error) {
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return 0, err
	}
	return reservedHi(ctx, db, topic)
}

// RaiseReservations lifts the durable high-water of every topic that has a
// reservation, or a seq in issued, to its highest known seq plus margin —
// the restore of a tenant database from a dump, whose reservations are as old
// as the dump while seqs went on being handed out (and, for topics created
// since, recorded nowhere in it). It only ever raises (GREATEST), so running
// it twice is harmless. It returns the high-water of each topic.
func (a *Allocator) RaiseReservations(ctx context.Context, tenant string, issued map[string]int64, margin int64) (map[string]int64, error) {
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := sq.Select("topic", "reserved_hi").From(reservationsTable).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("alloc: read reservations: %w", err)
	}
	hi := map[string]int64{}
	for rows.Next() {
		var topic string
		var v int64
		if err := rows.Scan(&topic, &v); err != nil {
			_ = rows.Close()
			return nil, fmt.Errorf("alloc: read reservations: %w", err)
		}
		hi[topic] = v
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("alloc: read reservations: %w", err)
	}
	for topic, seq := range issued {
		if err := ValidTopic(topic); err != nil {
			return nil, err
		}
		hi[topic] = max(hi[topic], seq)
	}
	topics := make([]string, 0, len(hi))
	for topic := range hi {
		hi[topic] += margin
		topics = append(topics, topic)
	}
	slices.Sort(topics)
	const chunk = 500
	for lo := 0; lo < len(topics); lo += chunk {
		ins := sq.Insert(reservationsTable).Columns("topic", "reserved_hi")
		for _, topic := range topics[lo:min(lo+chunk, len(topics))] {
			ins = ins.Values(topic, hi[topic])
		}
		if err := Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := ins.Suffix("ON DUPLICATE KEY UPDATE reserved_hi = GREATEST(reserved_hi, VALUES(reserved_hi))").
				RunWith(tx).ExecContext(ctx)
			return err
		}); err != nil {
			return nil, fmt.Errorf("alloc: raise reservations of %s: %w", tenant, err)
		}
	}
	return hi, nil
}

// ResetCounters drops the Redis seq counters of topics (with their
// reservation, and the high-water and stamp of the layout before), so that each re-seeds at its durable reservation
// on its next allocation — after RaiseReservations lifted it above seqs
// handed out elsewhere (a migration's cutover from the legacy table).
func (a *Allocator) ResetCounters(ctx context.Context, tenant string, topics []string) error {
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	const chunk = 300
	for lo := 0; lo < len(topics); lo += chunk {
		var del []string
		for _, topic := range topics[lo:min(lo+chunk, len(topics))] {
			if err := ValidTopic(topic); err != nil {
				return err
			}
			del = append(del, keys.seqState(topic)...)
		}
		if err := a.p.Redis.Do(ctx, a.p.Redis.B().Del().Key(del...).Build()).Error(); err != nil {
			return fmt.Errorf("alloc: reset counters of %s: %w", tenant, err)
		}
	}
	return nil
}

// MarkReady tells Redis that m's table is writable, so allocation may move to
// it. The shard manager calls it once the table exists and is registered.
func (a *Allocator) MarkReady(ctx context.Context, tenant string, months ...Month) error {
	if len(months) == 0 {
		return nil
	}
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	cmd := a.p.Redis.B().Zadd().Key(keys.ReadyMonths()).ScoreMember()
	for _, m := range months {
		cmd = cmd.ScoreMember(float64(m.Int()), m.String())
	}
	if err := a.p.Redis.Do(ctx, cmd.Build()).Error(); err != nil {
		return fmt.Errorf("mark ready %s: %w", tenant, err)
	}
	return nil
}

// ActiveMonth reads the tenant's active month from Redis (zero if unset).
func (a *Allocator) ActiveMonth(ctx context.Context, tenant string) (Month, error) {
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return Month{}, err
	}
	s, err := a.p.Redis.Do(ctx, a.p.Redis.B().Get().Key(keys.ActiveMonth()).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return Month{}, nil
	}
	if err != nil {
		return Month{}, fmt.Errorf("active month of %s: %w", tenant, err)
	}
	return ParseMonth(s)
}

// Activate makes m the tenant's active month: forward only, only to a
// writable month not after the Redis-time month, recorded in MySQL before
// Redis (invariant 3, docs/invariants.md). The already-active month is a no-op.
func (a *Allocator) Activate(ctx context.Context, tenant string, m Month, source string) error {
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	now, err := a.clock.Month(ctx)
	if err != nil {
		return err
	}
	if m.After(now) {
		return fmt.Errorf("%w: %s > %s", ErrMonthInFuture, m, now)
	}
	cur, err := a.ActiveMonth(ctx, tenant)
	if err != nil {
		return err
	}
	if !cur.IsZero() && !m.After(cur) {
		if m == cur {
			return nil
		}
		return fmt.Errorf("%w: %s < %s", ErrMonthOlder, m, cur)
	}
	a.p.Catalog.Invalidate(tenant)
	_, st, err := a.p.Catalog.Table(ctx, tenant, m)
	if err != nil {
		return err
	}
	if st != StatusWritable {
		return fmt.Errorf("%w: %s is %s", ErrMonthNotWritable, m, st)
	}
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	if err := RecordActivation(ctx, db, m, source); err != nil {
		return err
	}
	a.p.Catalog.Invalidate(tenant)
	if err := a.MarkReady(ctx, tenant, m); err != nil {
		return err
	}
	return a.setActive(ctx, tenant, keys, m, now, source)
}

func (a *Allocator) setActive(ctx context.Context, tenant string, keys Keys, m, now Month, source string) error {
	reply, err := a.p.Scripts.Activate.Exec(ctx, a.p.Redis, []string{keys.ActiveMonth(), keys.ReadyMonths()},
		[]string{m.String(), now.String()}).ToArray()
	if err != nil {
		return fmt.Errorf("activate %s %s: %w", tenant, m, err)
	}
	code, _ := reply[0].AsInt64()
	detail, _ := reply[1].ToString()
	switch code {
	case 1:
		a.p.Metrics.MonthSwitches.WithLabelValues(source).Inc()
		a.p.Metrics.ActiveMonth.WithLabelValues(tenant).Set(float64(m.Int()))
		a.p.Log.Info().Str("tenant", tenant).Str("month", m.String()).Str("source", source).Msg("active month switched")
		return nil
	case 0:
		if detail == m.String() {
			return nil
		}
		return fmt.Errorf("%w: %s < %s", ErrMonthOlder, m, detail)
	case -1:
		return fmt.Errorf("%w: %s is not marked ready in Redis", ErrMonthNotWritable, m)
	default:
		return fmt.Errorf("%w: %s > %s", ErrMonthInFuture, m, detail)
	}
}

// RecoverActive rebuilds the tenant's ready months and active month in Redis
// from MySQL after Redis lost them: the recorded month, or with auto_advance
// the newest writable month not after the Redis-time month if that is later
// (recorded first). With neither, there is no active month.
func (a *Allocator) RecoverActive(ctx context.Context, tenant string) (Month, error) {
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return Month{}, err
	}
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Month{}, err
	}
	shards, err := ListShards(ctx, db)
	if err != nil {
		return Month{}, err
	}
	now, err := a.clock.Month(ctx)
	if err != nil {
		return Month{}, err
	}
	var ready []Month
	var newest Month
	for _, s := range shards {
		if s.Status == StatusWritable {
			ready = append(ready, s.Month)
			if !s.Month.After(now) {
				newest = s.Month
			}
		}
	}
	if err := a.MarkReady(ctx, tenant, ready...); err != nil {
		return Month{}, err
	}
	target, err := RecordedActive(ctx, db)
	if err != nil {
		return Month{}, err
	}
	source := "recover"
	if a.p.AutoAdvance && newest.After(target) {
		if err := RecordActivation(ctx, db, newest, "auto"); err != nil {
			return Month{}, err
		}
		target, source = newest, "auto"
	}
	if target.IsZero() {
		return Month{}, fmt.Errorf("%w for tenant %s: run `imshard shard ensure` (auto_advance) or `imshard shard activate`", ErrNoActiveMonth, tenant)
	}
	// The recorded month's table may since have been sealed; the allocation
	// still returns to it, as MySQL says it was active last.
	if err := a.MarkReady(ctx, tenant, target); err != nil {
		return Month{}, err
	}
	if err := a.setActive(ctx, tenant, keys, target, now, source); err != nil && !errors.Is(err, ErrMonthOlder) {
		return Month{}, err
	}
	return target, nil
}

// waitMoved runs write until it is not refused by the placement fence, or
// reserveMovedWait has passed, or ctx ends; it returns write's last error.
func waitMoved(ctx context.Context, write func() error) error {
	deadline := time.Now().Add(reserveMovedWait)
	for {
		err := write()
		if !errors.Is(err, ErrPlacementMoved) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(reserveMovedRetry):
		}
	}
}
