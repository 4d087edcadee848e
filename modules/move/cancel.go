package move

import (
	"context"
	"crypto/tls"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/tenantdb"
	imsql "github.com/imshard/imshard/sql"
)

// Cancel ends the move recorded on the tenant's current placement. Before
// the switch it stops the mover, drops the target copy and leaves the
// source as it was; a reverse's target is the copy the reversed move kept,
// so it stays, and the tenant is back at that move's done. The switch's
// pre-checks are a step of their own (precheck), before it, so a cancel
// there cancels. Once the switch began (its fence about to rise or
// raised) it lowers nothing: it completes the
// switch, so the tenant ends wholly on the target; completed reports that.
// Running it again is harmless.
func Cancel(ctx context.Context, tenant string, at tenantdb.Placement, store *placement.Store, o Options) (completed bool, err error) {
	st, err := ReadState(ctx, at.DSN, o.TLS)
	if err != nil {
		return false, err
	}
	if st.HalfSwitched() {
		return false, halfSwitched(tenant, st)
	}
	if st.Role != "source" || st.Step == StepDone {
		return false, fmt.Errorf("move: the move of %s is done; nothing to cancel", tenant)
	}
	if st.Step == StepCancelled {
		return false, nil
	}
	if st.Step == StepSwitch {
		m, err := Begin(ctx, tenant, at, st.Peer, store, o)
		if err != nil {
			return false, err
		}
		defer m.Close()
		return true, m.Run(ctx)
	}
	src, _, err := OpenDB(at.DSN, o.TLS, true)
	if err != nil {
		return false, err
	}
	defer src.Close()
	// the mover sees the step between chunks and stops; its lock says when
	// one conditional UPDATE: either it or the mover's step from precheck
	// to switch takes effect (setStep), never both
	res, err := src.ExecContext(ctx, "UPDATE im_tenant_move SET step = ? WHERE id = 1 AND step IN (?, ?, ?, ?, ?, ?)",
		StepCancelling, StepPlan, StepCopy, StepCatchUp, StepVerify, StepPreCheck, StepCancelling)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		cur, err := readState(ctx, src)
		if err != nil {
			return false, err
		}
		switch cur.Step {
		case StepCancelling:
		case StepSwitch, StepDone, StepCancelled:
			// the step moved on since it was read: decide again from
			// the recorded step, never drop a target the switch may
			// have made the tenant's database
			return Cancel(ctx, tenant, at, store, o)
		default:
			return false, fmt.Errorf("move: the move of %s is at %s; it cannot be cancelled there", tenant, cur.Step)
		}
	}
	c, err := src.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	var got *int64
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('imshard_move:', DATABASE()), 30)").Scan(&got); err != nil {
		return false, err
	}
	if got == nil || *got != 1 {
		return false, ErrBusy
	}
	defer func() {
		_, _ = c.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(CONCAT('imshard_move:', DATABASE()))")
	}()
	if !st.Reverse {
		if err := dropTarget(ctx, src, st.Peer, o.TLS); err != nil {
			return false, err
		}
	}
	if err := dropMarks(ctx, src); err != nil {
		return false, err
	}
	if _, err := src.ExecContext(ctx, "DELETE FROM im_tenant_move_chunks"); err != nil {
		return false, err
	}
	if st.Reverse {
		_, err = src.ExecContext(ctx, "UPDATE im_tenant_move SET role = 'target', step = ?, reverse = 0 WHERE id = 1", StepDone)
		return false, err
	}
	_, err = src.ExecContext(ctx, "UPDATE im_tenant_move SET step = ? WHERE id = 1", StepCancelled)
	return false, err
}

// Finish drops the source copy of a move that is done; the tenant's
// current placement must be the move's target.
func Finish(ctx context.Context, tenant string, at tenantdb.Placement, o Options) error {
	db, _, err := OpenDB(at.DSN, o.TLS, true)
	if err != nil {
		return err
	}
	defer db.Close()
	st, err := readState(ctx, db)
	if err != nil {
		return err
	}
	if st.HalfSwitched() {
		return halfSwitched(tenant, st)
	}
	if st.Role != "target" {
		return fmt.Errorf("move: the move of %s is at %s; finish only follows the switch", tenant, st.Step)
	}
	if st.Step == StepFinished {
		return nil
	}
	if err := dropTarget(ctx, db, st.Peer, o.TLS); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, "UPDATE im_tenant_move SET step = ? WHERE id = 1", StepFinished)
	return err
}

// dropTarget drops the other copy of a move (the target of a cancelled
// one, the source of a finished one), never the database db serves.
func dropTarget(ctx context.Context, src *sql.DB, dsn string, tlsCfg *tls.Config) error {
	if err := notItself(ctx, src, dsn, tlsCfg); err != nil {
		return fmt.Errorf("%w; nothing dropped", err)
	}
	return dropDatabase(ctx, dsn, tlsCfg)
}

func dropDatabase(ctx context.Context, dsn string, tlsCfg *tls.Config) error {
	server, cfg, err := OpenDB(dsn, tlsCfg, false)
	if err != nil {
		return err
	}
	defer server.Close()
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	drop := strings.Replace(imsql.DropDatabase(), imsql.DatabasePlaceholder, quote(cfg.DBName), 1)
	if _, err := server.ExecContext(dctx, drop); err != nil {
		return fmt.Errorf("move: drop %s: %w", serverOf(dsn), err)
	}
	return nil
}
