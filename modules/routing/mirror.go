package routing

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	sq "github.com/Masterminds/squirrel"
)

// The route mirror (im_group_message_topic_shards) holds, per topic and
// month, the seq range, the row count and the created_at bounds of the
// topic's rows in that month's table. It is the durable source the Redis
// routes are rebuilt from. This file is the only code that reads or writes
// it: persist widens it in the transaction that stores rows, reads and the
// route checker load it, the checker rewrites it from the month tables.
const mirrorTable = "im_group_message_topic_shards"

var mirrorColumns = []string{"topic", "shard_month", "min_seq", "max_seq", "message_count", "min_created_at", "max_created_at"}

// MirrorRow is one row of the route mirror.
type MirrorRow struct {
	Topic string
	MonthRange
	MinCreatedAt, MaxCreatedAt time.Time
}

// LoadMirror reads the topic's ranges from the MySQL mirror, oldest first.
func LoadMirror(ctx context.Context, db sq.BaseRunner, topic string) ([]MonthRange, error) {
	rows, err := LoadMirrorRows(ctx, db, topic)
	if err != nil {
		return nil, err
	}
	out := make([]MonthRange, len(rows))
	for i, r := range rows {
		out[i] = r.MonthRange
	}
	return out, nil
}

// LoadMirrorRows reads the topic's mirror rows with their time bounds,
// oldest month first.
func LoadMirrorRows(ctx context.Context, db sq.BaseRunner, topic string) ([]MirrorRow, error) {
	rows, err := sq.Select(mirrorColumns[1:]...).From(mirrorTable).
		Where(sq.Eq{"topic": topic}).OrderBy("shard_month").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("mirror: load %s: %w", topic, err)
	}
	defer rows.Close()
	var out []MirrorRow
	for rows.Next() {
		var ms string
		r := MirrorRow{Topic: topic}
		if err := rows.Scan(&ms, &r.MinSeq, &r.MaxSeq, &r.Count, &r.MinCreatedAt, &r.MaxCreatedAt); err != nil {
			return nil, fmt.Errorf("mirror: load %s: %w", topic, err)
		}
		if r.Month, err = ParseMonth(ms); err != nil {
			return nil, fmt.Errorf("mirror: %s: %w", topic, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// mirrorBatch is the most topics one statement of LoadMirrorMany names.
const mirrorBatch = 500

// TopicMirror is what the mirror says of one topic: its rows, oldest month
// first, and when persist last widened any of them.
type TopicMirror struct {
	Rows      []MirrorRow
	ChangedAt time.Time
}

// LastSeq is the highest stored seq (0 for none).
func (t TopicMirror) LastSeq() int64 {
	var m int64
	for _, r := range t.Rows {
		m = max(m, r.MaxSeq)
	}
	return m
}

// LastAt is the newest stored created_at (zero for none).
func (t TopicMirror) LastAt() time.Time {
	var m time.Time
	for _, r := range t.Rows {
		if r.MaxCreatedAt.After(m) {
			m = r.MaxCreatedAt
		}
	}
	return m
}

// LoadMirrorMany reads the mirror rows of many topics (a user's topic
// list), one statement per mirrorBatch topics; a topic with no stored
// message is absent from the map.
func LoadMirrorMany(ctx context.Context, db sq.BaseRunner, topics []string) (map[string]TopicMirror, error) {
	out := make(map[string]TopicMirror, len(topics))
	for lo := 0; lo < len(topics); lo += mirrorBatch {
		part := topics[lo:min(len(topics), lo+mirrorBatch)]
		if err := loadMirrorPart(ctx, db, part, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func loadMirrorPart(ctx context.Context, db sq.BaseRunner, topics []string, out map[string]TopicMirror) error {
	rows, err := sq.Select(append(slices.Clone(mirrorColumns), "updated_at")...).From(mirrorTable).
		Where(sq.Eq{"topic": topics}).OrderBy("topic", "shard_month").RunWith(db).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("mirror: load many: %w", err)
	}
	return ScanMirror(rows, out)
}

// MirrorOf selects the mirror rows (as s) of the topics that from — a
// table or join naming a topic column that on compares with s.topic —
// names where where holds: a user's topics read in one statement of fixed
// shape (a prepared statement the caller may cache), whatever their
// number. ScanMirror reads its rows.
func MirrorOf(from, on string, where sq.Sqlizer) sq.SelectBuilder {
	cols := make([]string, 0, len(mirrorColumns)+1)
	for _, c := range append(slices.Clone(mirrorColumns), "updated_at") {
		cols = append(cols, "s."+c)
	}
	return sq.Select(cols...).From(from).Join(mirrorTable+" AS s ON s.topic = "+on).Where(where).
		OrderBy("s.topic", "s.shard_month")
}

// ScanMirror adds the rows of a mirror read (LoadMirrorMany's, MirrorOf's:
// ordered by topic and month) to out and closes them.
func ScanMirror(rows *sql.Rows, out map[string]TopicMirror) error {
	defer rows.Close()
	for rows.Next() {
		var ms string
		var r MirrorRow
		var changed time.Time
		if err := rows.Scan(&r.Topic, &ms, &r.MinSeq, &r.MaxSeq, &r.Count, &r.MinCreatedAt, &r.MaxCreatedAt, &changed); err != nil {
			return fmt.Errorf("mirror: load many: %w", err)
		}
		m, err := ParseMonth(ms)
		if err != nil {
			return fmt.Errorf("mirror: %s: %w", r.Topic, err)
		}
		r.Month = m
		t := out[r.Topic]
		t.Rows = append(t.Rows, r)
		if changed.After(t.ChangedAt) {
			t.ChangedAt = changed
		}
		out[r.Topic] = t
	}
	return rows.Err()
}

// LastStoredSeq is the topic's highest stored seq (0 for none).
func LastStoredSeq(ctx context.Context, db sq.BaseRunner, topic string) (int64, error) {
	var last sql.NullInt64
	if err := sq.Select("MAX(max_seq)").From(mirrorTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&last); err != nil {
		return 0, fmt.Errorf("mirror: last seq of %s: %w", topic, err)
	}
	return last.Int64, nil
}

// WidenMirror adds rows just stored to the mirror, in the caller's
// transaction: each row widens its topic's range and times in its month and
// adds its count (one statement; rows in topic order, the order every writer
// locks mirror rows in, so concurrent writers do not deadlock on them).
func WidenMirror(ctx context.Context, tx *sql.Tx, rows []MirrorRow) error {
	if len(rows) == 0 {
		return nil
	}
	q := sq.Insert(mirrorTable).Columns(mirrorColumns...)
	for _, r := range rows {
		q = q.Values(r.Topic, r.Month.String(), r.MinSeq, r.MaxSeq, r.Count, r.MinCreatedAt, r.MaxCreatedAt)
	}
	if _, err := q.Suffix(widenMirror).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mirror: widen: %w", err)
	}
	return nil
}

// widenMirror merges a row into the mirror row of its topic and month.
const widenMirror = `ON DUPLICATE KEY UPDATE
  min_seq = LEAST(min_seq, VALUES(min_seq)),
  max_seq = GREATEST(max_seq, VALUES(max_seq)),
  message_count = message_count + VALUES(message_count),
  min_created_at = LEAST(min_created_at, VALUES(min_created_at)),
  max_created_at = GREATEST(max_created_at, VALUES(max_created_at))`

// WidenMirrorFrom is WidenMirror for rows computed on the server: sel
// yields the mirror's columns (topic, month, min and max seq, count, min
// and max created_at) grouped by topic and month — the migration's
// backfill widens by the legacy rows it just copied without reading them
// into imshard. Rows are merged in topic order, as every writer locks
// mirror rows.
func WidenMirrorFrom(ctx context.Context, tx *sql.Tx, sel sq.SelectBuilder) error {
	if _, err := sq.Insert(mirrorTable).Columns(mirrorColumns...).Select(sel.OrderBy("1", "2")).
		Suffix(widenMirror).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mirror: widen: %w", err)
	}
	return nil
}

// ReplaceMirror makes the topic's mirror rows exactly rows (the route
// checker's fix, in its transaction).
func ReplaceMirror(ctx context.Context, tx *sql.Tx, topic string, rows []MirrorRow) error {
	if _, err := sq.Delete(mirrorTable).Where(sq.Eq{"topic": topic}).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mirror: clear %s: %w", topic, err)
	}
	if len(rows) == 0 {
		return nil
	}
	q := sq.Insert(mirrorTable).Columns(mirrorColumns...)
	for _, r := range rows {
		q = q.Values(topic, r.Month.String(), r.MinSeq, r.MaxSeq, r.Count, r.MinCreatedAt, r.MaxCreatedAt)
	}
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mirror: rewrite %s: %w", topic, err)
	}
	return nil
}

// ClearMirror empties the mirror and the migration's mirror pass
// (`imshard bench migrate` before copying the same legacy rows again).
func ClearMirror(ctx context.Context, tx *sql.Tx) error {
	for _, t := range []string{mirrorTable, migrationMirrorTable} {
		if _, err := sq.Delete(t).RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("mirror: clear %s: %w", t, err)
		}
	}
	return nil
}

// MirrorTopics lists every topic the mirror knows, sorted.
func MirrorTopics(ctx context.Context, db sq.BaseRunner) ([]string, error) {
	rows, err := sq.Select("DISTINCT topic").From(mirrorTable).OrderBy("topic").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("mirror: topics: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("mirror: topics: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// MirrorFromTable adds the mirror rows of every topic in month table t,
// computed from its rows (benchmark fixtures, built in bulk).
func MirrorFromTable(ctx context.Context, tx *sql.Tx, t Table) error {
	if _, err := sq.Insert(mirrorTable).Columns(mirrorColumns...).
		Select(sq.Select("topic").Column("?", t.Month().String()).
			Columns("MIN(seqid)", "MAX(seqid)", "COUNT(*)", "MIN(created_at)", "MAX(created_at)").
			From(t.Quoted()).GroupBy("topic")).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mirror: from %s: %w", t.Name(), err)
	}
	return nil
}

// MonthTotal is the mirror's sum over one month: rows and created_at span.
type MonthTotal struct {
	Count                      int64
	MinCreatedAt, MaxCreatedAt sql.NullTime
}

// MirrorMonthTotals sums the mirror rows of months.
func MirrorMonthTotals(ctx context.Context, db sq.BaseRunner, months []Month) (map[Month]MonthTotal, error) {
	names := make([]string, len(months))
	for i, m := range months {
		names[i] = m.String()
	}
	rows, err := sq.Select("shard_month", "SUM(message_count)", "MIN(min_created_at)", "MAX(max_created_at)").
		From(mirrorTable).Where(sq.Eq{"shard_month": names}).GroupBy("shard_month").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("mirror: month totals: %w", err)
	}
	defer rows.Close()
	out := map[Month]MonthTotal{}
	for rows.Next() {
		var ms string
		var t MonthTotal
		if err := rows.Scan(&ms, &t.Count, &t.MinCreatedAt, &t.MaxCreatedAt); err != nil {
			return nil, fmt.Errorf("mirror: month totals: %w", err)
		}
		if m, err := ParseMonth(ms); err == nil {
			out[m] = t
		}
	}
	return out, rows.Err()
}

// MirrorMonthRows reads every topic's mirror row of month m, in topic
// order.
func MirrorMonthRows(ctx context.Context, db sq.BaseRunner, m Month) ([]MirrorRow, error) {
	rows, err := sq.Select(mirrorColumns...).From(mirrorTable).Where(sq.Eq{"shard_month": m.String()}).
		OrderBy("topic").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("mirror: month %s: %w", m, err)
	}
	defer rows.Close()
	var out []MirrorRow
	for rows.Next() {
		var r MirrorRow
		var ms string
		if err := rows.Scan(&r.Topic, &ms, &r.MinSeq, &r.MaxSeq, &r.Count, &r.MinCreatedAt, &r.MaxCreatedAt); err != nil {
			return nil, fmt.Errorf("mirror: month %s: %w", m, err)
		}
		r.Month = m
		out = append(out, r)
	}
	return out, rows.Err()
}

// DropMirrorRows removes the mirror rows of topics in month m (all of the
// month's when topics is empty), at most limit rows per statement, and
// reports how many went.
func DropMirrorRows(ctx context.Context, tx *sql.Tx, m Month, topics []string, limit uint64) (int64, error) {
	q := sq.Delete(mirrorTable).Where(sq.Eq{"shard_month": m.String()})
	if len(topics) > 0 {
		q = q.Where(sq.Eq{"topic": topics})
	}
	res, err := q.Limit(limit).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("mirror: drop %s: %w", m, err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}
