package archive

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ErrBusy refuses a run while another archive or restore of the tenant
// holds its lock.
var ErrBusy = errors.New("archive: another archive or restore of the tenant is running")

// exclusive runs fn holding the tenant database's named lock
// imshard_archive:<database>: one archive or restore per tenant at a time,
// across processes (the patrol's and the commands'). The lock belongs to
// one connection, so a killed holder's lock goes with it.
func exclusive(ctx context.Context, db *sql.DB, fn func() error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var name sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		return fmt.Errorf("archive: lock: %w", err)
	}
	lock := "imshard_archive:" + name.String
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lock).Scan(&got); err != nil {
		return fmt.Errorf("archive: lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return ErrBusy
	}
	defer func() {
		_ = conn.QueryRowContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", lock).Scan(new(sql.NullInt64))
	}()
	return fn()
}
