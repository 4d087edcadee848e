package routing

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"
)

// ErrPlacementMoved is a write refused by the tenant's placement fence: the
// connection belongs to a placement older (or newer) than the one the
// database serves. Nothing was written; the writer retries once this
// process follows the tenant's current placement (mysql.placement_poll).
// The API answers it 409 conflict, reason tenant_moving, with
// MovingRetryAfter as retry_after_ms (modules/httpapi).
var ErrPlacementMoved = errors.New("the tenant's placement changed: write refused by the fence")

// MovingRetryAfter is what a write refused by the fence asks its caller
// to wait: a switch holds the tenant's writes about a second, and a
// process follows the new placement within mysql.placement_poll.
const MovingRetryAfter = 250 * time.Millisecond

// fenceTable is the fixed one-row table of a tenant database's placement
// epoch (sql/migrations/0016_tenant_fence.sql).
const fenceTable = "im_tenant_fence"

// ddlFenceLock names the server-side lock that orders schema changes
// (CREATE, DROP, RENAME of tables) with a switch: DDL commits on its own,
// outside any transaction, so a shared lock on the fence row cannot cover
// it. FencedDDL holds it from its fence check to the end of the statement,
// and RaiseFence holds it around the fence's UPDATE.
const ddlFenceLock = "imshard_fence"

// ddlFenceWait bounds the wait for ddlFenceLock (seconds, as GET_LOCK
// takes it): a switch's UPDATE or one DDL statement.
const ddlFenceWait = 30

// CheckPlacement is the first statement of every write transaction of a
// tenant (Fenced runs it): it reads the database's fence epoch with a
// shared lock and compares it with the epoch the connection was opened for
// (the session variable @imshard_epoch, tenantdb.EpochVar). The shared
// lock lasts until the transaction ends, so a move's switch — an UPDATE of
// the row, which needs the exclusive lock — waits for every writer already
// past this check, and every writer after the switch sees the new epoch
// and writes nothing. The move takes its final catch-up position only
// after the switch commits, so whatever a writer committed before it is
// copied, and nothing is written after it.
func CheckPlacement(ctx context.Context, tx *sql.Tx) error {
	return checkFence(sq.Select("epoch", "@imshard_epoch").From(fenceTable).Where(sq.Eq{"id": 1}).
		Suffix("LOCK IN SHARE MODE").RunWith(tx).QueryRowContext(ctx))
}

func checkFence(row sq.RowScanner) error {
	var fence int64
	var mine sql.NullInt64
	err := row.Scan(&fence, &mine)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: the database has no fence row (not this build's schema)", ErrPlacementMoved)
	case err != nil:
		return fmt.Errorf("placement fence: %w", err)
	case !mine.Valid:
		return fmt.Errorf("%w: the connection carries no placement epoch", ErrPlacementMoved)
	case mine.Int64 != fence:
		return fmt.Errorf("%w: this connection's epoch is %d, the database serves epoch %d", ErrPlacementMoved, mine.Int64, fence)
	}
	return nil
}

// TxBeginner is a tenant pool or one of its connections.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Fenced is the one way to write to a tenant database: fn runs in a
// transaction whose first statement passes the placement fence
// (CheckPlacement), and commits only if fn succeeds. A refusal is
// ErrPlacementMoved and nothing ran. The write functions of the modules
// take the *sql.Tx it hands out, never a pool, so a write outside it does
// not compile into the tree without showing in review (and
// TestTenantWritesFenced finds it).
func Fenced(ctx context.Context, db TxBeginner, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := CheckPlacement(ctx, tx); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// FencedDDL runs one schema statement (CREATE, DROP or RENAME of a table)
// on the tenant database behind the fence. A DDL statement commits
// implicitly, so it cannot share a transaction with the fence's shared
// lock; instead it holds ddlFenceLock on its connection from the check to
// its end, and RaiseFence takes the same lock: the statement either ends
// before a switch raises the fence (and the switch's catch-up sees the
// table) or finds the fence raised and runs not at all.
func FencedDDL(ctx context.Context, db *sql.DB, ddl string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := takeFenceLock(ctx, conn); err != nil {
		return err
	}
	defer releaseFenceLock(ctx, conn)
	if err := checkFence(conn.QueryRowContext(ctx, "SELECT epoch, @imshard_epoch FROM "+fenceTable+" WHERE id = 1")); err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, ddl)
	return err
}

// RaiseFence is a move's switch on one database: it raises the fence row
// to at least epoch, holding ddlFenceLock so that no FencedDDL statement
// runs across it. The UPDATE waits for every Fenced transaction already
// past its check; from its commit no writer of an older epoch changes the
// database.
func RaiseFence(ctx context.Context, conn *sql.Conn, epoch int64) error {
	if err := takeFenceLock(ctx, conn); err != nil {
		return err
	}
	defer releaseFenceLock(ctx, conn)
	if _, err := conn.ExecContext(ctx, "UPDATE "+fenceTable+" SET epoch = GREATEST(epoch, ?) WHERE id = 1", epoch); err != nil {
		return fmt.Errorf("raise the placement fence: %w", err)
	}
	return nil
}

func takeFenceLock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT(?, ':', DATABASE()), ?)", ddlFenceLock, ddlFenceWait).Scan(&got); err != nil {
		return fmt.Errorf("placement fence lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("placement fence lock: not granted within %ds", ddlFenceWait)
	}
	return nil
}

// releaseFenceLock ends the lock whatever the caller's context did. When
// the release fails the connection is discarded rather than pooled: its
// session, which ends with it, would otherwise keep the lock while idle.
func releaseFenceLock(ctx context.Context, conn *sql.Conn) {
	var ignored sql.NullInt64
	if err := conn.QueryRowContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(CONCAT(?, ':', DATABASE()))", ddlFenceLock).Scan(&ignored); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// FencedRows runs q, one statement, in a fenced transaction of its own
// (Fenced) and answers the rows it changed: the bounded deletes, claims
// and batch inserts that only need to know how much they did.
func FencedRows(ctx context.Context, db TxBeginner, q sq.Sqlizer) (int64, error) {
	query, args, err := q.ToSql()
	if err != nil {
		return 0, err
	}
	return FencedValue(ctx, db, func(tx *sql.Tx) (int64, error) { return RowsOf(tx.ExecContext(ctx, query, args...)) })
}

// RowsOf is the rows a statement changed, from what ExecContext answered.
func RowsOf(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// FencedValue is Fenced for a write that reports a value (the rows a
// bounded delete removed, a change's new sequence number).
func FencedValue[T any](ctx context.Context, db TxBeginner, fn func(tx *sql.Tx) (T, error)) (T, error) {
	var out T
	err := Fenced(ctx, db, func(tx *sql.Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	return out, err
}
