package archive

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"

	sq "github.com/Masterminds/squirrel"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/imshard/imshard/modules/routing"
)

// ErrNotArchived refuses the restore of a month that is not archived.
var ErrNotArchived = errors.New("archive: the month is not archived")

// RestoreReport is what one restore did.
type RestoreReport struct {
	Tenant   string
	Month    routing.Month
	Rows     int64 // rows in the month after the restore
	Restored int64 // rows written back from the archive (0: the table was whole)
}

// Restore brings an archived month back: the month table (re)created and
// filled from the archive where it lacks rows (INSERT IGNORE, so a run
// killed half-way is simply run again), compared topic by topic with the
// archive, and only then the changes made while it was archived (the
// month's overlay) written into the table, the catalog row set back to
// sealed and the month's archive record removed, in one transaction under
// the catalog row's exclusive lock. The archive objects stay; nothing is deleted
// before the table is verified. It holds the tenant's archive lock.
func (a *Archiver) Restore(ctx context.Context, tenant string, m routing.Month) (RestoreReport, error) {
	rep := RestoreReport{Tenant: tenant, Month: m}
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return rep, err
	}
	err = exclusive(ctx, db, func() error {
		rep, err = a.restore(ctx, db, rep)
		return err
	})
	return rep, err
}

func (a *Archiver) restore(ctx context.Context, db *sql.DB, rep RestoreReport) (RestoreReport, error) {
	tenant, m := rep.Tenant, rep.Month
	t, status, err := a.p.Catalog.Table(ctx, tenant, m)
	if err != nil {
		return rep, err
	}
	if status != routing.StatusArchived {
		return rep, fmt.Errorf("%w: %s is %s", ErrNotArchived, m, status)
	}
	bucket, err := OpenBucket(ctx, a.p.Config.URL)
	if err != nil {
		return rep, err
	}
	defer bucket.Close()
	key := ObjectKey(tenant, m)
	want, err := readDigests(ctx, bucket, key)
	if err != nil {
		return rep, err
	}
	// DDL on its own statement
	if err := routing.FencedDDL(ctx, db, t.CreateDDL()); err != nil {
		return rep, fmt.Errorf("archive: create %s: %w", t.Name(), err)
	}
	have, err := a.tableDigests(ctx, db, t)
	if err != nil {
		return rep, err
	}
	if compare(have, want) != nil {
		if rep.Restored, err = a.reload(ctx, db, bucket, key, t); err != nil {
			return rep, err
		}
		if have, err = a.tableDigests(ctx, db, t); err != nil {
			return rep, err
		}
		if err := compare(have, want); err != nil {
			a.m.verifyFailures.Inc()
			return rep, err
		}
	}
	if err := a.unmark(ctx, db, t); err != nil {
		return rep, err
	}
	a.p.Catalog.Invalidate(tenant)
	rep.Rows = total(have)
	a.m.monthsRestored.Inc()
	a.m.rowsRestored.Add(float64(rep.Restored))
	a.p.Log.Info().Str("tenant", tenant).Str("month", m.String()).Int64("rows", rep.Rows).Int64("restored", rep.Restored).
		Msg("archived month restored to MySQL and verified")
	return rep, nil
}

// restoreBatch bounds the rows of one INSERT of a restore.
const restoreBatch = 500

// reload writes the archive's rows the table lacks, a batch per
// transaction behind the placement fence, throttled to
// archive.rows_per_second as the export's reads are; it reports the rows
// inserted.
func (a *Archiver) reload(ctx context.Context, db *sql.DB, bucket *blob.Bucket, key string, t routing.Table) (int64, error) {
	var n int64
	cols := routing.LegacyColumnNames()
	pc := a.pace(restoreBatch)
	err := readRows(ctx, bucket, key, func(rows []Row) error {
		for len(rows) > 0 {
			chunk := rows[:min(len(rows), pc.batch)]
			rows = rows[len(chunk):]
			if err := pc.wait(ctx, len(chunk)); err != nil {
				return err
			}
			q := sq.Insert(t.Quoted()).Options("IGNORE").Columns(cols...)
			for i := range chunk {
				q = q.Values(chunk[i].values()...)
			}
			added, err := routing.FencedRows(ctx, db, q)
			if err != nil {
				return fmt.Errorf("archive: restore into %s: %w", t.Name(), err)
			}
			n += added
		}
		return nil
	})
	return n, err
}

// unmark merges the month's overlay into table t, sets the month back to
// sealed and forgets its archive run, in one transaction under the catalog
// row's exclusive lock (no change of the month is under way).
func (a *Archiver) unmark(ctx context.Context, db *sql.DB, t routing.Table) error {
	m := t.Month()
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		status, err := routing.LockForArchive(ctx, tx, m)
		if err != nil {
			return err
		}
		if status != routing.StatusArchived {
			return fmt.Errorf("%w: %s is %s", ErrNotArchived, m, status)
		}
		// the changes made while the month was archived
		if _, err := routing.MergeOverlay(ctx, tx, t); err != nil {
			return err
		}
		if _, err := routing.SetArchived(ctx, tx, m, false); err != nil {
			return err
		}
		if _, err := sq.Delete(stateTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("archive: forget %s: %w", m, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archive: restore %s: %w", m, err)
	}
	return nil
}

// Remove deletes month m's archive, if it has one — every object under the
// month's prefix, then its overlay rows and its archive record — for a
// month that leaves whole (retention). Objects first: a run stopped
// half-way leaves the record, and running it again deletes what is left.
// It holds the tenant's archive lock (ErrBusy while an archive or restore
// runs: the retention run fails and the next one finishes the drop).
func (a *Archiver) Remove(ctx context.Context, tenant string, m routing.Month) error {
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	return exclusive(ctx, db, func() error { return a.remove(ctx, db, tenant, m) })
}

func (a *Archiver) remove(ctx context.Context, db *sql.DB, tenant string, m routing.Month) error {
	st, err := loadState(ctx, db, m)
	if err != nil || st.step == "" {
		return err
	}
	bucket, err := OpenBucket(ctx, a.p.Config.URL)
	if err != nil {
		return err
	}
	defer bucket.Close()
	it := bucket.List(&blob.ListOptions{Prefix: tenant + "/" + m.String() + "/"})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("archive: list %s: %w", m, err)
		}
		if err := bucket.Delete(ctx, obj.Key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return fmt.Errorf("archive: delete %s: %w", obj.Key, err)
		}
	}
	err = routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		if err := routing.ClearOverlay(ctx, tx, m); err != nil {
			return err
		}
		_, err := sq.Delete(stateTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("archive: remove %s: %w", m, err)
	}
	a.p.Log.Info().Str("tenant", tenant).Str("month", m.String()).Msg("archive removed")
	return nil
}
