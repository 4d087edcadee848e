package routing

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// MonthRange is the part of a topic that lives in one month table: its
// first and last seq there and how many rows it holds.
// A topic's ranges never overlap (invariant 4, docs/invariants.md).
type MonthRange struct {
	Month  Month
	MinSeq int64
	MaxSeq int64
	Count  int64
}

// Routes reads and writes the long-lived Redis topic routes (no TTL): the
// ZSET month → first seq and the HASH month → min/max/count. MySQL's mirror
// (im_group_message_topic_shards) is the source they are rebuilt from.
type Routes struct {
	rdb     rueidis.Client
	space   KeySpace
	scripts *Scripts
}

// NewRoutes builds the route store.
func NewRoutes(rdb rueidis.Client, space KeySpace, scripts *Scripts) *Routes {
	return &Routes{rdb: rdb, space: space, scripts: scripts}
}

func rangeArgs(ranges []MonthRange) []string {
	args := make([]string, 0, 4*len(ranges))
	for _, r := range ranges {
		args = append(args, r.Month.String(), strconv.FormatInt(r.MinSeq, 10),
			strconv.FormatInt(r.MaxSeq, 10), strconv.FormatInt(r.Count, 10))
	}
	return args
}

// Merge widens the topic's route by ranges.
func (r *Routes) Merge(ctx context.Context, tenant, topic string, ranges ...MonthRange) error {
	return r.Settle(ctx, tenant, []Settlement{{Topic: topic, Ranges: ranges}})
}

// Settlement is what persist settles in Redis for one topic after a DB commit.
type Settlement struct {
	Topic  string
	Ranges []MonthRange // merged into its route, with counts of rows actually inserted
	Seqs   []int64      // stored: out of its pending set (invariant 12, docs/invariants.md)
	Idem   []string     // its send idempotency records (keys) to mark done
}

// settleTopics and settleIdem bound the topics and the idempotency records
// of one script call, so that a large batch does not hold Redis in one
// script for long; the chunks of a call still go out in one round trip, in
// order.
const (
	settleTopics = 128
	settleIdem   = 256
)

// Settle does, for many topics of one tenant, what persisted.lua describes —
// per topic: route merged, then pending seqs cleared, then idempotency
// records done — in one round trip: a 500-event batch over 500 topics costs
// a few script calls, not 1,500 commands. Every topic's steps are atomic
// together (a chunk of topics shares one script run; their keys share the
// tenant hash tag, so this holds on Redis Cluster too). On error some chunks
// may have been applied: callers repair every topic of the call, and a
// repair rebuilds from the mirror, so that is safe.
func (r *Routes) Settle(ctx context.Context, tenant string, topics []Settlement) error {
	keys, err := r.space.Tenant(tenant)
	if err != nil {
		return err
	}
	var stmts []rueidis.LuaExec
	var st rueidis.LuaExec
	n, idem := 0, 0
	flush := func() {
		if n > 0 {
			stmts = append(stmts, st)
		}
		st, n, idem = rueidis.LuaExec{}, 0, 0
	}
	for _, t := range topics {
		if len(t.Ranges) == 0 && len(t.Seqs) == 0 && len(t.Idem) == 0 {
			continue
		}
		runs := seqRuns(t.Seqs)
		for first := true; first || len(t.Idem) > 0; first = false {
			if n == settleTopics || (idem > 0 && idem+len(t.Idem) > settleIdem) {
				flush()
			}
			// a topic with more records than a chunk takes is split: its
			// route and pending steps go first, its records follow in order
			part := t.Idem[:min(len(t.Idem), settleIdem)]
			t.Idem = t.Idem[len(part):]
			st.Keys = append(st.Keys, keys.Route(t.Topic), keys.RouteMeta(t.Topic), keys.Pending(t.Topic))
			st.Keys = append(st.Keys, part...)
			if first {
				st.Args = append(st.Args, strconv.Itoa(len(t.Ranges)))
				st.Args = append(st.Args, rangeArgs(t.Ranges)...)
				st.Args = append(st.Args, strconv.Itoa(len(runs)))
				for _, run := range runs {
					st.Args = append(st.Args, strconv.FormatInt(run[0], 10), strconv.FormatInt(run[1], 10))
				}
			} else {
				st.Args = append(st.Args, "0", "0")
			}
			st.Args = append(st.Args, strconv.Itoa(len(part)))
			n, idem = n+1, idem+len(part)
		}
	}
	flush()
	if len(stmts) == 0 {
		return nil
	}
	for _, res := range r.scripts.Persisted.ExecMulti(ctx, r.rdb, stmts...) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("routes: settle %s: %w", tenant, err)
		}
	}
	return nil
}

// Replace makes the topic's route exactly ranges (a rebuild).
func (r *Routes) Replace(ctx context.Context, tenant, topic string, ranges []MonthRange) error {
	keys, err := r.space.Tenant(tenant)
	if err != nil {
		return err
	}
	if err := r.scripts.RouteReplace.Exec(ctx, r.rdb, []string{keys.Route(topic), keys.RouteMeta(topic)}, rangeArgs(ranges)).Error(); err != nil {
		return fmt.Errorf("routes: replace %s/%s: %w", tenant, topic, err)
	}
	return nil
}

// Delete removes the topic's route (group physically deleted, retention).
func (r *Routes) Delete(ctx context.Context, tenant, topic string) error {
	keys, err := r.space.Tenant(tenant)
	if err != nil {
		return err
	}
	return r.rdb.Do(ctx, r.rdb.B().Del().Key(keys.Route(topic), keys.RouteMeta(topic)).Build()).Error()
}

// Load reads the topic's route, oldest month first; found is false when
// Redis holds no route at all for it. A month present in the ZSET but not in
// the HASH keeps its first seq and MaxSeq 0 (unknown): callers treat the
// route as incomplete.
func (r *Routes) Load(ctx context.Context, tenant, topic string) ([]MonthRange, bool, error) {
	keys, err := r.space.Tenant(tenant)
	if err != nil {
		return nil, false, err
	}
	return LoadResolve(tenant, topic, r.rdb.DoMulti(ctx, LoadCmds(r.rdb, keys, topic)...))
}

// LoadCmds are the reads of Load, for a caller that pipelines them with
// its own; LoadResolve reads their results.
func LoadCmds(rdb rueidis.Client, keys Keys, topic string) []rueidis.Completed {
	return []rueidis.Completed{
		rdb.B().Zrange().Key(keys.Route(topic)).Min("0").Max("-1").Withscores().Build(),
		rdb.B().Hgetall().Key(keys.RouteMeta(topic)).Build(),
	}
}

// LoadResolve is Load's answer from the results of LoadCmds.
func LoadResolve(tenant, topic string, res []rueidis.RedisResult) ([]MonthRange, bool, error) {
	zs, err := res[0].AsZScores()
	if err != nil {
		return nil, false, fmt.Errorf("routes: load %s/%s: %w", tenant, topic, err)
	}
	meta, err := res[1].AsStrMap()
	if err != nil {
		return nil, false, fmt.Errorf("routes: load meta %s/%s: %w", tenant, topic, err)
	}
	if len(zs) == 0 && len(meta) == 0 {
		return nil, false, nil
	}
	byMonth := map[Month]MonthRange{}
	for _, z := range zs {
		m, err := ParseMonth(z.Member)
		if err != nil {
			continue // not a month: ignore rather than route to it
		}
		byMonth[m] = MonthRange{Month: m, MinSeq: int64(z.Score)}
	}
	for field, v := range meta {
		m, err := ParseMonth(field)
		if err != nil {
			continue
		}
		mr, ok := ParseRangeValue(v)
		if !ok {
			continue
		}
		mr.Month = m
		byMonth[m] = mr
	}
	out := make([]MonthRange, 0, len(byMonth))
	for _, mr := range byMonth {
		out = append(out, mr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Month.Before(out[j].Month) })
	return out, true, nil
}

// ParseRangeValue reads "min_seq=A,max_seq=B,count=N".
func ParseRangeValue(v string) (MonthRange, bool) {
	var mr MonthRange
	seen := 0
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok {
			return MonthRange{}, false
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return MonthRange{}, false
		}
		switch k {
		case "min_seq":
			mr.MinSeq = n
		case "max_seq":
			mr.MaxSeq = n
		case "count":
			mr.Count = n
		default:
			continue
		}
		seen++
	}
	return mr, seen == 3
}
