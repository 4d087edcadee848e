package routing

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
)

// overlayTable holds the changes of archived messages
// (sql/migrations/0024_archive_overlay.sql). An archive object is never
// rewritten: a change of a message whose month is archived seeds the
// message's row here from the archive (SeedOverlay), locks it
// (LockOverlay) and changes it (OverlayUpdate) as it would change a month
// table's row; readers put these rows over the archive's (LoadOverlay); a
// restore writes them into the month table in the transaction that sets
// the month back to sealed (MergeOverlay), and the next archive's mark
// clears them (ClearOverlay), under the catalog row's exclusive lock both.
const overlayTable = "im_archive_overlay"

// OverlayRow is the changed state of one archived message: the columns a
// change writes.
type OverlayRow struct {
	Topic         string
	Seq           int64
	Month         Month
	MessageID     int64
	Status        string
	Content, Head []byte // nil: NULL
	Version       int
	UpdatedAt     time.Time
}

var overlayColumns = []string{"topic", "seqid", "shard_month", "message_id", "status", "content", "head", "version", "updated_at"}

// SeedOverlay writes rows — archived messages as their archive holds them
// — where the overlay has none for them yet (a row changed before keeps
// its change).
func SeedOverlay(ctx context.Context, tx *sql.Tx, rows []OverlayRow) error {
	if len(rows) == 0 {
		return nil
	}
	q := sq.Insert(overlayTable).Options("IGNORE").Columns(overlayColumns...)
	for _, r := range rows {
		q = q.Values(r.Topic, r.Seq, r.Month.String(), r.MessageID, r.Status, jsonOrNull(r.Content), jsonOrNull(r.Head), r.Version, r.UpdatedAt)
	}
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("overlay: seed: %w", err)
	}
	return nil
}

// InsertOverlay writes rows as new overlay rows, deleted_at set to
// deletedAt (zero: NULL), with one plain INSERT: it fails with the
// duplicate key error (ER_DUP_ENTRY) when the overlay holds a row of one
// of them already, and writes nothing then. An erase batch's tombstones
// of messages the overlay had no row of: what SeedOverlay, LockOverlay
// and OverlayUpdate would leave, in one statement.
func InsertOverlay(ctx context.Context, tx *sql.Tx, rows []OverlayRow, deletedAt time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	var deleted any
	if !deletedAt.IsZero() {
		deleted = deletedAt
	}
	q := sq.Insert(overlayTable).Columns(append(slices.Clone(overlayColumns), "deleted_at")...)
	for _, r := range rows {
		q = q.Values(r.Topic, r.Seq, r.Month.String(), r.MessageID, r.Status, jsonOrNull(r.Content), jsonOrNull(r.Head), r.Version, r.UpdatedAt, deleted)
	}
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("overlay: insert: %w", err)
	}
	return nil
}

func jsonOrNull(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// LockOverlay reads the overlay rows of refs, locking them (FOR UPDATE).
func LockOverlay(ctx context.Context, tx sq.BaseRunner, refs []MessageRef) (map[MessageRef]OverlayRow, error) {
	out := map[MessageRef]OverlayRow{}
	if len(refs) == 0 {
		return out, nil
	}
	err := scanOverlay(ctx, sq.Select(overlayColumns...).From(overlayTable).Where(RefsCond(refs, "topic", "seqid")).
		Suffix("FOR UPDATE").RunWith(tx), func(r OverlayRow) { out[MessageRef{Topic: r.Topic, Seq: r.Seq}] = r })
	return out, err
}

// OverlayUpdate is up (a change's SET clauses) aimed at the overlay rows
// of refs.
func OverlayUpdate(up sq.UpdateBuilder, refs []MessageRef) sq.UpdateBuilder {
	return up.Table(overlayTable).Where(RefsCond(refs, "topic", "seqid"))
}

// LoadOverlay reads the overlay rows of topic in month m with
// lo <= seq <= hi, by seq.
func LoadOverlay(ctx context.Context, db sq.BaseRunner, m Month, topic string, lo, hi int64) (map[int64]OverlayRow, error) {
	out := map[int64]OverlayRow{}
	err := scanOverlay(ctx, sq.Select(overlayColumns...).From(overlayTable).
		Where(sq.Eq{"topic": topic, "shard_month": m.String()}).Where("seqid BETWEEN ? AND ?", lo, hi).RunWith(db),
		func(r OverlayRow) { out[r.Seq] = r })
	return out, err
}

func scanOverlay(ctx context.Context, q sq.SelectBuilder, fn func(OverlayRow)) error {
	rows, err := q.QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("overlay: read: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r OverlayRow
		var m string
		if err := rows.Scan(&r.Topic, &r.Seq, &m, &r.MessageID, &r.Status, &r.Content, &r.Head, &r.Version, &r.UpdatedAt); err != nil {
			return fmt.Errorf("overlay: scan: %w", err)
		}
		if r.Month, err = ParseMonth(m); err != nil {
			return fmt.Errorf("overlay: %w", err)
		}
		fn(r)
	}
	return rows.Err()
}

// MergeOverlay writes month table t's overlay rows into the table (a
// restore, in the transaction that sets the month back to sealed, under
// the catalog row's exclusive lock); it reports the rows merged. The rows
// stay until the month's next archive mark clears them: a process whose
// catalog copy still reads the archive (routing.RestoreSettle) keeps
// reading them over it.
func MergeOverlay(ctx context.Context, tx *sql.Tx, t Table) (int64, error) {
	res, err := tx.ExecContext(ctx, "UPDATE "+t.Quoted()+" AS m JOIN "+overlayTable+
		` AS o ON o.topic = m.topic AND o.seqid = m.seqid
		SET m.status = o.status, m.content = o.content, m.head = o.head, m.version = o.version, m.updated_at = o.updated_at,
			m.recalled_at = COALESCE(o.recalled_at, m.recalled_at), m.recalled_by = COALESCE(o.recalled_by, m.recalled_by),
			m.deleted_at = COALESCE(o.deleted_at, m.deleted_at)
		WHERE o.shard_month = ?`, t.Month().String())
	if err != nil {
		return 0, fmt.Errorf("overlay: merge into %s: %w", t.Name(), err)
	}
	return RowsOf(res, nil)
}

// ClearOverlay deletes month m's overlay rows (an archive's mark, under
// the catalog row's exclusive lock: what a restore merged is in the table
// the new archive was exported from).
func ClearOverlay(ctx context.Context, tx *sql.Tx, m Month) error {
	if _, err := sq.Delete(overlayTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("overlay: clear %s: %w", m, err)
	}
	return nil
}

// overlayComplete is the member of Keys.OverlayMonths that says the set
// lists every month with overlay rows: the months found in the table when
// the set was first filled, and every month a change marked since.
const overlayComplete = "complete"

// MarkOverlay adds months to the tenant's set of months with overlay rows
// (Keys.OverlayMonths). A change calls it before the transaction that
// seeds their first overlay rows commits, so that a reader that finds a
// month missing from the complete set knows no overlay row of it had
// committed when it looked. A month stays in the set (a later archive's
// mark clears its rows, not its membership: readers then look for rows
// and find none).
func MarkOverlay(ctx context.Context, rdb rueidis.Client, keys Keys, months []Month) error {
	if len(months) == 0 {
		return nil
	}
	ms := make([]string, len(months))
	for i, m := range months {
		ms[i] = m.String()
	}
	if err := rdb.Do(ctx, rdb.B().Sadd().Key(keys.OverlayMonths()).Member(ms...).Build()).Error(); err != nil {
		return fmt.Errorf("overlay: mark %v: %w", ms, err)
	}
	return nil
}

// MayHaveOverlay reports whether month m of the tenant (database db) may
// have overlay rows: false only when the tenant's set is complete and does
// not list m, so a read of an archived month without changes need not ask
// MySQL. The first call for a tenant whose set is not complete yet (its
// overlay rows were written before the set existed) fills it from the
// table and marks it complete; a change marking a month meanwhile is in
// the set whichever comes first.
func MayHaveOverlay(ctx context.Context, rdb rueidis.Client, keys Keys, db sq.BaseRunner, m Month) (bool, error) {
	got, err := rdb.Do(ctx, rdb.B().Smismember().Key(keys.OverlayMonths()).Member(m.String(), overlayComplete).Build()).AsIntSlice()
	if err != nil {
		return true, fmt.Errorf("overlay: months: %w", err)
	}
	if len(got) == 2 && (got[0] == 1 || got[1] == 1) {
		return got[0] == 1, nil
	}
	rows, err := sq.Select("DISTINCT shard_month").From(overlayTable).RunWith(db).QueryContext(ctx)
	if err != nil {
		return true, fmt.Errorf("overlay: months: %w", err)
	}
	defer rows.Close()
	ms := []string{overlayComplete}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return true, fmt.Errorf("overlay: months: %w", err)
		}
		ms = append(ms, s)
	}
	if err := rows.Err(); err != nil {
		return true, fmt.Errorf("overlay: months: %w", err)
	}
	if err := rdb.Do(ctx, rdb.B().Sadd().Key(keys.OverlayMonths()).Member(ms...).Build()).Error(); err != nil {
		return true, fmt.Errorf("overlay: months: %w", err)
	}
	return slices.Contains(ms, m.String()), nil
}
