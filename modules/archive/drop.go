package archive

import (
	"context"
	"database/sql"
	"fmt"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
)

// CrashDropping is the archive's failpoint (testhook.CrashArchiveEnv) just
// before an archived month's table is dropped: the catalog says archived,
// the table is still there.
const CrashDropping = "dropping"

// dropWait is how long after its mark an archived month's table stays:
// archive.keep_table, and never less than routing.RestoreSettle, by when
// every process's catalog cache (routing.CatalogTTL) reads the month from
// its archive — a process still holding the month as sealed would read the
// table.
func (a *Archiver) dropWait() int64 {
	return max(a.p.Config.KeepTable, routing.RestoreSettle).Microseconds()
}

// retryReach is how long after a month's end a send's retry may still look
// for its first send in the month's table: send.idempotency_ttl after the
// first send, which the produce timeout may have kept from being answered.
// A month's table is never dropped within it, whatever keep_table says —
// the retry would read the missing table as "not sent" and store the
// message twice.
func (a *Archiver) retryReach() int64 {
	return (a.p.Config.IdempotencyTTL + a.p.ProduceTimeout).Microseconds()
}

// dropDue drops the tables of the tenant's archived months (only, when not
// zero) whose wait (dropWait) has passed since their mark and whose end
// is out of a retry's reach (retryReach), and returns the months dropped.
// The caller holds the tenant's archive lock: no restore re-creates a
// table meanwhile, and a month restored before is sealed again, its
// im_archives row gone. Dropping is the last step of an archive
// and is idempotent: a run killed before or during the DROP leaves the
// month archived (read from its archive) with or without its table, and
// the next run (the patrol, or `shard archive` of the month) drops what
// is left.
func (a *Archiver) dropDue(ctx context.Context, db *sql.DB, tenant string, only routing.Month) ([]routing.Month, error) {
	q := sq.Select("a.shard_month").From(stateTable+" a").
		Join("information_schema.TABLES t ON t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = CONCAT(?, a.shard_month)", "im_group_messages_").
		Where(sq.Eq{"a.step": StepMarked}).
		Where("a.marked_at <= UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND", a.dropWait()).
		Where("STR_TO_DATE(CONCAT(a.shard_month, '01'), '%Y%m%d') + INTERVAL 1 MONTH <= UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND", a.retryReach()).
		OrderBy("a.shard_month")
	if !only.IsZero() {
		q = q.Where(sq.Eq{"a.shard_month": only.String()})
	}
	rows, err := q.RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("archive: tables due to drop: %w", err)
	}
	var due []routing.Month
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, err
		}
		m, err := routing.ParseMonth(s)
		if err != nil {
			rows.Close()
			return nil, err
		}
		due = append(due, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(due) == 0 {
		return nil, err
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return nil, err
	}
	archived := map[routing.Month]bool{}
	for _, s := range shards {
		archived[s.Month] = s.Status == routing.StatusArchived
	}
	var dropped []routing.Month
	for _, m := range due {
		if !archived[m] {
			continue // marked, then sent back (by hand): its table is read again
		}
		t, err := routing.TableFor(m)
		if err != nil {
			return dropped, err
		}
		testhook.CrashArchive(CrashDropping)
		// DDL on its own statement, behind the placement fence
		if err := routing.FencedDDL(ctx, db, t.DropDDL()); err != nil {
			return dropped, fmt.Errorf("archive: drop %s: %w", t.Name(), err)
		}
		a.m.tablesDropped.Inc()
		a.p.Log.Info().Str("tenant", tenant).Str("month", m.String()).Str("table", t.Name()).
			Msg("archived month's table dropped; the month is read from its archive")
		dropped = append(dropped, m)
	}
	return dropped, nil
}

// DropTables drops the tables of the tenant's archived months that are
// due (dropDue), holding the tenant's archive lock (ErrBusy while an
// archive or restore holds it): the patrol's last archive step.
func (a *Archiver) DropTables(ctx context.Context, tenant string) ([]routing.Month, error) {
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var dropped []routing.Month
	err = exclusive(ctx, db, func() error {
		dropped, err = a.dropDue(ctx, db, tenant, routing.Month{})
		return err
	})
	return dropped, err
}
