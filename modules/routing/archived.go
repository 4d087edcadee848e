package routing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"
)

// RestoreSettle is how long after a restore flipped a month back to sealed
// its changes wait: every process's catalog cache (CatalogTTL) has read the
// month from its table again by then, with a second to spare, so none is
// still answering from the archive when the table changes.
const RestoreSettle = CatalogTTL + time.Second

// ErrMonthRestoring refuses a change of a month restored less than
// RestoreSettle ago; the change is retried after that.
var ErrMonthRestoring = errors.New("catalog: the month was just restored from its archive")

// LockForChange takes, in tx, a shared lock on the catalog rows of tables'
// months and splits tables into those whose months are open and those
// archived. A change of a month's rows runs under this lock, so the
// archive's mark (LockForArchive, an exclusive lock on the same row) waits
// for every change already under way, and every change after the mark
// sees the month archived and leaves its table alone (it changes the
// month's overlay, overlay.go). A month restored
// less than RestoreSettle ago refuses the change (ErrMonthRestoring).
func LockForChange(ctx context.Context, tx sq.BaseRunner, tables []Table) (open, archived []Table, err error) {
	if len(tables) == 0 {
		return nil, nil, nil
	}
	months := make([]string, len(tables))
	for i, t := range tables {
		months[i] = t.Month().String()
	}
	rows, err := sq.Select("shard_month", "status").
		Column(sq.Expr("COALESCE(unarchived_at > UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND, FALSE)", RestoreSettle.Microseconds())).
		From(catalogTable).Where(sq.Eq{"shard_month": months}).
		Suffix("LOCK IN SHARE MODE").RunWith(tx).QueryContext(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("catalog: lock for change: %w", err)
	}
	defer rows.Close()
	gone := map[string]bool{}
	settling := false
	for rows.Next() {
		var m, st string
		var restored bool
		if err := rows.Scan(&m, &st, &restored); err != nil {
			return nil, nil, fmt.Errorf("catalog: lock for change: %w", err)
		}
		gone[m] = Status(st) == StatusArchived
		settling = settling || restored && !gone[m]
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("catalog: lock for change: %w", err)
	}
	if settling {
		return nil, nil, ErrMonthRestoring
	}
	for _, t := range tables {
		if gone[t.Month().String()] {
			archived = append(archived, t)
		} else {
			open = append(open, t)
		}
	}
	return open, archived, nil
}

// LockForArchive takes, in tx, the exclusive lock on month m's catalog row
// (waiting for every change holding LockForChange's shared lock) and
// returns the month's status.
func LockForArchive(ctx context.Context, tx sq.BaseRunner, m Month) (Status, error) {
	var st string
	err := sq.Select("status").From(catalogTable).Where(sq.Eq{"shard_month": m.String()}).
		Suffix("FOR UPDATE").RunWith(tx).QueryRowContext(ctx).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("%w: %s", ErrShardNotRegistered, m)
	}
	if err != nil {
		return "", fmt.Errorf("catalog: lock %s: %w", m, err)
	}
	return Status(st), nil
}
