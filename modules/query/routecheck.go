package query

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/routing"
)

// RouteCheck compares and repairs the three views of a topic's months: the
// Redis route, the MySQL mirror and the actual seq ranges in the month
// tables, which are the truth (invariant 6, docs/invariants.md).
type RouteCheck struct {
	Redis   rueidis.Client
	Routes  *routing.Routes
	Catalog *routing.Catalog
	DBs     routing.DBs
}

// Range is a MonthRange as JSON.
type Range struct {
	Month  string `json:"month"`
	MinSeq int64  `json:"min_seq"`
	MaxSeq int64  `json:"max_seq"`
	Count  int64  `json:"count"`
}

func toRanges(rs []routing.MonthRange) []Range {
	out := make([]Range, 0, len(rs))
	for _, r := range rs {
		out = append(out, Range{Month: r.Month.String(), MinSeq: r.MinSeq, MaxSeq: r.MaxSeq, Count: r.Count})
	}
	return out
}

// Difference is one month where a view disagrees with the tables.
type Difference struct {
	Topic string `json:"topic"`
	Month string `json:"month"`
	Store string `json:"store"` // "redis" or "mirror"
	Want  *Range `json:"want"`  // the tables (nil: no rows)
	Got   *Range `json:"got"`   // the view (nil: no entry)
}

func (d Difference) String() string {
	show := func(r *Range) string {
		if r == nil {
			return "none"
		}
		return fmt.Sprintf("min=%d max=%d count=%d", r.MinSeq, r.MaxSeq, r.Count)
	}
	return fmt.Sprintf("topic %s month %s: %s has %s, tables have %s", d.Topic, d.Month, d.Store, show(d.Got), show(d.Want))
}

// Compare lists every month where redis or mirror differs from tables.
func Compare(topic string, redis, mirror, tables []routing.MonthRange) []Difference {
	index := func(rs []routing.MonthRange) map[routing.Month]routing.MonthRange {
		m := make(map[routing.Month]routing.MonthRange, len(rs))
		for _, r := range rs {
			m[r.Month] = r
		}
		return m
	}
	rd, md, td := index(redis), index(mirror), index(tables)
	var months []routing.Month
	for _, src := range []map[routing.Month]routing.MonthRange{rd, md, td} {
		for m := range src {
			months = append(months, m)
		}
	}
	slices.SortFunc(months, routing.Month.Compare)
	months = slices.Compact(months)
	ptr := func(src map[routing.Month]routing.MonthRange, m routing.Month) *Range {
		r, ok := src[m]
		if !ok {
			return nil
		}
		return &toRanges([]routing.MonthRange{r})[0]
	}
	var out []Difference
	for _, m := range months {
		want := ptr(td, m)
		for _, v := range []struct {
			name string
			src  map[routing.Month]routing.MonthRange
		}{{"mirror", md}, {"redis", rd}} {
			got := ptr(v.src, m)
			if (want == nil) != (got == nil) || (want != nil && *want != *got) {
				out = append(out, Difference{Topic: topic, Month: m.String(), Store: v.name, Want: want, Got: got})
			}
		}
	}
	return out
}

// TopicState is the admin view of one topic's routes.
type TopicState struct {
	Topic       string       `json:"topic"`
	RedisFound  bool         `json:"redis_found"`
	Redis       []Range      `json:"redis"`
	Mirror      []Range      `json:"mirror"`
	Tables      []Range      `json:"tables"`
	Differences []Difference `json:"differences"`
}

// tables lists the tenant's registered month tables, oldest first.
func (c *RouteCheck) tables(ctx context.Context, tenant string) ([]routing.Table, error) {
	list, err := c.Catalog.List(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]routing.Table, 0, len(list))
	for _, s := range list {
		out = append(out, s.Table)
	}
	return out, nil
}

// actual reads the topic's real ranges: MIN/MAX/COUNT per month table, an
// index-only read of uk_topic_seq.
func actual(ctx context.Context, db *sql.DB, tables []routing.Table, topic string) ([]routing.MonthRange, error) {
	var out []routing.MonthRange
	for _, t := range tables {
		var lo, hi sql.NullInt64
		var n int64
		if err := sq.Select("MIN(seqid)", "MAX(seqid)", "COUNT(*)").From(t.Quoted()).Where(sq.Eq{"topic": topic}).
			RunWith(db).QueryRowContext(ctx).Scan(&lo, &hi, &n); err != nil {
			return nil, fmt.Errorf("route check: %s: %w", t.Name(), err)
		}
		if n > 0 {
			out = append(out, routing.MonthRange{Month: t.Month(), MinSeq: lo.Int64, MaxSeq: hi.Int64, Count: n})
		}
	}
	return out, nil
}

// Topic compares one topic's three views.
func (c *RouteCheck) Topic(ctx context.Context, tenant, topic string) (TopicState, error) {
	db, err := c.DBs.DB(ctx, tenant)
	if err != nil {
		return TopicState{}, err
	}
	tables, err := c.tables(ctx, tenant)
	if err != nil {
		return TopicState{}, err
	}
	redis, found, err := c.Routes.Load(ctx, tenant, topic)
	if err != nil {
		return TopicState{}, err
	}
	mirror, err := routing.LoadMirror(ctx, db, topic)
	if err != nil {
		return TopicState{}, err
	}
	act, err := actual(ctx, db, tables, topic)
	if err != nil {
		return TopicState{}, err
	}
	return TopicState{Topic: topic, RedisFound: found, Redis: toRanges(redis), Mirror: toRanges(mirror),
		Tables: toRanges(act), Differences: nonNilDiffs(Compare(topic, redis, mirror, act))}, nil
}

func nonNilDiffs(d []Difference) []Difference {
	if d == nil {
		return []Difference{}
	}
	return d
}

// CheckResult is what one check found and did.
type CheckResult struct {
	Topics      int
	Differences []Difference
	Fixed       int
}

// Check compares the given topics (all of the tenant's when empty: every
// topic in the tables, the mirror, Redis or the repair queue) and, with
// fix, rewrites the mirror and Redis of each differing topic from the
// tables. report is called for every difference as it is found.
func (c *RouteCheck) Check(ctx context.Context, tenant string, topics []string, fix bool, report func(Difference)) (CheckResult, error) {
	var res CheckResult
	db, err := c.DBs.DB(ctx, tenant)
	if err != nil {
		return res, err
	}
	tables, err := c.tables(ctx, tenant)
	if err != nil {
		return res, err
	}
	if len(topics) == 0 {
		if topics, err = c.allTopics(ctx, db, tenant, tables); err != nil {
			return res, err
		}
	}
	for _, topic := range topics {
		if err := routing.ValidTopic(topic); err != nil {
			return res, err
		}
		redis, _, err := c.Routes.Load(ctx, tenant, topic)
		if err != nil {
			return res, err
		}
		mirror, err := routing.LoadMirror(ctx, db, topic)
		if err != nil {
			return res, err
		}
		act, err := actual(ctx, db, tables, topic)
		if err != nil {
			return res, err
		}
		res.Topics++
		diffs := Compare(topic, redis, mirror, act)
		for _, d := range diffs {
			report(d)
		}
		res.Differences = append(res.Differences, diffs...)
		if fix && len(diffs) > 0 {
			if err := c.Fix(ctx, tenant, topic, act); err != nil {
				return res, err
			}
			res.Fixed++
		}
		if fix {
			if err := routing.DoneRepair(ctx, c.Redis, tenant, topic); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// allTopics is every topic any view knows, sorted.
func (c *RouteCheck) allTopics(ctx context.Context, db *sql.DB, tenant string, tables []routing.Table) ([]string, error) {
	set := map[string]bool{}
	add := func(rows *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var t string
			if err := rows.Scan(&t); err != nil {
				return err
			}
			set[t] = true
		}
		return rows.Err()
	}
	for _, t := range tables {
		if err := add(sq.Select("DISTINCT topic").From(t.Quoted()).RunWith(db).QueryContext(ctx)); err != nil {
			return nil, fmt.Errorf("route check: topics of %s: %w", t.Name(), err)
		}
	}
	mirrored, err := routing.MirrorTopics(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("route check: %w", err)
	}
	for _, t := range mirrored {
		set[t] = true
	}
	keys, err := routing.KeysFor(tenant)
	if err != nil {
		return nil, err
	}
	prefix := keys.Route("")
	for _, node := range c.Redis.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(keys.RoutePattern()).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return nil, fmt.Errorf("route check: scan routes: %w", err)
			}
			for _, k := range e.Elements {
				set[strings.TrimPrefix(k, prefix)] = true
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	queued, err := routing.RepairQueue(ctx, c.Redis, tenant)
	if err != nil {
		return nil, err
	}
	for _, t := range queued {
		set[t] = true
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	slices.Sort(out)
	return out, nil
}

// Fix rewrites the topic's mirror rows and Redis route from its actual
// ranges, in that order (MySQL first: Redis is rebuilt from it).
func (c *RouteCheck) Fix(ctx context.Context, tenant, topic string, act []routing.MonthRange) error {
	db, err := c.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	rows := make([]routing.MirrorRow, 0, len(act))
	for _, r := range act {
		t, err := routing.TableFor(r.Month)
		if err != nil {
			return err
		}
		var lo, hi sql.NullTime
		// idx_topic_created makes both ends an index-only read
		if err := sq.Select("MIN(created_at)", "MAX(created_at)").From(t.Quoted()).Where(sq.Eq{"topic": topic}).
			RunWith(tx).QueryRowContext(ctx).Scan(&lo, &hi); err != nil {
			return fmt.Errorf("route fix: times of %s in %s: %w", topic, t.Name(), err)
		}
		rows = append(rows, routing.MirrorRow{Topic: topic, MonthRange: r, MinCreatedAt: lo.Time, MaxCreatedAt: hi.Time})
	}
	if err := routing.ReplaceMirror(ctx, tx, topic, rows); err != nil {
		return fmt.Errorf("route fix: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if len(act) == 0 {
		return c.Routes.Delete(ctx, tenant, topic)
	}
	return c.Routes.Replace(ctx, tenant, topic, act)
}

// Rebuild refills Redis routes from the mirror: the given topics, or every
// topic of the mirror when topics is empty. progress is called after each
// topic with the count done and the total.
func (c *RouteCheck) Rebuild(ctx context.Context, tenant string, topics []string, progress func(done, total int)) error {
	db, err := c.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	if len(topics) == 0 {
		if topics, err = routing.MirrorTopics(ctx, db); err != nil {
			return fmt.Errorf("route rebuild: %w", err)
		}
	}
	for i, topic := range topics {
		if err := routing.ValidTopic(topic); err != nil {
			return err
		}
		ranges, err := routing.LoadMirror(ctx, db, topic)
		if err != nil {
			return err
		}
		if len(ranges) == 0 {
			err = c.Routes.Delete(ctx, tenant, topic)
		} else {
			err = c.Routes.Replace(ctx, tenant, topic, ranges)
		}
		if err != nil {
			return err
		}
		progress(i+1, len(topics))
	}
	return nil
}
