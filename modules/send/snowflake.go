package send

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// Snowflake message_id layout (63 bits, always positive):
//
//	| 41 bits: ms since Epoch | 10 bits: node | 12 bits: sequence within the ms |
//
// 41 bits of milliseconds last ~69 years from Epoch; 1024 nodes; 4096 ids
// per node and millisecond. The node id is a lease in Redis, so no two live
// processes mint with the same one.
const (
	NodeBits = 10
	SeqBits  = 12
	MaxNode  = 1<<NodeBits - 1
	maxSeq   = 1<<SeqBits - 1
)

// Epoch is the zero of the id's time field.
var Epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Errors of minting; both answer 503 unavailable (nothing was allocated).
var (
	ErrClockBackward = httpapi.Errorf(httpapi.CodeUnavailable, "clock moved backwards; message ids paused")
	ErrNoNode        = httpapi.Errorf(httpapi.CodeUnavailable, "no snowflake node lease")
)

// Snowflake mints message ids without a lock: the last (ms, sequence) pair
// lives in one atomic word, advanced by compare-and-swap.
type Snowflake struct {
	state       atomic.Int64 // ms since Epoch << SeqBits | sequence, of the last id
	node        atomic.Int64 // leased node id, -1 when none
	validUntil  atomic.Int64 // unix ns until which the lease is trusted
	maxBackward time.Duration
	now         func() time.Time
	sleep       func(time.Duration)
}

// NewSnowflake builds a generator without a node; SetNode (the lease) gives
// it one. maxBackward is send.max_clock_backward.
func NewSnowflake(maxBackward time.Duration) *Snowflake {
	s := &Snowflake{maxBackward: maxBackward, now: time.Now, sleep: time.Sleep}
	s.node.Store(-1)
	return s
}

// SetNode installs a leased node id trusted until validUntil.
func (s *Snowflake) SetNode(node int, validUntil time.Time) {
	s.node.Store(int64(node))
	s.validUntil.Store(validUntil.UnixNano())
}

// Extend moves the lease's trust horizon after a renewal.
func (s *Snowflake) Extend(validUntil time.Time) { s.validUntil.Store(validUntil.UnixNano()) }

// Node is the current node id (-1 without a lease).
func (s *Snowflake) Node() int { return int(s.node.Load()) }

// Leased reports whether a node id is held and still trusted.
func (s *Snowflake) Leased() bool {
	return s.node.Load() >= 0 && s.now().UnixNano() <= s.validUntil.Load()
}

// Next mints an id greater than every id this generator minted before. A
// clock that stepped back by at most maxBackward is waited out; further
// back, minting is refused until the clock catches up, since the ids would
// otherwise have to run ahead of time without bound.
func (s *Snowflake) Next() (int64, error) {
	for {
		if !s.Leased() {
			return 0, ErrNoNode
		}
		now, node := s.now(), s.node.Load()
		ms := now.Sub(Epoch).Milliseconds()
		old := s.state.Load()
		if last := old >> SeqBits; ms < last {
			back := time.Duration(last-ms) * time.Millisecond
			if back > s.maxBackward {
				return 0, ErrClockBackward
			}
			s.sleep(back)
			continue
		}
		// old+1 carries a full millisecond into the next one; the next
		// call then waits for the clock to get there
		next := max(ms<<SeqBits, old+1)
		if s.state.CompareAndSwap(old, next) {
			return Compose(next>>SeqBits, int(node), int(next&maxSeq)), nil
		}
	}
}

// Compose builds an id from its fields.
func Compose(ms int64, node, seq int) int64 {
	return ms<<(NodeBits+SeqBits) | int64(node)<<SeqBits | int64(seq)
}

// NodeLease holds a Snowflake node id in Redis (KeySpace.SnowflakeNode keys,
// SET NX PX) and renews it every ttl/3. A lease it cannot renew is trusted
// only until its TTL could have run out; a lease found lost (flushed,
// expired, taken) is replaced by another free node id at once.
type NodeLease struct {
	rdb     rueidis.Client
	space   routing.KeySpace
	scripts *routing.Scripts
	ttl     time.Duration
	gen     *Snowflake
	log     zerolog.Logger
	lock    *routing.Lock
	node    int
}

// NewNodeLease leases for gen.
func NewNodeLease(rdb rueidis.Client, space routing.KeySpace, scripts *routing.Scripts, ttl time.Duration, gen *Snowflake, log zerolog.Logger) *NodeLease {
	return &NodeLease{rdb: rdb, space: space, scripts: scripts, ttl: ttl, gen: gen, log: log, node: -1}
}

// trust is how long after a successful SET or renewal the lease is used:
// less than the TTL, so a renewal stuck past it stops minting before
// another process could take the id.
func (l *NodeLease) trust(start time.Time) time.Time { return start.Add(l.ttl * 3 / 4) }

// Acquire takes a free node id, trying the previous one first, then all
// others from a random start.
func (l *NodeLease) Acquire(ctx context.Context) error {
	first := rand.IntN(MaxNode + 1)
	if l.node >= 0 {
		first = l.node
	}
	for i := range MaxNode + 1 {
		n := (first + i) % (MaxNode + 1)
		key, err := l.space.SnowflakeNode(n)
		if err != nil {
			return err
		}
		start := time.Now()
		lock, err := routing.AcquireLock(ctx, l.rdb, l.scripts, key, l.ttl, 0)
		if errors.Is(err, routing.ErrLockBusy) {
			continue
		}
		if err != nil {
			return fmt.Errorf("snowflake: lease node %d: %w", n, err)
		}
		l.lock, l.node = lock, n
		l.gen.SetNode(n, l.trust(start))
		l.log.Info().Int("node", n).Msg("snowflake node leased")
		return nil
	}
	return errors.New("snowflake: all node ids are leased")
}

// Run renews the lease until ctx ends.
func (l *NodeLease) Run(ctx context.Context) {
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.renew(ctx)
		}
	}
}

func (l *NodeLease) renew(ctx context.Context) {
	start := time.Now()
	ok, err := l.lock.Refresh(ctx)
	switch {
	case err != nil:
		l.log.Warn().Err(err).Int("node", l.node).Msg("snowflake lease renewal failed; retrying")
	case ok:
		l.gen.Extend(l.trust(start))
	default:
		// another process may hold the id already: stop minting with it now
		l.gen.Extend(time.Unix(0, 0))
		l.log.Warn().Int("node", l.node).Msg("snowflake lease lost; leasing a node id again")
		if err := l.Acquire(ctx); err != nil {
			l.log.Error().Err(err).Msg("snowflake lease")
		}
	}
}

// Release gives the node id back.
func (l *NodeLease) Release(ctx context.Context) error {
	if l.lock == nil {
		return nil
	}
	return l.lock.Release(ctx)
}
