package move

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// DefaultMaxSwitchLag is the catch-up lag (chunks changed since their last
// copy) above which a switch is refused: the final catch-up runs behind
// the raised fence, so it must be short.
const DefaultMaxSwitchLag = 100

// ErrSwitchRefused is a switch the pre-checks refused before the fence was
// raised: nothing is held, the move stays in catch-up, and running it
// again retries.
var ErrSwitchRefused = errors.New("move: switch refused")

// preSwitch runs the checks a switch must pass before it raises the
// fence, so that it refuses instead of failing halfway: the target
// reachable and at the source's schema version, the catch-up lag within
// MaxSwitchLag (one more catch-up round measures it), and room on the
// target for what it lacks (when its data directory can be measured).
func (m *Mover) preSwitch(ctx context.Context) error {
	if err := m.dst.PingContext(ctx); err != nil {
		return fmt.Errorf("%w: target %s not reachable: %w", ErrSwitchRefused, serverOf(m.dstDSN), err)
	}
	if err := m.sameSchema(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrSwitchRefused, err)
	}
	lag, err := m.catchUp(ctx, false)
	if err != nil {
		return err
	}
	if lag > m.o.MaxSwitchLag {
		return fmt.Errorf("%w: catch-up lag %d chunks, more than %d: the writes outpace the copy; run the move again once they calm down",
			ErrSwitchRefused, lag, m.o.MaxSwitchLag)
	}
	return m.targetRoom(ctx)
}

// sameSchema refuses a source and a target at different schema versions.
func (m *Mover) sameSchema(ctx context.Context) error {
	var sv, tv int
	if err := m.src.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM im_schema_migrations").Scan(&sv); err != nil {
		return err
	}
	if err := m.dst.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM im_schema_migrations").Scan(&tv); err != nil {
		return err
	}
	if sv != tv {
		return fmt.Errorf("move: schema version %d on the source, %d on the target: upgrade the older one first", sv, tv)
	}
	return nil
}

// targetRoom refuses a target whose data directory has less free space
// than the tenant's data and indexes still missing there. The free space
// can only be measured when the target server runs on this machine; for a
// remote one the check is skipped and the move's note says so.
func (m *Mover) targetRoom(ctx context.Context) error {
	need, err := dataBytes(ctx, m.src)
	if err != nil {
		return err
	}
	have, err := dataBytes(ctx, m.dst)
	if err != nil {
		return err
	}
	free, ok, err := m.targetFree(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return m.setNote(ctx, "space pre-check skipped: the target server is not on this machine")
	}
	if missing := need - have; missing > free {
		return fmt.Errorf("%w: the target needs about %d more bytes, its data directory has %d free", ErrSwitchRefused, missing, free)
	}
	return m.setNote(ctx, "")
}

// dataBytes is the size of db's tables (data and indexes), as the server
// reports it.
func dataBytes(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables
		WHERE table_schema = DATABASE()`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("move: table sizes: %w", err)
	}
	return n, nil
}

// targetFree is the free space of the target's data directory, when the
// target server listens on this machine (a loopback address or a socket).
func (m *Mover) targetFree(ctx context.Context) (int64, bool, error) {
	host, _, err := net.SplitHostPort(m.dstCfg.Addr)
	local := m.dstCfg.Net == "unix" || (err == nil && (host == "localhost" || net.ParseIP(host).IsLoopback()))
	if !local {
		return 0, false, nil
	}
	var dir string
	if err := m.dst.QueryRowContext(ctx, "SELECT @@datadir").Scan(&dir); err != nil {
		return 0, false, fmt.Errorf("move: target data directory: %w", err)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, false, nil // not this machine's file system after all (a container)
	}
	return int64(fs.Bavail) * int64(fs.Bsize), true, nil
}

func (m *Mover) setNote(ctx context.Context, note string) error {
	if _, err := m.src.ExecContext(ctx, "UPDATE im_tenant_move SET note = ? WHERE id = 1", note); err != nil {
		return fmt.Errorf("move: record note: %w", err)
	}
	m.st.Note = note
	return nil
}
