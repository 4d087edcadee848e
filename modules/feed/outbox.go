package feed

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// Row is one outbox row still to be relayed.
type Row struct {
	ID        int64
	Topic     string
	ChangeSeq int64
	Event     []byte // the record value, as Record encoded it
	CreatedAt time.Time
}

// relayLock names the server-side lock one relay holds on a tenant's
// database while it relays its outbox: two relays of one tenant would
// produce the same topic's rows concurrently and could interleave them.
// A session's lock ends with the session, so a relay killed -9 leaves it
// to the next one at once.
const relayLock = "imshard_change_relay"

// Lock takes the tenant's relay lock on conn without waiting; false when
// another relay holds it.
func Lock(ctx context.Context, conn *sql.Conn) (bool, error) {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT(?, ':', DATABASE()), 0)", relayLock).Scan(&got); err != nil {
		return false, fmt.Errorf("feed: relay lock: %w", err)
	}
	return got.Valid && got.Int64 == 1, nil
}

// Unlock releases the relay lock taken on conn. When the release fails the
// connection is closed rather than pooled — its session, which ends with
// it, would otherwise keep the lock while idle in the pool, and no relay
// (this one included, on another connection) could take the tenant.
func Unlock(ctx context.Context, conn *sql.Conn) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(CONCAT(?, ':', DATABASE()))", relayLock).Scan(&released); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return fmt.Errorf("feed: relay unlock: %w", err)
	}
	return nil
}

// Pending reads up to limit rows, oldest first. The whole outbox is
// pending — a row is deleted once relayed — so no cursor can step over a
// row whose transaction commits after a row with a higher id: such a row
// is simply found by a later call. Within a topic, every row a call
// returns follows all the topic's rows still in the outbox (change_seq
// order is commit order), so the call sees a prefix of each topic's
// pending changes; ordered by id, the prefix is in change_seq order.
func Pending(ctx context.Context, conn *sql.Conn, limit int) ([]Row, error) {
	query, args, err := sq.Select("id", "topic", "change_seq", "event", "created_at").From(outboxTable).
		OrderBy("id").Limit(uint64(limit)).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := conn.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("feed: pending: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.ID, &r.Topic, &r.ChangeSeq, &r.Event, &r.CreatedAt); err != nil {
			return nil, fmt.Errorf("feed: pending: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Delete removes relayed rows by id, behind the placement fence: after a
// move's switch the rows stay on the source (the target has their copy,
// which the relay of the new placement relays again — consumers
// deduplicate by change_seq).
func Delete(ctx context.Context, conn *sql.Conn, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if err := routing.Fenced(ctx, conn, func(tx *sql.Tx) error {
		_, err := sq.Delete(outboxTable).Where(sq.Eq{"id": ids}).RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("feed: delete relayed: %w", err)
	}
	return nil
}

// OldestAge is how long the oldest row of db's outbox has waited, by the
// server's clock (0 when the outbox is empty).
func OldestAge(ctx context.Context, db *sql.DB) (time.Duration, error) {
	var ms sql.NullInt64
	err := sq.Select("TIMESTAMPDIFF(MICROSECOND, created_at, NOW(3)) DIV 1000").From(outboxTable).
		OrderBy("id").Limit(1).RunWith(db).QueryRowContext(ctx).Scan(&ms)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("feed: oldest: %w", err)
	}
	return time.Duration(max(ms.Int64, 0)) * time.Millisecond, nil
}
