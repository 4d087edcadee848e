package routing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sq "github.com/Masterminds/squirrel"
)

// LegacyColumns are the legacy table's columns, in the month template's
// order, with the types they must have (information_schema DATA_TYPE;
// JSON columns read as longtext on MariaDB): what a migration copies.
var LegacyColumns = []struct{ Name, Type string }{
	{"message_id", "bigint"}, {"topic", "varchar"}, {"group_id", "bigint"}, {"seqid", "bigint"},
	{"from_user", "bigint"}, {"client_msg_id", "varchar"}, {"msg_type", "varchar"}, {"status", "varchar"},
	{"content", "json"}, {"head", "json"}, {"mentioned_user_ids", "json"}, {"mention_all", "tinyint"},
	{"reply_seqid", "bigint"}, {"root_seqid", "bigint"}, {"file_count", "int"}, {"content_size", "int"},
	{"has_risk", "tinyint"}, {"audit_status", "varchar"}, {"version", "int"}, {"recalled_at", "datetime"},
	{"recalled_by", "bigint"}, {"deleted_at", "datetime"}, {"expires_at", "datetime"}, {"created_at", "datetime"},
	{"updated_at", "datetime"},
}

// LegacyColumnNames are the names of LegacyColumns.
func LegacyColumnNames() []string {
	out := make([]string, len(LegacyColumns))
	for i, c := range LegacyColumns {
		out[i] = c.Name
	}
	return out
}

// LegacyMonth is the month table the backfill copies topic's legacy seq
// into: the month its recorded splits assign it (zero if the topic has
// none: it had no legacy rows at cutover).
func LegacyMonth(ctx context.Context, db sq.BaseRunner, topic string, seq int64) (Month, error) {
	splits, err := LoadSplits(ctx, db, []string{topic})
	if err != nil {
		return Month{}, err
	}
	return MonthOfSeq(splits[topic], seq), nil
}

// CopyLegacyRow is a change's first step for a seq the legacy table still
// answers for (after cutover, before finish): in the change's transaction
// it locks the legacy row and copies it into t, its month table, unless
// the backfill copied it already (the same no-op upsert as the backfill,
// which counts the row as present when it comes to it). found is false
// when the legacy table has no such row. The change then writes the month
// row and the legacy row alike (LegacyQuoted), so the dual read, a later
// backfill batch and the verification all see the changed row.
func CopyLegacyRow(ctx context.Context, tx *sql.Tx, t Table, topic string, seq int64) (found bool, err error) {
	var id int64
	err = sq.Select("message_id").From(LegacyQuoted()).Where(sq.Eq{"topic": topic, "seqid": seq}).
		Suffix("FOR UPDATE").RunWith(tx).QueryRowContext(ctx).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("migration: lock the legacy row %s/%d: %w", topic, seq, err)
	}
	cols := LegacyColumnNames()
	if _, err := sq.Insert(t.Quoted()).Columns(cols...).
		Select(sq.Select(cols...).From(LegacyQuoted()).Where(sq.Eq{"message_id": id})).
		Suffix("ON DUPLICATE KEY UPDATE message_id = " + t.Quoted() + ".message_id").RunWith(tx).ExecContext(ctx); err != nil {
		return false, fmt.Errorf("migration: copy the legacy row %s/%d into %s: %w", topic, seq, t.Name(), err)
	}
	return true, nil
}

// RecordPlanMonths remembers the month tables a plan created (abort drops
// those still empty).
func RecordPlanMonths(ctx context.Context, db TxBeginner, months []Month) error {
	if len(months) == 0 {
		return nil
	}
	ins := sq.Insert(migrationMonthsTable).Columns("shard_month")
	for _, m := range months {
		ins = ins.Values(m.String())
	}
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := ins.Suffix("ON DUPLICATE KEY UPDATE shard_month = shard_month").RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("migration: record the plan's months: %w", err)
	}
	return nil
}

// PlanMonths lists the month tables the plan created, oldest first.
func PlanMonths(ctx context.Context, db sq.BaseRunner) ([]Month, error) {
	rows, err := sq.Select("shard_month").From(migrationMonthsTable).OrderBy("shard_month").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration: the plan's months: %w", err)
	}
	defer rows.Close()
	var out []Month
	for rows.Next() {
		var ms string
		if err := rows.Scan(&ms); err != nil {
			return nil, err
		}
		m, err := ParseMonth(ms)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// UnregisterEmptyMonth takes month m's table, which an aborted plan
// created, out of the catalog if it holds no row, and returns the status
// it had ("" when it holds rows or is not registered: left alone).
// DropUnregisteredMonth drops it once every reader's catalog forgot it.
func UnregisterEmptyMonth(ctx context.Context, db *sql.DB, m Month) (Status, error) {
	t, err := TableFor(m)
	if err != nil {
		return "", err
	}
	empty, err := tableEmpty(ctx, db, t)
	if err != nil || !empty {
		return "", err
	}
	var st string
	err = sq.Select("status").From(catalogTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(db).QueryRowContext(ctx).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("migration: status of %s: %w", t.Name(), err)
	}
	return Status(st), UnregisterShard(ctx, db, m)
}

// DropUnregisteredMonth drops month m's table, unregistered by
// UnregisterEmptyMonth, if it still holds no row; a table that does (never
// expected: nothing writes an unregistered month) is registered again with
// its former status and kept. It reports whether the table is gone.
func DropUnregisteredMonth(ctx context.Context, db *sql.DB, m Month, was Status) (bool, error) {
	t, err := TableFor(m)
	if err != nil {
		return false, err
	}
	empty, err := tableEmpty(ctx, db, t)
	if err != nil {
		return false, err
	}
	if !empty {
		if err := RegisterShard(ctx, db, t); err != nil {
			return false, err
		}
		_, err := SetStatus(ctx, db, m, was, StatusPrepared)
		return false, err
	}
	if err := FencedDDL(ctx, db, t.DropDDL()); err != nil {
		return false, fmt.Errorf("migration: drop %s: %w", t.Name(), err)
	}
	return true, nil
}

func tableEmpty(ctx context.Context, db sq.BaseRunner, t Table) (bool, error) {
	var one int
	err := sq.Select("1").From(t.Quoted()).Limit(1).RunWith(db).QueryRowContext(ctx).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows) || IsNoSuchTable(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("migration: is %s empty: %w", t.Name(), err)
	}
	return false, nil
}

// MirrorLegacy widens the route mirror by the legacy rows of topics
// (sorted), once the backfill copied them all — per topic and month, as
// the splits assign them: the backfill's batches leave the mirror alone,
// which would otherwise merge a line per topic month of every batch. It
// goes chunk topics at a time, each chunk in one transaction that first
// moves the pass's progress (im_migration_mirror, fenced by where it
// stood): an interrupted pass resumes after the last committed chunk and
// no topic is counted twice, even by two processes.
func MirrorLegacy(ctx context.Context, db *sql.DB, topics []string, chunk int) error {
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Insert(migrationMirrorTable).Columns("id", "topic").Values(1, "").
			Suffix("ON DUPLICATE KEY UPDATE id = id").RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("migration: mirror progress: %w", err)
	}
	done, err := MirrorProgress(ctx, db)
	if err != nil {
		return err
	}
	rest := topics
	for len(rest) > 0 && rest[0] <= done {
		rest = rest[1:]
	}
	for len(rest) > 0 {
		part := rest[:min(chunk, len(rest))]
		rest = rest[len(part):]
		last := part[len(part)-1]
		if err := Fenced(ctx, db, func(tx *sql.Tx) error { return mirrorChunk(ctx, tx, part, done, last) }); err != nil {
			return err
		}
		done = last
	}
	return nil
}

// MirrorProgress is the last topic the mirror pass widened ("" before its
// first chunk): a topic sorting after it (byte order) is not reached yet.
// It is a locking read (shared): inside a transaction it holds off the
// pass's next chunk, which first moves this row, until the transaction
// ends, and it waits for a chunk under way to commit.
func MirrorProgress(ctx context.Context, db sq.BaseRunner) (string, error) {
	var done string
	err := sq.Select("topic").From(migrationMirrorTable).Where(sq.Eq{"id": 1}).Suffix("LOCK IN SHARE MODE").
		RunWith(db).QueryRowContext(ctx).Scan(&done)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("migration: mirror progress: %w", err)
	}
	return done, nil
}

func mirrorChunk(ctx context.Context, tx *sql.Tx, topics []string, from, to string) error {
	res, err := sq.Update(migrationMirrorTable).Set("topic", to).Where(sq.Eq{"id": 1, "topic": from}).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return fmt.Errorf("migration: mirror progress: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(err, fmt.Errorf("migration: the mirror pass moved on meanwhile (another process?): expected it at %q", from))
	}
	if err := WidenMirrorFrom(ctx, tx, sq.Select("l.topic COLLATE utf8mb4_bin", "s.shard_month", "MIN(l.seqid)", "MAX(l.seqid)",
		"COUNT(*)", "MIN(l.created_at)", "MAX(l.created_at)").From(LegacyQuoted()+" AS l").Join(SplitsJoin).
		Where(sq.Eq{"l.topic": topics}).GroupBy("1", "2")); err != nil {
		return err
	}
	return nil
}
