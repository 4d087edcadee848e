package routing

import (
	"context"
	"database/sql"
	"fmt"

	sq "github.com/Masterminds/squirrel"
)

// The durable route repair queue (im_group_message_route_repair) holds the
// seq ranges of topics whose Redis follow-ups after a committed batch —
// route merge, pending set, idempotency status — failed or may have been
// lost. Persist queues them and works them off (rebuilding the route from
// the mirror); the routes-complete watermark waits for the months they
// name. This file is the only code that reads or writes it.
const repairTable = "im_group_message_route_repair"

// RouteRepair is one entry of the repair queue.
type RouteRepair struct {
	ID     int64 // assigned by the queue
	Topic  string
	Month  Month
	MinSeq int64
	MaxSeq int64
}

// QueueRouteRepairs adds entries, all for reason, in one statement.
func QueueRouteRepairs(ctx context.Context, db TxBeginner, reason string, entries []RouteRepair) error {
	if len(entries) == 0 {
		return nil
	}
	q := sq.Insert(repairTable).Columns("topic", "shard_month", "min_seq", "max_seq", "reason")
	for _, e := range entries {
		q = q.Values(e.Topic, e.Month.String(), e.MinSeq, e.MaxSeq, reason)
	}
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := q.RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("repair queue: add: %w", err)
	}
	return nil
}

// RouteRepairs reads the oldest limit entries, oldest first.
func RouteRepairs(ctx context.Context, db sq.BaseRunner, limit uint64) ([]RouteRepair, error) {
	rows, err := sq.Select("id", "topic", "shard_month", "min_seq", "max_seq").From(repairTable).
		OrderBy("id").Limit(limit).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("repair queue: read: %w", err)
	}
	defer rows.Close()
	var out []RouteRepair
	for rows.Next() {
		var e RouteRepair
		var month string
		if err := rows.Scan(&e.ID, &e.Topic, &month, &e.MinSeq, &e.MaxSeq); err != nil {
			return nil, fmt.Errorf("repair queue: read: %w", err)
		}
		if e.Month, err = ParseMonth(month); err != nil {
			return nil, fmt.Errorf("repair queue: entry %d: %w", e.ID, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// RouteRepairFailed counts a failed attempt at entry id and keeps its cause
// (at most 512 bytes).
func RouteRepairFailed(ctx context.Context, db TxBeginner, id int64, cause string) error {
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(repairTable).Set("attempts", sq.Expr("attempts + 1")).Set("last_error", cause).
			Where(sq.Eq{"id": id}).RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("repair queue: entry %d: %w", id, err)
	}
	return nil
}

// RouteRepairDone removes entry id.
func RouteRepairDone(ctx context.Context, db TxBeginner, id int64) error {
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Delete(repairTable).Where(sq.Eq{"id": id}).RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("repair queue: entry %d: %w", id, err)
	}
	return nil
}

// RouteRepairBacklog counts the entries of months up to through, or all
// entries when through is zero.
func RouteRepairBacklog(ctx context.Context, db sq.BaseRunner, through Month) (int, error) {
	q := sq.Select("COUNT(*)").From(repairTable)
	if !through.IsZero() {
		q = q.Where(sq.LtOrEq{"shard_month": through.String()})
	}
	var n int
	if err := q.RunWith(db).QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, fmt.Errorf("repair queue: count: %w", err)
	}
	return n, nil
}
