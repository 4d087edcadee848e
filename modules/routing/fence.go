package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
)

// A resume fence stands in a topic's pending set from the moment its seq
// counter is re-seeded (lua/fenced.lua, seed) — after Redis lost the
// counter, and with it the pending entries of every seq still on its way
// through Kafka. It covers the seqs from the first one MySQL did not prove
// stored up to the new counter, so a forward reader stops below them
// (invariant 12, docs/invariants.md) until nothing allocated before the
// re-seed can still arrive:
//
//   - no sender can be acknowledged any more: a sender gives up within
//     send.produce_timeout of its allocation, which came before the
//     re-seed, so after T0 + produce_timeout (Redis time) none is; and
//   - every record Kafka took before then is stored, compensated or
//     dead-lettered: persist publishes the Redis time before which that
//     holds (Keys.PersistedBefore, modules/persist/progress.go).
//
// Once persist's time reaches T0 + produce_timeout, the first reader that
// finds the fence lifts it: the seqs of the fence that hold no stored row
// become recorded gaps and the fence leaves the pending set, in one script
// (lua/fence_lift.lua). Redis losing the fence again re-seeds and re-fences;
// losing persist's time only keeps the fence until persist writes it again.

const (
	fenceRaised = "raised"
	fenceLifted = "lifted"
	// fenceStallAfter is how long past its expected lift a fence counts as
	// stalled (imshard_seq_fence_stalled_reads_total): persist publishes
	// its progress every second, so a minute means it is not passing it.
	fenceStallAfter = time.Minute
)

// fence is a resume fence as the pending set holds it, "from:f:to:T0ms" at
// score 0: the seqs from..to may still be on their way; at is the Redis
// time (ms) of the re-seed.
type fence struct {
	member   string
	from, to int64
	at       int64
}

// parseFence reads a pending member; ok is false for anything but a fence.
func parseFence(m string) (fence, bool) {
	fromS, rest, ok := strings.Cut(m, ":f:")
	if !ok {
		return fence{}, false
	}
	toS, atS, ok := strings.Cut(rest, ":")
	if !ok {
		return fence{}, false
	}
	from, err1 := strconv.ParseInt(fromS, 10, 64)
	to, err2 := strconv.ParseInt(toS, 10, 64)
	at, err3 := strconv.ParseInt(atS, 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return fence{}, false
	}
	return fence{member: m, from: from, to: to, at: at}, true
}

// liftable reports whether nothing allocated before the fence's re-seed can
// still arrive, given persist's PersistedBefore (Redis ms; 0 when unknown)
// and send.produce_timeout: every acknowledgement of the fence's seqs
// happened before at + timeout, and persist has done every record Kafka
// took before then.
func (fc fence) liftable(persistedBefore int64, timeout time.Duration) bool {
	return persistedBefore >= fc.at+timeout.Milliseconds()
}

// fenceHoles splits the seqs lo..hi by the route mirror's ranges: holes are
// the seqs no month's range covers (stored nowhere), partial the months
// whose range covers some of them without being whole (count below its
// span), whose rows must be read to tell. A whole month's seqs are stored.
func fenceHoles(lo, hi int64, ranges []MonthRange) (holes []int64, partial []MonthRange) {
	covered := make([]MonthRange, 0, len(ranges))
	for _, r := range ranges {
		if r.MaxSeq < lo || r.MinSeq > hi {
			continue
		}
		covered = append(covered, r)
		if r.Count != r.MaxSeq-r.MinSeq+1 {
			partial = append(partial, r)
		}
	}
	slices.SortFunc(covered, func(a, b MonthRange) int { return cmp.Compare(a.MinSeq, b.MinSeq) })
	next := lo
	for _, r := range covered {
		for ; next < r.MinSeq && next <= hi; next++ {
			holes = append(holes, next)
		}
		next = max(next, r.MaxSeq+1)
	}
	for ; next <= hi; next++ {
		holes = append(holes, next)
	}
	return holes, partial
}

// fenceStands decides a fence found in the pending set: it stands while
// something allocated before its re-seed may still arrive; otherwise it is
// lifted here. persisted caches persist's PersistedBefore for the caller's
// pass (nil: not read yet).
func (f *Flight) fenceStands(ctx context.Context, tenant, topic string, keys Keys, fc fence, now time.Time, persisted **int64) (bool, error) {
	if *persisted == nil {
		v, err := f.rdb.Do(ctx, f.rdb.B().Get().Key(keys.PersistedBefore()).Build()).AsInt64()
		if err != nil && !rueidis.IsRedisNil(err) {
			return false, fmt.Errorf("pending: persist progress %s: %w", tenant, err)
		}
		*persisted = &v
	}
	if !fc.liftable(**persisted, f.timeout) {
		if f.metrics != nil && now.UnixMilli() > fc.at+(f.timeout+fenceStallAfter).Milliseconds() {
			f.metrics.FenceStalls.Inc()
		}
		return true, nil
	}
	gaps, err := f.fenceGaps(ctx, tenant, topic, fc)
	if err != nil {
		return false, err
	}
	args := make([]string, 0, len(gaps)+1)
	args = append(args, fc.member)
	for _, s := range gaps {
		args = append(args, strconv.FormatInt(s, 10))
	}
	n, err := f.scripts.FenceLift.Exec(ctx, f.rdb, []string{keys.Pending(topic), keys.Gaps(topic), keys.Abandoned(topic)}, args).AsInt64()
	if err != nil {
		return false, fmt.Errorf("pending: lift fence %s/%s: %w", tenant, topic, err)
	}
	if n == 1 && f.metrics != nil {
		f.metrics.SeqFences.WithLabelValues(fenceLifted).Inc()
	}
	return false, nil
}

// fenceGaps are the seqs of a liftable fence that hold no stored row: no
// row can appear for them any more (liftable). Seqs at or below the
// topic's migration cutover are the legacy table's and never gaps; a month
// table that is gone (archived) proves nothing, so its seqs are left alone —
// a seq not recorded as a gap only costs readers a proof, a seq wrongly
// recorded as one would hide a message.
func (f *Flight) fenceGaps(ctx context.Context, tenant, topic string, fc fence) ([]int64, error) {
	db, err := f.dbs.DB(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("pending: fence of %s/%s: %w", tenant, topic, err)
	}
	cut, err := CutoverSeq(ctx, db, topic)
	if err != nil {
		return nil, err
	}
	ranges, err := LoadMirror(ctx, db, topic)
	if err != nil {
		return nil, err
	}
	lo := max(fc.from, cut+1)
	gaps, partial := fenceHoles(lo, fc.to, ranges)
	for _, r := range partial {
		from, to := max(lo, r.MinSeq), min(fc.to, r.MaxSeq)
		stored, err := storedSeqs(ctx, db, topic, r.Month, from, to)
		if IsNoSuchTable(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pending: fence of %s/%s: %w", tenant, topic, err)
		}
		for s := from; s <= to; s++ {
			if _, ok := slices.BinarySearch(stored, s); !ok {
				gaps = append(gaps, s)
			}
		}
	}
	slices.Sort(gaps)
	return gaps, nil
}

// storedSeqs are the topic's seqs from..to stored in month m's table, in
// order.
func storedSeqs(ctx context.Context, db sq.BaseRunner, topic string, m Month, from, to int64) ([]int64, error) {
	t, err := TableFor(m)
	if err != nil {
		return nil, err
	}
	rows, err := sq.Select("seqid").From(t.Quoted()).
		Where(sq.And{sq.Eq{"topic": topic}, sq.GtOrEq{"seqid": from}, sq.LtOrEq{"seqid": to}}).
		OrderBy("seqid").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
