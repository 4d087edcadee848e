// Package routecheck compares and repairs the three views of a topic's months — the
// Redis route, the MySQL mirror and the month tables' actual seq ranges — for `imshard
// route check|rebuild`, a restore's route rebuild and the admin route view.
package routecheck

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/routing"
)

// Checker compares and repairs the three views of a topic's months: the
// Redis route, the MySQL mirror and the actual seq ranges in the month
// tables, which are the truth (invariant 6, docs/invariants.md).
type Checker struct {
	Redis    rueidis.Client
	KeySpace routing.KeySpace // redis.key_prefix: where every key and channel is named
	Routes   *routing.Routes
	Catalog  *routing.Catalog
	DBs      routing.DBs
	// Archives answers an archived month's actual ranges from its archive
	// (its table may be gone); nil fails the check of a tenant with an
	// archived month.
	Archives ArchivedMonths
}

// ArchivedMonths reads what an archived month holds without its table.
type ArchivedMonths interface {
	// TopicRanges is every topic's seq range, row count and created_at
	// span in tenant's archived month m, as its archive recorded them.
	TopicRanges(ctx context.Context, tenant string, m routing.Month) ([]routing.MirrorRow, error)
}

// errNoArchives fails the check of an archived month in a checker built
// without an archive reader.
var errNoArchives = errors.New("route check: the month is archived and no archive reader is configured")

// month is one registered month as the check reads it: its table, or,
// archived, the topics' ranges its archive recorded (an archived month
// takes no rows, and its table may be gone).
type month struct {
	t        routing.Table
	archived map[string]routing.MirrorRow // nil: the month is read from its table
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
	// Legacy is set while the tenant's migration has copied legacy rows
	// the route mirror does not hold yet: Tables is then the month tables'
	// rows above the topic's cutover_seq, and these are the rest.
	Legacy *LegacyPart `json:"legacy,omitempty"`
}

// LegacyPart is the part of a topic's month-table rows a migration copied
// from the legacy table (seqs up to cutover_seq) while its route mirror
// and Redis route know only the seqs above it — all the dual read asks of
// them until the pass after the copy adds the rest. The route check leaves
// it out of the comparison and reports it as legacy, not missing.
type LegacyPart struct {
	CutoverSeq int64   `json:"cutover_seq"`
	Tables     []Range `json:"tables"`
}

// tables lists the tenant's registered months, oldest first, each
// archived one with its archive's ranges.
func (c *Checker) tables(ctx context.Context, tenant string) ([]month, error) {
	list, err := c.Catalog.List(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]month, 0, len(list))
	for _, s := range list {
		m := month{t: s.Table}
		if s.Status == routing.StatusArchived {
			if c.Archives == nil {
				return nil, fmt.Errorf("%w: %s", errNoArchives, s.Month)
			}
			rows, err := c.Archives.TopicRanges(ctx, tenant, s.Month)
			if err != nil {
				return nil, fmt.Errorf("route check: archive of %s: %w", s.Month, err)
			}
			m.archived = make(map[string]routing.MirrorRow, len(rows))
			for _, r := range rows {
				m.archived[r.Topic] = r
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// archivedRow is the topic's range in archived month m within seqs (nil,
// or the seqid bound of compareTopic and fixSeqs): the manifest has only
// the whole range, so a bound that cuts through it fails.
func archivedRow(m month, topic string, seqs sq.Sqlizer) (routing.MirrorRow, bool, error) {
	r, ok := m.archived[topic]
	if !ok || seqs == nil {
		return r, ok, nil
	}
	var in bool
	switch b := seqs.(type) {
	case sq.Gt:
		lo := b["seqid"].(int64)
		if r.MinSeq <= lo && r.MaxSeq > lo {
			return r, false, fmt.Errorf("route check: archived month %s of %s straddles seq %d", m.t.Month(), topic, lo)
		}
		in = r.MinSeq > lo
	case sq.LtOrEq:
		hi := b["seqid"].(int64)
		if r.MinSeq <= hi && r.MaxSeq > hi {
			return r, false, fmt.Errorf("route check: archived month %s of %s straddles seq %d", m.t.Month(), topic, hi)
		}
		in = r.MaxSeq <= hi
	default:
		return r, false, fmt.Errorf("route check: archived month %s: unsupported seq bound %T", m.t.Month(), seqs)
	}
	return r, in, nil
}

// actual reads the topic's real ranges: MIN/MAX/COUNT per month table, an
// index-only read of uk_topic_seq; seqs, if not nil, bounds the seqs read.
func actual(ctx context.Context, db *sql.DB, tables []month, topic string, seqs sq.Sqlizer) ([]routing.MonthRange, error) {
	rows, err := actualRows(ctx, db, tables, topic, false, seqs)
	out := make([]routing.MonthRange, len(rows))
	for i, r := range rows {
		out[i] = r.MonthRange
	}
	return out, err
}

// actualRows reads the topic's real ranges as mirror rows. forFix adds the
// created_at bounds and reads with shared locks (in the caller's
// transaction): the latest committed rows, and no new row of the topic in
// these tables until the transaction ends. An archived month's range is
// its archive's (no row reaches an archived month).
func actualRows(ctx context.Context, db sq.BaseRunner, tables []month, topic string, forFix bool, seqs sq.Sqlizer) ([]routing.MirrorRow, error) {
	var out []routing.MirrorRow
	for _, m := range tables {
		t := m.t
		if m.archived != nil {
			r, ok, err := archivedRow(m, topic, seqs)
			if err != nil {
				return nil, err
			}
			if ok {
				if !forFix {
					r.MinCreatedAt, r.MaxCreatedAt = time.Time{}, time.Time{}
				}
				out = append(out, r)
			}
			continue
		}
		var lo, hi sql.NullInt64
		var first, last sql.NullTime
		var n int64
		q := sq.Select("MIN(seqid)", "MAX(seqid)", "COUNT(*)").From(t.Quoted()).Where(sq.Eq{"topic": topic})
		if seqs != nil {
			q = q.Where(seqs)
		}
		dest := []any{&lo, &hi, &n}
		if forFix {
			q = q.Columns("MIN(created_at)", "MAX(created_at)").Suffix("LOCK IN SHARE MODE")
			dest = append(dest, &first, &last)
		}
		if err := q.RunWith(db).QueryRowContext(ctx).Scan(dest...); err != nil {
			return nil, fmt.Errorf("route check: %s: %w", t.Name(), err)
		}
		if n > 0 {
			out = append(out, routing.MirrorRow{Topic: topic, MonthRange: routing.MonthRange{Month: t.Month(), MinSeq: lo.Int64, MaxSeq: hi.Int64, Count: n},
				MinCreatedAt: first.Time, MaxCreatedAt: last.Time})
		}
	}
	return out, nil
}

// Topic compares one topic's three views.
func (c *Checker) Topic(ctx context.Context, tenant, topic string) (TopicState, error) {
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
	m, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return TopicState{}, err
	}
	cmp, err := compareTopic(ctx, db, tables, m, topic, redis, mirror)
	if err != nil {
		return TopicState{}, err
	}
	st := TopicState{Topic: topic, RedisFound: found, Redis: toRanges(redis), Mirror: toRanges(mirror),
		Tables: toRanges(cmp.tables), Differences: nonNilDiffs(cmp.diffs)}
	if cmp.legacy != nil {
		st.Legacy = &LegacyPart{CutoverSeq: cmp.cutoverSeq, Tables: toRanges(cmp.legacy)}
	}
	return st, nil
}

// compared is one topic's comparison.
type compared struct {
	tables     []routing.MonthRange // what the views are compared with
	diffs      []Difference
	cutoverSeq int64                // while a migration's copy is outside the mirror
	legacy     []routing.MonthRange // the copied rows up to cutoverSeq (nil: none)
}

// compareTopic compares a topic's Redis route and mirror with its month
// tables. While the tenant's migration has copied legacy rows the mirror
// does not hold yet (after cutover, until the pass after the copy rebuilt
// the routes), the views are compared with the rows above the topic's
// cutover_seq, the rows up to it are returned apart as legacy; a view the
// pass already widened (it goes topic by topic) is compared with every row.
func compareTopic(ctx context.Context, db *sql.DB, tables []month, m routing.Migration, topic string, redis, mirror []routing.MonthRange) (compared, error) {
	var out compared
	if m.State.AfterCutover() && !m.RoutesDone {
		seq, err := routing.CutoverSeq(ctx, db, topic)
		if err != nil {
			return out, err
		}
		out.cutoverSeq = seq
	}
	if out.cutoverSeq == 0 {
		act, err := actual(ctx, db, tables, topic, nil)
		out.tables, out.diffs = act, Compare(topic, redis, mirror, act)
		return out, err
	}
	above, err := actual(ctx, db, tables, topic, sq.Gt{"seqid": out.cutoverSeq})
	if err != nil {
		return out, err
	}
	legacy, err := actual(ctx, db, tables, topic, sq.LtOrEq{"seqid": out.cutoverSeq})
	if err != nil {
		return out, err
	}
	out.tables = above
	if len(legacy) == 0 {
		out.diffs = Compare(topic, redis, mirror, above)
		return out, nil
	}
	out.legacy = legacy
	partial, whole := Compare(topic, redis, mirror, above), Compare(topic, redis, mirror, joinRanges(above, legacy))
	for _, store := range []string{"mirror", "redis"} {
		if d := storeDiffs(partial, store); len(d) > 0 && len(storeDiffs(whole, store)) > 0 {
			out.diffs = append(out.diffs, d...)
		}
	}
	return out, nil
}

// joinRanges is the per-month ranges of two disjoint sets of a topic's
// rows (the seqs above and up to cutover_seq) taken together: what one read
// of every row would give, without reading the rows a third time.
func joinRanges(a, b []routing.MonthRange) []routing.MonthRange {
	out := slices.Clone(a)
	for _, r := range b {
		i := slices.IndexFunc(out, func(o routing.MonthRange) bool { return o.Month == r.Month })
		if i < 0 {
			out = append(out, r)
			continue
		}
		o := &out[i]
		o.MinSeq, o.MaxSeq, o.Count = min(o.MinSeq, r.MinSeq), max(o.MaxSeq, r.MaxSeq), o.Count+r.Count
	}
	return out
}

// storeDiffs keeps the differences of one store.
func storeDiffs(ds []Difference, store string) []Difference {
	var out []Difference
	for _, d := range ds {
		if d.Store == store {
			out = append(out, d)
		}
	}
	return out
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
	// Migration is the tenant's migration state; Legacy counts the topics
	// whose copied legacy rows were left out of the comparison (the
	// migration's route pass adds them to the mirror after the copy).
	Migration routing.MigrationState
	Legacy    int
}

// Check compares the given topics (all of the tenant's when empty: every
// topic in the tables, the mirror, Redis or the repair queue) and, with
// fix, rewrites the mirror and Redis of each differing topic from the
// tables. report is called for every difference as it is found.
func (c *Checker) Check(ctx context.Context, tenant string, topics []string, fix bool, report func(Difference)) (CheckResult, error) {
	var res CheckResult
	keys, err := c.KeySpace.Tenant(tenant)
	if err != nil {
		return res, err
	}
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
	m, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return res, err
	}
	res.Migration = m.State
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
		cmp, err := compareTopic(ctx, db, tables, m, topic, redis, mirror)
		if err != nil {
			return res, err
		}
		res.Topics++
		if cmp.legacy != nil {
			res.Legacy++
		}
		diffs := cmp.diffs
		for _, d := range diffs {
			report(d)
		}
		res.Differences = append(res.Differences, diffs...)
		if fix && len(diffs) > 0 {
			if err := c.Fix(ctx, tenant, topic); err != nil {
				return res, err
			}
			res.Fixed++
		}
		if fix {
			if err := routing.DoneRepair(ctx, c.Redis, keys, topic); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// allTopics is every topic any view knows, sorted.
func (c *Checker) allTopics(ctx context.Context, db *sql.DB, tenant string, tables []month) ([]string, error) {
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
	for _, m := range tables {
		for topic := range m.archived {
			set[topic] = true
		}
		if m.archived != nil {
			continue
		}
		if err := add(sq.Select("DISTINCT topic").From(m.t.Quoted()).RunWith(db).QueryContext(ctx)); err != nil {
			return nil, fmt.Errorf("route check: topics of %s: %w", m.t.Name(), err)
		}
	}
	mirrored, err := routing.MirrorTopics(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("route check: %w", err)
	}
	for _, t := range mirrored {
		set[t] = true
	}
	keys, err := c.KeySpace.Tenant(tenant)
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
	queued, err := routing.RepairQueue(ctx, c.Redis, keys)
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
// ranges (while a migration's mirror pass has yet to add the topic's
// legacy rows, from the rows above its cutover_seq: see fixSeqs). It is safe while persist stores rows of the topic: in one
// transaction it reads the ranges of every month table with shared locks
// (a locking read sees every committed row and keeps new rows of the topic
// out until it ends) and rewrites the mirror rows, then replaces the Redis
// route before committing, so a batch that waited for the locks merges its
// rows into the new route after it. A batch committed just before the read
// may still merge its rows into Redis afterwards: the ranges stay exact, its
// count is added twice until the next check.
func (c *Checker) Fix(ctx context.Context, tenant, topic string) error {
	db, err := c.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	tables, err := c.tables(ctx, tenant)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err := c.fixTx(ctx, db, tables, tenant, topic)
		var me *mysql.MySQLError
		if err == nil || attempt == fixAttempts || !errors.As(err, &me) || (me.Number != 1213 && me.Number != 1205) {
			return err
		}
		// a deadlock or lock wait timeout against concurrent writers: again
	}
}

// fixAttempts bounds the retries of a fix that lost a deadlock.
const fixAttempts = 5

func (c *Checker) fixTx(ctx context.Context, db *sql.DB, tables []month, tenant, topic string) error {
	return routing.Fenced(ctx, db, func(tx *sql.Tx) error { return c.fixIn(ctx, tx, tables, tenant, topic) })
}

func (c *Checker) fixIn(ctx context.Context, tx *sql.Tx, tables []month, tenant, topic string) error {
	seqs, err := fixSeqs(ctx, tx, topic)
	if err != nil {
		return err
	}
	rows, err := actualRows(ctx, tx, tables, topic, true, seqs)
	if err != nil {
		return err
	}
	if err := routing.ReplaceMirror(ctx, tx, topic, rows); err != nil {
		return fmt.Errorf("route fix: %w", err)
	}
	if len(rows) == 0 {
		err = c.Routes.Delete(ctx, tenant, topic)
	} else {
		act := make([]routing.MonthRange, len(rows))
		for i, r := range rows {
			act[i] = r.MonthRange
		}
		err = c.Routes.Replace(ctx, tenant, topic, act)
	}
	return err
}

// fixSeqs bounds the rows a fix writes into the mirror and Redis route:
// every row (nil), except while the tenant's migration copies legacy rows
// its mirror pass will add by their counts (after cutover, routes not
// rebuilt, every copied row inserted by the batches) to a topic the pass
// has not reached: then only the rows above the topic's cutover_seq — what
// compareTopic compares with — or the pass would count the legacy rows a
// second time. Once a verification ran (routes_done is set by then) or a
// batch found rows already present, the pass recomputes each topic from
// all its rows instead (through Fix), so all rows are right.
//
// The pass widens a chunk of topics in one transaction that first moves
// its progress (im_migration_mirror). The locking read of that progress
// here, before the month tables are read, orders the fix against the
// chunk that covers the topic: if the chunk committed first, the progress
// says the topic was reached and the fix writes all rows, which the chunk
// can no longer add to; if not, the chunk's progress update waits for
// this transaction, so the mirror holds the rows above cutover_seq when
// the chunk adds the legacy rows to it. The migration row itself is read
// from the snapshot: its fields that matter only move towards "all rows"
// (rows_present grows, routes_done is set once the pass is over), and
// the progress read decides the race that counts.
func fixSeqs(ctx context.Context, tx *sql.Tx, topic string) (sq.Sqlizer, error) {
	m, err := routing.LoadMigration(ctx, tx)
	if err != nil {
		return nil, err
	}
	if !m.State.AfterCutover() || m.RoutesDone || m.RowsPresent > 0 {
		return nil, nil
	}
	done, err := routing.MirrorProgress(ctx, tx)
	if err != nil {
		return nil, err
	}
	if topic <= done {
		return nil, nil
	}
	seq, err := routing.CutoverSeq(ctx, tx, topic)
	if err != nil || seq == 0 {
		return nil, err
	}
	return sq.Gt{"seqid": seq}, nil
}

// Rebuild refills Redis routes from the mirror: the given topics, or every
// topic of the mirror when topics is empty. progress is called after each
// topic with the count done and the total.
func (c *Checker) Rebuild(ctx context.Context, tenant string, topics []string, progress func(done, total int)) error {
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
