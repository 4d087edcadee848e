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
	manifest string
	lastErr  string
}

func loadState(ctx context.Context, db sq.BaseRunner, m routing.Month) (state, error) {
	var s state
	var manifest, lastErr sql.NullString
	err := sq.Select("step", "object_key", "row_count", "bytes", "table_hash", "manifest", "last_error").
		From(stateTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(db).QueryRowContext(ctx).
		Scan(&s.step, &s.key, &s.rows, &s.bytes, &s.hash, &manifest, &lastErr)
	if errors.Is(err, sql.ErrNoRows) {
		return state{}, nil
	}
	if err != nil {
		return state{}, fmt.Errorf("archive: state of %s: %w", m, err)
	}
	s.manifest, s.lastErr = manifest.String, lastErr.String
	return s, nil
}

func saveState(ctx context.Context, db sq.BaseRunner, m routing.Month, s state) error {
	_, err := sq.Insert(stateTable).
		Columns("shard_month", "step", "object_key", "row_count", "rows_done", "bytes", "table_hash", "manifest").
		Values(m.String(), s.step, s.key, s.rows, s.rows, s.bytes, s.hash, sql.NullString{String: s.manifest, Valid: s.manifest != ""}).
		Suffix(`ON DUPLICATE KEY UPDATE step = VALUES(step), object_key = VALUES(object_key), row_count = VALUES(row_count),
  rows_done = VALUES(rows_done), bytes = VALUES(bytes), table_hash = VALUES(table_hash), manifest = VALUES(manifest), last_error = NULL`).
		RunWith(db).ExecContext(ctx)
	if err != nil {
		return fmt.Errorf("archive: record %s %s: %w", m, s.step, err)
	}
	return nil
}

func setStep(ctx context.Context, db sq.BaseRunner, m routing.Month, step string) error {
	if _, err := sq.Update(stateTable).Set("step", step).Set("last_error", nil).
		Where(sq.Eq{"shard_month": m.String()}).RunWith(db).ExecContext(ctx); err != nil {
		return fmt.Errorf("archive: record %s %s: %w", m, step, err)
	}
	return nil
}

func recordError(ctx context.Context, db sq.BaseRunner, m routing.Month, cause error) error {
	msg := cause.Error()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	_, err := sq.Update(stateTable).Set("last_error", msg).Where(sq.Eq{"shard_month": m.String()}).
		RunWith(db).ExecContext(context.WithoutCancel(ctx))
	return err
}
