package routing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	imsql "github.com/imshard/imshard/sql"
)

// Route sources: where a read learned a topic's months.
const (
	RouteFromRedis    = "redis"
	RouteFromMirror   = "mirror"
	RouteFromFallback = "fallback"
)

// FallbackMonths bounds the scan when neither Redis nor the MySQL mirror
// knows a topic: the active month and the ones just before it, never all
// history.
const FallbackMonths = 3

// RouterParams wires a Router.
type RouterParams struct {
	Redis    rueidis.Client
	KeySpace KeySpace
	DBs      DBs
	Catalog  *Catalog
	Routes   *Routes
	Metrics  *Metrics
	// Migrations, when set, adds a migrating tenant's legacy table to its
	// reads (TopicRoute.Legacy).
	Migrations *Migrations
	Log        zerolog.Logger
}

// Router is the read path's shard router: every dynamic table
// access of a read goes through it, so every table it hands out is built by
// this package from a month and registered in the catalog.
type Router struct {
	p RouterParams
}

// NewRouter builds the router.
func NewRouter(p RouterParams) *Router { return &Router{p: p} }

// TopicRoute is what a read knows of one topic's months. Ranges come from
// the Redis route (or the mirror it was refilled from); Probe are registered
// months the route may not know yet — months after the tenant's "routes
// complete" watermark (or, without one, after the route's newest month) up
// to the active month — which a read must still reach (invariant 7, docs/invariants.md).
type TopicRoute struct {
	Ranges []MonthRange // oldest first, never overlapping
	Probe  []Month      // oldest first, none of them in Ranges
	Source string       // RouteFromRedis, RouteFromMirror or RouteFromFallback
	// Legacy is the legacy table as one more source while the tenant
	// migrates from it (zero: none).
	Legacy LegacySource
}

// Months is every month of the route, oldest first.
func (tr TopicRoute) Months() []Month {
	out := make([]Month, 0, len(tr.Ranges)+len(tr.Probe))
	for _, r := range tr.Ranges {
		out = append(out, r.Month)
	}
	out = append(out, tr.Probe...)
	slices.SortFunc(out, Month.Compare)
	return slices.Compact(out)
}

// MaxSeq is the highest persisted seq the route's ranges record — or,
// after a migration's cutover, its legacy source's cutover_seq when that
// is higher (0 for none); it lags the seq counter while messages are in
// flight.
func (tr TopicRoute) MaxSeq() int64 {
	var m int64
	for _, r := range tr.Ranges {
		m = max(m, r.MaxSeq)
	}
	if tr.Legacy.Split {
		m = max(m, tr.Legacy.Hi)
	}
	return m
}

// A month's seqs all lie below the next month's first seq: seq and month
// are allocated together and the month only moves forward (invariants 1–2).
// Selection therefore trusts first seqs (ZSET scores, which only ever drop
// as rows land) and never the max_seq of the meta, which lags while a month
// still receives late events; probe months are always included.

// Before lists the months that may hold a seq < before, newest first.
func (tr TopicRoute) Before(before int64) []Month {
	var out []Month
	for _, r := range tr.Ranges {
		if r.MinSeq < before {
			out = append(out, r.Month)
		}
	}
	return newestFirst(append(out, tr.Probe...))
}

// Since lists the months that may hold a seq > since, oldest first.
func (tr TopicRoute) Since(since int64) []Month {
	var out []Month
	for i, r := range tr.Ranges {
		if i == len(tr.Ranges)-1 || tr.Ranges[i+1].MinSeq > since+1 {
			out = append(out, r.Month)
		}
	}
	out = append(out, tr.Probe...)
	slices.SortFunc(out, Month.Compare)
	return out
}

// BySeq lists the months that may hold seq, most likely first: the route
// month whose first seq is the largest not above seq, the month
// after it (its first seq may be stale-high while late rows land), then the
// probe months.
func (tr TopicRoute) BySeq(seq int64) []Month {
	var out []Month
	for i := len(tr.Ranges) - 1; i >= 0; i-- {
		if tr.Ranges[i].MinSeq <= seq {
			out = append(out, tr.Ranges[i].Month)
			if i+1 < len(tr.Ranges) {
				out = append(out, tr.Ranges[i+1].Month)
			}
			break
		}
	}
	if len(out) == 0 && len(tr.Ranges) > 0 {
		out = append(out, tr.Ranges[0].Month)
	}
	return append(out, newestFirst(slices.Clone(tr.Probe))...)
}

func newestFirst(ms []Month) []Month {
	slices.SortFunc(ms, func(a, b Month) int { return b.Compare(a) })
	return slices.Compact(ms)
}

// Route resolves the topic's months: the Redis route; if Redis has none, the
// MySQL mirror, refilled into Redis; if the mirror has none either, the
// active month and the FallbackMonths-1 before it (the caller queues a
// repair with QueueRepair if that scan finds rows).
func (r *Router) Route(ctx context.Context, tenant, topic string) (TopicRoute, error) {
	if err := ValidTopic(topic); err != nil {
		return TopicRoute{}, err
	}
	keys, err := r.p.KeySpace.Tenant(tenant)
	if err != nil {
		return TopicRoute{}, err
	}
	return r.RouteResolve(ctx, tenant, topic, r.p.Redis.DoMulti(ctx, r.RouteCmds(keys, topic)...))
}

// RouteCmds are the Redis reads of Route — the route and the bounds probes
// need (active month, routes-complete watermark) — for a caller that
// pipelines them with its own; RouteResolve finishes Route from their
// results. The topic must be valid.
func (r *Router) RouteCmds(keys Keys, topic string) []rueidis.Completed {
	return append(r.boundsCmds(keys), LoadCmds(r.p.Redis, keys, topic)...)
}

// RouteResolve is Route's answer from the results of RouteCmds.
func (r *Router) RouteResolve(ctx context.Context, tenant, topic string, res []rueidis.RedisResult) (TopicRoute, error) {
	active, complete, err := r.boundsResolve(ctx, res[:2])
	if err != nil {
		return TopicRoute{}, err
	}
	ranges, found, err := LoadResolve(tenant, topic, res[2:])
	if err != nil {
		return TopicRoute{}, err
	}
	tr := TopicRoute{Ranges: ranges, Source: RouteFromRedis}
	if !found {
		r.p.Metrics.RouteMiss.Inc()
		if tr, err = r.fromMirror(ctx, tenant, topic); err != nil {
			return TopicRoute{}, err
		}
	}
	registered, err := r.p.Catalog.Months(ctx, tenant)
	if err != nil {
		return TopicRoute{}, err
	}
	tr.Probe = ProbeMonths(tr.Ranges, SortedMonths(registered), active, complete, tr.Source == RouteFromFallback)
	if tr.Legacy, err = r.p.Migrations.Legacy(ctx, tenant, topic); err != nil {
		return TopicRoute{}, err
	}
	return tr, nil
}

func (r *Router) fromMirror(ctx context.Context, tenant, topic string) (TopicRoute, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return TopicRoute{}, err
	}
	ranges, err := LoadMirror(ctx, db, topic)
	if err != nil {
		r.p.Metrics.RouteRebuild.WithLabelValues("error").Inc()
		return TopicRoute{}, err
	}
	if len(ranges) == 0 {
		r.p.Metrics.RouteRebuild.WithLabelValues("empty").Inc()
		return TopicRoute{Source: RouteFromFallback}, nil
	}
	if err := r.p.Routes.Replace(ctx, tenant, topic, ranges); err != nil {
		// the read goes on from the mirror; the next one retries the refill
		r.p.Metrics.RouteRebuild.WithLabelValues("error").Inc()
		r.p.Log.Warn().Err(err).Str("tenant", tenant).Str("topic", topic).Msg("route refill from the mirror failed")
	} else {
		r.p.Metrics.RouteRebuild.WithLabelValues("ok").Inc()
	}
	return TopicRoute{Ranges: ranges, Source: RouteFromMirror}, nil
}

// bounds reads the active month (zero if Redis lost it: the Redis-time month
// stands in) and the "routes complete through" watermark (zero if unset).
func (r *Router) boundsCmds(keys Keys) []rueidis.Completed {
	return []rueidis.Completed{
		r.p.Redis.B().Get().Key(keys.ActiveMonth()).Build(),
		r.p.Redis.B().Zscore().Key(keys.RoutesComplete()).Member(routesCompleteMember).Build(),
	}
}

func (r *Router) boundsResolve(ctx context.Context, res []rueidis.RedisResult) (active, complete Month, err error) {
	if s, err := res[0].ToString(); err == nil {
		active, _ = ParseMonth(s)
	} else if !rueidis.IsRedisNil(err) {
		return Month{}, Month{}, fmt.Errorf("router: active month: %w", err)
	}
	if complete, err = watermark(res[1]); err != nil {
		return Month{}, Month{}, fmt.Errorf("router: routes watermark: %w", err)
	}
	if active.IsZero() {
		if active, err = NewClock(r.p.Redis).Month(ctx); err != nil {
			return Month{}, Month{}, err
		}
	}
	return active, complete, nil
}

// ProbeMonths picks the registered months a read must try beyond the known
// ranges, oldest first. With a fallback (no route at all) it is the active
// month and the FallbackMonths-1 registered months before it. Otherwise it
// is every registered month not in ranges, after the floor and not after
// active, where the floor is the "routes complete through" watermark, or
// without one the route's newest month: a topic idle for years with a
// current watermark probes nothing.
func ProbeMonths(ranges []MonthRange, registered []Month, active, complete Month, fallback bool) []Month {
	if fallback {
		var out []Month
		for _, m := range registered {
			if !m.After(active) && m.After(active.Add(-FallbackMonths)) {
				out = append(out, m)
			}
		}
		return out
	}
	floor := complete
	if floor.IsZero() && len(ranges) > 0 {
		floor = ranges[len(ranges)-1].Month
	}
	known := make(map[Month]bool, len(ranges))
	for _, r := range ranges {
		known[r.Month] = true
	}
	var out []Month
	for _, m := range registered {
		if m.After(floor) && !m.After(active) && !known[m] {
			out = append(out, m)
		}
	}
	return out
}

// tables turns months into registered tables; a month the catalog does not
// register is skipped (it can hold no rows: nothing writes an unregistered
// table), never queried.
func (r *Router) tables(ctx context.Context, tenant string, months []Month) ([]Table, error) {
	out := make([]Table, 0, len(months))
	for _, m := range months {
		t, _, err := r.p.Catalog.Table(ctx, tenant, m)
		if err != nil {
			if errors.Is(err, ErrShardNotRegistered) {
				continue
			}
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Tables is tables for callers that resolved a route themselves.
func (r *Router) Tables(ctx context.Context, tenant string, months []Month) ([]Table, error) {
	return r.tables(ctx, tenant, months)
}

// QueueRepair records that topic's route is missing from Redis and the
// mirror although its tables hold rows (found by a fallback scan): `imshard
// route check --fix` rebuilds it from the tables.
func (r *Router) QueueRepair(ctx context.Context, tenant, topic string) error {
	keys, err := r.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	return r.p.Redis.Do(ctx, r.p.Redis.B().Zadd().Key(keys.RouteRepair()).Nx().ScoreMember().
		ScoreMember(float64(time.Now().Unix()), topic).Build()).Error()
}

// RepairQueue lists the topics queued by QueueRepair.
func RepairQueue(ctx context.Context, rdb rueidis.Client, keys Keys) ([]string, error) {
	return rdb.Do(ctx, rdb.B().Zrange().Key(keys.RouteRepair()).Min("0").Max("-1").Build()).AsStrSlice()
}

// DoneRepair removes topic from the repair queue once its route is rebuilt.
func DoneRepair(ctx context.Context, rdb rueidis.Client, keys Keys, topic string) error {
	return rdb.Do(ctx, rdb.B().Zrem().Key(keys.RouteRepair()).Member(topic).Build()).Error()
}

// routesCompleteMember is the one member of the RoutesComplete ZSET; its
// score is the month (YYYYMM), so ZADD GT keeps the watermark monotonic
// without a script.
const routesCompleteMember = "month"

// MarkRoutesComplete advances the tenant's "routes complete through month
// m" watermark: persist calls it once every route of month m (and of every
// earlier month) is merged into Redis. Reads then probe only later months
// for rows a stale route may not know yet. It never moves back.
func MarkRoutesComplete(ctx context.Context, rdb rueidis.Client, keys Keys, m Month) error {
	if !m.Valid() {
		return fmt.Errorf("%w: %q", ErrInvalidMonth, m.String())
	}
	return rdb.Do(ctx, rdb.B().Zadd().Key(keys.RoutesComplete()).Gt().ScoreMember().
		ScoreMember(float64(m.Int()), routesCompleteMember).Build()).Error()
}

// RoutesComplete reads the watermark (zero if unset).
func RoutesComplete(ctx context.Context, rdb rueidis.Client, keys Keys) (Month, error) {
	return watermark(rdb.Do(ctx, rdb.B().Zscore().Key(keys.RoutesComplete()).Member(routesCompleteMember).Build()))
}

func watermark(res rueidis.RedisResult) (Month, error) {
	f, err := res.AsFloat64()
	if rueidis.IsRedisNil(err) {
		return Month{}, nil
	}
	if err != nil {
		return Month{}, err
	}
	return ParseMonth(strconv.Itoa(int(f)))
}

// LegacyDDL creates the legacy single table: the month
// template's columns under the fixed legacy name, for the migration source
// and the read benchmark's baseline.
func LegacyDDL() string {
	return strings.Replace(imsql.MonthTable(), imsql.TablePlaceholder, "`"+LegacyTable+"`", 1)
}
