package routing

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Flight tracks the seqs of a topic between allocation and persistence, so
// that a reader walking forward never jumps over a message still on its way
// (invariant 12, docs/invariants.md). The allocation script adds every seq to the topic's
// pending set with its allocation time (Redis time); send marks it acked once
// Kafka has it, or persist before it stores it (Claim); persist removes it
// after the DB commit. A seq still unacked after the produce timeout,
// counted from that allocation time, will never arrive: it becomes a
// recorded gap and is abandoned — decided on the pending entry itself, so
// an ack and the timeout can never both win.
type Flight struct {
	rdb     rueidis.Client
	space   KeySpace
	scripts *Scripts
	dbs     DBs           // the route mirror, when Redis holds no counter or a fence is lifted
	timeout time.Duration // send.produce_timeout
	metrics *Metrics      // resume fences (nil: not counted)
}

// NewFlight builds the tracker; timeout is send.produce_timeout.
func NewFlight(rdb rueidis.Client, space KeySpace, scripts *Scripts, dbs DBs, timeout time.Duration, metrics *Metrics) *Flight {
	return &Flight{rdb: rdb, space: space, scripts: scripts, dbs: dbs, timeout: timeout, metrics: metrics}
}

// noneInFlight is what below answers when nothing of the topic is in flight.
const noneInFlight = math.MaxInt64

// MarkAcked records that Kafka acknowledged seq: it will be persisted.
func (f *Flight) MarkAcked(ctx context.Context, tenant, topic string, seq int64) error {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return err
	}
	return f.scripts.PendingAck.Exec(ctx, f.rdb, []string{keys.Pending(topic)}, []string{strconv.FormatInt(seq, 10)}).Error()
}

// MarkPersisted removes seqs of one topic from the pending set after the DB
// commit made them visible.
func (f *Flight) MarkPersisted(ctx context.Context, tenant, topic string, seqs ...int64) error {
	return f.MarkPersistedMany(ctx, tenant, map[string][]int64{topic: seqs})
}

// MarkPersistedMany does MarkPersisted for many topics of one tenant in one
// round trip (persist clears a whole batch at once). Each run of
// consecutive seqs of a topic is one removal: every seq of the run was
// committed, so nothing still in flight lies inside it.
func (f *Flight) MarkPersistedMany(ctx context.Context, tenant string, seqs map[string][]int64) error {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return err
	}
	var cmds rueidis.Commands
	for topic, ss := range seqs {
		for _, run := range seqRuns(ss) {
			cmds = append(cmds, f.rdb.B().Zremrangebyscore().Key(keys.Pending(topic)).
				Min(strconv.FormatInt(run[0], 10)).Max(strconv.FormatInt(run[1], 10)).Build())
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	for _, r := range f.rdb.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("pending: persisted %s: %w", tenant, err)
		}
	}
	return nil
}

// seqRuns are seqs as runs of consecutive seqs, [first, last] each, in
// order (duplicates fold in).
func seqRuns(seqs []int64) [][2]int64 {
	sorted := slices.Clone(seqs)
	slices.Sort(sorted)
	var runs [][2]int64
	for i := 0; i < len(sorted); {
		j := i
		for j+1 < len(sorted) && sorted[j+1] <= sorted[j]+1 {
			j++
		}
		runs = append(runs, [2]int64{sorted[i], sorted[j]})
		i = j + 1
	}
	return runs
}

// RecordGap marks seq as allocated but never to be persisted: it leaves the
// pending set and joins the topic's gaps, which readers skip knowingly.
func (f *Flight) RecordGap(ctx context.Context, tenant, topic string, seq int64) error {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return err
	}
	v := strconv.FormatInt(seq, 10)
	for _, r := range f.rdb.DoMulti(ctx,
		f.rdb.B().Zadd().Key(keys.Gaps(topic)).ScoreMember().ScoreMember(float64(seq), v).Build(),
		f.rdb.B().Zremrangebyscore().Key(keys.Pending(topic)).Min(v).Max(v).Build(),
	) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("pending: gap %s/%s %d: %w", tenant, topic, seq, err)
		}
	}
	return nil
}

// RecordDuplicate records seq, whose event persist dropped because its
// client_msg_id is stored under another seq, as a gap and abandoned: the
// send's call after the ack, should it come later, then answers that the
// seq is gone (sent in lua/fenced.lua) instead of letting a 201 name a seq
// that holds no row, and the send's retry finds the stored message through
// MySQL. The abandoned mark comes before the pending entry goes, so a call
// that no longer finds the entry finds the mark.
func (f *Flight) RecordDuplicate(ctx context.Context, tenant, topic string, seq int64) error {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return err
	}
	v := strconv.FormatInt(seq, 10)
	for _, r := range f.rdb.DoMulti(ctx,
		f.rdb.B().Zadd().Key(keys.Gaps(topic)).ScoreMember().ScoreMember(float64(seq), v).Build(),
		f.rdb.B().Zadd().Key(keys.Abandoned(topic)).ScoreMember().ScoreMember(float64(seq), v).Build(),
		f.rdb.B().Zremrangebyscore().Key(keys.Pending(topic)).Min(v).Max(v).Build(),
	) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("pending: duplicate %s/%s %d: %w", tenant, topic, seq, err)
		}
	}
	return nil
}

// abandon records seq as a gap and abandoned while its pending entry is
// still member, the one found stale (lua/pending_abandon.lua).
func (f *Flight) abandon(ctx context.Context, keys Keys, topic, member string, seq int64) error {
	return f.scripts.PendingAbandon.Exec(ctx, f.rdb,
		[]string{keys.Pending(topic), keys.Gaps(topic), keys.Abandoned(topic)},
		[]string{member, strconv.FormatInt(seq, 10)}).Error()
}

// Claim decides the seqs of one tenant's events before persist stores them
// (lua/persist_claim.lua), for many topics in one round trip: it returns
// the seqs abandoned — timed out into gaps readers walked past: their
// events must be dropped, never stored — and marks every other seq still
// pending as acknowledged, so none can time out while persist stores it.
func (f *Flight) Claim(ctx context.Context, tenant string, seqs map[string][]int64) (map[string][]int64, error) {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return nil, err
	}
	topics := make([]string, 0, len(seqs))
	var ks, args []string
	for topic, ss := range seqs {
		topics = append(topics, topic)
		ks = append(ks, keys.Pending(topic), keys.Abandoned(topic))
		args = append(args, strconv.Itoa(len(ss)))
		for _, seq := range ss {
			args = append(args, strconv.FormatInt(seq, 10))
		}
	}
	if len(topics) == 0 {
		return nil, nil
	}
	out, err := f.scripts.PersistClaim.Exec(ctx, f.rdb, ks, args).AsIntSlice()
	if err != nil {
		return nil, fmt.Errorf("pending: claim %s: %w", tenant, err)
	}
	abandoned := map[string][]int64{}
	for i := 0; i+1 < len(out); i += 2 {
		if t := out[i] - 1; t >= 0 && t < int64(len(topics)) {
			abandoned[topics[t]] = append(abandoned[topics[t]], out[i+1])
		}
	}
	return abandoned, nil
}

// Gaps lists the recorded gaps of a topic within [lo, hi].
func (f *Flight) Gaps(ctx context.Context, tenant, topic string, lo, hi int64) ([]int64, error) {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return nil, err
	}
	vals, err := f.rdb.Do(ctx, f.rdb.B().Zrange().Key(keys.Gaps(topic)).Min(strconv.FormatInt(lo, 10)).
		Max(strconv.FormatInt(hi, 10)).Byscore().Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("pending: gaps %s/%s: %w", tenant, topic, err)
	}
	out := make([]int64, 0, len(vals))
	for _, v := range vals {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// settledBatch is how many pending seqs one read of the pending set takes.
const settledBatch = 100

// BoundCmds are the reads of the topic's forward bound (Bound): the
// topic's last issued seq, then Redis time and the oldest pending seqs —
// the counter first, so that every seq it counts was allocated, and so
// added to the pending set, before the set is read. A caller pipelines
// them with its own reads; BoundResolve computes the bound from their
// results.
func (f *Flight) BoundCmds(keys Keys, topic string) []rueidis.Completed {
	return []rueidis.Completed{
		f.rdb.B().Get().Key(keys.Seq(topic)).Build(),
		f.rdb.B().Time().Build(),
		f.rdb.B().Zrange().Key(keys.Pending(topic)).Min("0").Max(strconv.Itoa(settledBatch - 1)).Build(),
	}
}

// Bound is how far a forward reader of the topic — a since page, the
// stream — may go (invariant 12, docs/invariants.md): the last issued seq,
// lowered below the oldest seq still in flight, as the settled watermark;
// unacked seqs older than the produce timeout are recorded as gaps on the
// way.
func (f *Flight) Bound(ctx context.Context, tenant, topic string) (Bound, error) {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return Bound{}, err
	}
	return f.BoundResolve(ctx, tenant, topic, f.rdb.DoMulti(ctx, f.BoundCmds(keys, topic)...))
}

// BoundResolve is Bound from the results of BoundCmds. When the oldest
// pending seq is still within the produce timeout — the usual case — the
// answer is in them; otherwise (seqs to record as gaps, foreign members)
// the pending set is read in full. A counter Redis does not hold — one it
// lost, with the topic's pending set and recorded gaps — is re-seeded here
// as a send would (reseed): only the resume fence that seed raises, once
// lifted, records the lost gaps again, and a topic nobody sends to would
// otherwise stay below its first gap for good. The bound is then read
// again (Counted, Regapped), and stops below the fence while it stands. A
// topic with no durable reservation (never written to) or a counter Redis
// cannot read proves no seq issued: the bound is then only what the route
// mirror proves stored (MirrorBound, not Counted), 0 when it proves
// nothing, so the reader stops at its cursor and tries again, never
// jumping over seqs still on their way.
func (f *Flight) BoundResolve(ctx context.Context, tenant, topic string, res []rueidis.RedisResult) (Bound, error) {
	return f.boundResolve(ctx, tenant, topic, res, true)
}

// boundResolve is BoundResolve; reseed false, for the read after a
// re-seed, falls back to the mirror rather than seeding again.
func (f *Flight) boundResolve(ctx context.Context, tenant, topic string, res []rueidis.RedisResult, reseed bool) (Bound, error) {
	below, regapped, err := f.belowResolve(ctx, tenant, topic, res[1:])
	if err != nil {
		return Bound{}, err
	}
	issued, err := res[0].AsInt64()
	if err == nil {
		return Bound{Settled: min(issued, below), Counted: true, Regapped: regapped}, nil
	}
	if reseed && rueidis.IsRedisNil(err) {
		seeded, err := f.reseed(ctx, tenant, topic)
		if err != nil {
			return Bound{}, err
		}
		if seeded {
			keys, err := f.space.Tenant(tenant)
			if err != nil {
				return Bound{}, err
			}
			b, err := f.boundResolve(ctx, tenant, topic, f.rdb.DoMulti(ctx, f.BoundCmds(keys, topic)...), false)
			b.Regapped = true
			return b, err
		}
	}
	b, err := f.mirrorBound(ctx, tenant, topic)
	if err != nil {
		return Bound{}, err
	}
	b.Settled, b.Regapped = min(b.Settled, below), regapped
	return b, nil
}

// reseed runs a send's seed (seedCounter) for a topic whose counter Redis
// does not hold, and reports whether it did: a topic with no durable
// reservation was never written to, holds no gap to lose, and gets no keys.
func (f *Flight) reseed(ctx context.Context, tenant, topic string) (bool, error) {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return false, err
	}
	db, err := f.dbs.DB(ctx, tenant)
	if err != nil {
		return false, fmt.Errorf("pending: reseed %s/%s: %w", tenant, topic, err)
	}
	hi, err := reservedHi(ctx, db, topic)
	if err != nil || hi == 0 {
		return false, err
	}
	if _, err := seedCounter(ctx, f.rdb, f.scripts.Fenced, db, f.metrics, topic, keys, hi); err != nil {
		return false, fmt.Errorf("pending: reseed %s/%s: %w", tenant, topic, err)
	}
	return true, nil
}

// mirrorBound is MirrorBound of the topic's route mirror, read from MySQL.
func (f *Flight) mirrorBound(ctx context.Context, tenant, topic string) (Bound, error) {
	db, err := f.dbs.DB(ctx, tenant)
	if err != nil {
		return Bound{}, fmt.Errorf("pending: settled %s/%s: %w", tenant, topic, err)
	}
	ranges, err := LoadMirror(ctx, db, topic)
	if err != nil {
		return Bound{}, fmt.Errorf("pending: settled %s/%s: %w", tenant, topic, err)
	}
	floor, err := LoadFloor(ctx, db, topic)
	if err != nil {
		return Bound{}, fmt.Errorf("pending: settled %s/%s: %w", tenant, topic, err)
	}
	return MirrorBoundAbove(ranges, floor), nil
}

// belowResolve is the seq below the oldest one still in flight
// (noneInFlight when none is), from the Redis time and the oldest pending
// seqs BoundCmds read; below reads the pending set in full when they do
// not answer.
func (f *Flight) belowResolve(ctx context.Context, tenant, topic string, res []rueidis.RedisResult) (below int64, regapped bool, err error) {
	now, err := timeOf(res[0])
	if err != nil {
		return 0, false, err
	}
	members, err := res[1].AsStrSlice()
	if err != nil {
		return 0, false, fmt.Errorf("pending: read %s/%s: %w", tenant, topic, err)
	}
	if len(members) == 0 {
		return noneInFlight, false, nil
	}
	if _, fenced := parseFence(members[0]); !fenced {
		if seq, ours, flying := pendingMember(members[0], now.Add(-f.timeout).UnixMilli()); ours && flying {
			return seq - 1, false, nil
		}
	}
	return f.below(ctx, tenant, topic)
}

// pendingMember reads a member of a pending set, "seq:allocated_ms" or
// "seq:a" once acknowledged: ours false for a member that is not one;
// flying whether it still counts as in flight at cutoff (acknowledged,
// allocated at or after cutoff, or a time it cannot read).
func pendingMember(m string, cutoff int64) (seq int64, ours, flying bool) {
	seqStr, at, _ := strings.Cut(m, ":")
	seq, err := strconv.ParseInt(seqStr, 10, 64)
	if err != nil {
		return 0, false, false
	}
	ms, err := strconv.ParseInt(at, 10, 64)
	return seq, true, at == "a" || err != nil || ms >= cutoff
}

// below is the seq below the oldest one of the topic still in flight, or
// noneInFlight. Unacked seqs older than the produce timeout are recorded as
// gaps on the way, and resume fences (fence.go) that nothing can arrive
// behind any more are lifted; a fence that stands holds the answer below
// its first seq. regapped reports that it recorded gaps.
func (f *Flight) below(ctx context.Context, tenant, topic string) (below int64, regapped bool, err error) {
	keys, err := f.space.Tenant(tenant)
	if err != nil {
		return 0, false, err
	}
	now, err := NewClock(f.rdb).Now(ctx)
	if err != nil {
		return 0, false, err
	}
	cutoff := now.Add(-f.timeout).UnixMilli()
	limit := int64(noneInFlight)
	var persisted *int64
	stands := map[string]bool{} // fences decided in this call
	for {
		// every pass returns, or takes each member it read out of the set
		// (one changed meanwhile is read again by the next pass), or finds
		// only standing fences
		members, err := f.rdb.Do(ctx, f.rdb.B().Zrange().Key(keys.Pending(topic)).Min("0").
			Max(strconv.Itoa(settledBatch-1)).Build()).AsStrSlice()
		if err != nil {
			return 0, false, fmt.Errorf("pending: read %s/%s: %w", tenant, topic, err)
		}
		removed := false
		for _, m := range members {
			if fc, ok := parseFence(m); ok {
				st, decided := stands[m]
				if !decided {
					if st, err = f.fenceStands(ctx, tenant, topic, keys, fc, now, &persisted); err != nil {
						return 0, false, err
					}
					stands[m] = st
				}
				if st {
					limit = min(limit, fc.from-1)
				} else {
					removed, regapped = true, true
				}
				continue
			}
			seq, ours, flying := pendingMember(m, cutoff)
			removed = true
			if !ours {
				// not ours; drop it rather than stall every reader on it
				if err := f.rdb.Do(ctx, f.rdb.B().Zrem().Key(keys.Pending(topic)).Member(m).Build()).Error(); err != nil {
					return 0, false, err
				}
				continue
			}
			if flying {
				return min(limit, seq-1), regapped, nil
			}
			// an entry acked or refreshed since the read stays: the next
			// pass reads it again
			if err := f.abandon(ctx, keys, topic, m, seq); err != nil {
				return 0, false, fmt.Errorf("pending: abandon %s/%s %d: %w", tenant, topic, seq, err)
			}
			regapped = true
		}
		if !removed {
			return limit, regapped, nil
		}
	}
}

// InFlightCmds read whether seq of topic is still in flight: allocated and
// neither persisted nor recorded as a gap yet — its own pending entry, or a
// resume fence (fence.go) covering it, the entry lost with the counter —
// for a caller that pipelines them with its own reads; InFlightResolve
// reads their results. Persist commits a row before it clears its seq
// here, so a seq found neither here nor in its month table afterwards was
// never stored.
func (f *Flight) InFlightCmds(keys Keys, topic string, seq int64) []rueidis.Completed {
	v := strconv.FormatInt(seq, 10)
	return []rueidis.Completed{
		f.rdb.B().Zcount().Key(keys.Pending(topic)).Min(v).Max(v).Build(),
		f.rdb.B().Zrange().Key(keys.Pending(topic)).Min("0").Max("0").Byscore().Build(),
	}
}

// LowestPendingCmd reads the lowest seq of topic not stored yet, for a
// caller that pipelines it with its own reads; NonePendingThrough reads
// its result.
func (f *Flight) LowestPendingCmd(keys Keys, topic string) rueidis.Completed {
	return f.rdb.B().Zrange().Key(keys.Pending(topic)).Min("0").Max("0").Withscores().Build()
}

// NonePendingThrough reports whether LowestPendingCmd's answer shows no
// seq up to seq pending (false when it cannot be read): every seq up to it
// was stored or recorded as a gap before the read.
func NonePendingThrough(res rueidis.RedisResult, seq int64) bool {
	zs, err := res.AsZScores()
	return err == nil && (len(zs) == 0 || int64(zs[0].Score) > seq)
}

// InFlightResolve is InFlightCmds' answer (res: their two results). A
// fence covering seq is decided as every reader decides it (fenceStands):
// it stands while something sent before its re-seed may still be stored,
// and once nothing can, it is lifted here and seq is not in flight.
func (f *Flight) InFlightResolve(ctx context.Context, tenant, topic string, seq int64, res []rueidis.RedisResult) (bool, error) {
	n, err := res[0].AsInt64()
	if err != nil {
		return false, fmt.Errorf("pending: in flight: %w", err)
	}
	if n > 0 {
		return true, nil
	}
	fences, err := res[1].AsStrSlice()
	if err != nil {
		return false, fmt.Errorf("pending: in flight: %w", err)
	}
	var persisted *int64
	for _, m := range fences {
		fc, ok := parseFence(m)
		if !ok || seq < fc.from || seq > fc.to {
			continue
		}
		keys, err := f.space.Tenant(tenant)
		if err != nil {
			return false, err
		}
		now, err := NewClock(f.rdb).Now(ctx)
		if err != nil {
			return false, err
		}
		stands, err := f.fenceStands(ctx, tenant, topic, keys, fc, now, &persisted)
		if err != nil || stands {
			return stands, err
		}
	}
	return false, nil
}
