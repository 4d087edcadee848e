package archive

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// stateTable records each month's archive step (sql/migrations/0013).
const stateTable = "im_archives"

type state struct {
	step     string
	key      string
	rows     int64
	bytes    int64
	hash     string
	stamp    string // the table's stamp taken for the verification (tableStamp)
	manifest string
}

func loadState(ctx context.Context, db sq.BaseRunner, m routing.Month) (state, error) {
	var s state
	var manifest sql.NullString
	err := sq.Select("step", "object_key", "row_count", "bytes", "table_hash", "stamp", "manifest").
		From(stateTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(db).QueryRowContext(ctx).
		Scan(&s.step, &s.key, &s.rows, &s.bytes, &s.hash, &s.stamp, &manifest)
	if errors.Is(err, sql.ErrNoRows) {
		return state{}, nil
	}
	if err != nil {
		return state{}, fmt.Errorf("archive: state of %s: %w", m, err)
	}
	s.manifest = manifest.String
	return s, nil
}

func saveState(ctx context.Context, db *sql.DB, m routing.Month, s state) error {
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Insert(stateTable).
			Columns("shard_month", "step", "object_key", "row_count", "rows_done", "bytes", "table_hash", "manifest").
			Values(m.String(), s.step, s.key, s.rows, s.rows, s.bytes, s.hash, sql.NullString{String: s.manifest, Valid: s.manifest != ""}).
			Suffix(`ON DUPLICATE KEY UPDATE step = VALUES(step), object_key = VALUES(object_key), row_count = VALUES(row_count),
  rows_done = VALUES(rows_done), bytes = VALUES(bytes), table_hash = VALUES(table_hash), manifest = VALUES(manifest), last_error = NULL`).
			RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("archive: record %s %s: %w", m, s.step, err)
	}
	return nil
}

func setStep(ctx context.Context, db *sql.DB, m routing.Month, step string) error {
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(stateTable).Set("step", step).Set("last_error", nil).
			Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("archive: record %s %s: %w", m, step, err)
	}
	return nil
}

// setVerified records the verification with the stamp it was made against.
func setVerified(ctx context.Context, db *sql.DB, m routing.Month, stamp string) error {
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(stateTable).Set("step", StepVerified).Set("stamp", stamp).Set("last_error", nil).
			Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("archive: record %s %s: %w", m, StepVerified, err)
	}
	return nil
}

// setMarked records the mark, in the mark's (fenced) transaction.
func setMarked(ctx context.Context, tx *sql.Tx, m routing.Month) error {
	if _, err := sq.Update(stateTable).Set("step", StepMarked).Set("marked_at", sq.Expr("UTC_TIMESTAMP(3)")).
		Set("last_error", nil).Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("archive: record %s %s: %w", m, StepMarked, err)
	}
	return nil
}

func recordError(ctx context.Context, db *sql.DB, m routing.Month, cause error) error {
	msg := cause.Error()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	ctx = context.WithoutCancel(ctx)
	return routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(stateTable).Set("last_error", msg).Where(sq.Eq{"shard_month": m.String()}).
			RunWith(tx).ExecContext(ctx)
		return err
	})
}

// Progress is one month's archive as `shard list` shows it.
type Progress struct {
	Step      string
	Rows      int64
	Bytes     int64
	LastError string
}

// Progress lists the tenant's months the archive has touched.
func (a *Archiver) Progress(ctx context.Context, tenant string) (map[routing.Month]Progress, error) {
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := sq.Select("shard_month", "step", "row_count", "bytes", "last_error").From(stateTable).
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("archive: progress: %w", err)
	}
	defer rows.Close()
	out := map[routing.Month]Progress{}
	for rows.Next() {
		var ms string
		var p Progress
		var lastErr sql.NullString
		if err := rows.Scan(&ms, &p.Step, &p.Rows, &p.Bytes, &lastErr); err != nil {
			return nil, err
		}
		m, err := routing.ParseMonth(ms)
		if err != nil {
			return nil, err
		}
		p.LastError = lastErr.String
		out[m] = p
	}
	return out, rows.Err()
}
