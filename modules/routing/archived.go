package routing

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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

// ArchivedRow is a message of an archived month as its archive holds it:
// its key and what a tombstone of it is made from.
type ArchivedRow struct {
	Topic     string
	Seq       int64
	MessageID int64
	Status    string
	Version   int
}

// ArchiveScan is a read of a whole archived month (a user erase's walk of
// what the user sent: Rows, in (topic, seq) order) with the month's
// archive epoch read before it: the time of its last restore
// (unarchived_at, NULL when never restored). An archive object is never
// rewritten while its month stays archived, and only a restore moves the
// month out of archived, so a later moment that finds the month archived
// at the same epoch finds the very object the scan read (Current).
type ArchiveScan struct {
	Month Month
	Rows  []ArchivedRow
	epoch sql.NullTime
}

// ScanArchived reads month m's archive epoch, then, when the month is
// archived, runs read (the scan of its archive); the scan is nil, with
// nothing read, when the month is not archived.
func ScanArchived(ctx context.Context, db sq.BaseRunner, m Month, read func() ([]ArchivedRow, error)) (*ArchiveScan, error) {
	epoch, archived, err := archiveEpoch(ctx, db, m)
	if err != nil || !archived {
		return nil, err
	}
	rows, err := read()
	if err != nil {
		return nil, err
	}
	return &ArchiveScan{Month: m, Rows: rows, epoch: epoch}, nil
}

// Current reports whether the month is still archived at the scan's epoch
// (its archive the object the scan read), reading the catalog row with a
// shared lock: in a change's transaction, after LockForChange, the answer
// holds until the transaction ends.
func (s *ArchiveScan) Current(ctx context.Context, tx sq.BaseRunner) (bool, error) {
	epoch, archived, err := archiveEpoch(ctx, tx, s.Month)
	if err != nil {
		return false, err
	}
	return archived && epoch.Valid == s.epoch.Valid && epoch.Time.Equal(s.epoch.Time), nil
}

// At is the scan's rows of refs (sorted), in refs' order; a ref the scan
// did not find is left out.
func (s *ArchiveScan) At(refs []MessageRef) []ArchivedRow {
	out := make([]ArchivedRow, 0, len(refs))
	for _, r := range refs {
		i, ok := slices.BinarySearchFunc(s.Rows, r, func(a ArchivedRow, r MessageRef) int {
			return cmp.Or(cmp.Compare(a.Topic, r.Topic), cmp.Compare(a.Seq, r.Seq))
		})
		if ok {
			out = append(out, s.Rows[i])
		}
	}
	return out
}

// archiveEpoch reads month m's unarchived_at and whether it is archived,
// with a shared lock on its catalog row (the latest committed version, not
// a transaction's snapshot).
func archiveEpoch(ctx context.Context, db sq.BaseRunner, m Month) (epoch sql.NullTime, archived bool, err error) {
	var st string
	err = sq.Select("status", "unarchived_at").From(catalogTable).Where(sq.Eq{"shard_month": m.String()}).
		Suffix("LOCK IN SHARE MODE").RunWith(db).QueryRowContext(ctx).Scan(&st, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return epoch, false, nil
	}
	if err != nil {
		return epoch, false, fmt.Errorf("catalog: archive epoch of %s: %w", m, err)
	}
	return epoch, Status(st) == StatusArchived, nil
}
