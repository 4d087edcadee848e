package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// Run is the migrate module: every Poll it looks at each tenant's
// migration and, where there is work — a backfill to run or go on with, a
// verification to make — takes the tenant's lock and does it. A tenant
// whose lock another process holds is left to it. It returns when ctx ends.
func (mg *Migrator) Run(ctx context.Context) error {
	t := time.NewTicker(mg.p.Poll)
	defer t.Stop()
	for {
		for _, tenant := range mg.p.Tenants() {
			if ctx.Err() != nil {
				return nil
			}
			if err := mg.Tick(ctx, tenant); err != nil && ctx.Err() == nil {
				mg.p.Log.Warn().Err(err).Str("tenant", tenant).Msg("migration step failed; retrying")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tick does whatever work the tenant's migration has now, under its lock;
// it returns at once when there is none or another process holds the lock.
func (mg *Migrator) Tick(ctx context.Context, tenant string) error {
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	m, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return err
	}
	mg.m.export(tenant, m)
	if !mg.hasWork(m) {
		return nil
	}
	keys, err := mg.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	lock, err := routing.AcquireLock(ctx, mg.p.Redis, mg.p.Scripts, keys.MigrateLock(), mg.p.LockTTL, 0)
	if errors.Is(err, routing.ErrLockBusy) {
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	held, stop := lock.Keep(ctx)
	defer stop()
	err = mg.work(held, db, tenant)
	if cause := context.Cause(held); errors.Is(cause, routing.ErrLockLost) {
		return errors.Join(cause, err)
	}
	return err
}

func (mg *Migrator) hasWork(m routing.Migration) bool {
	switch m.State {
	case routing.MigrationBackfilling:
		// writes opened: wait until every process reads the split sources
		// before the month tables get copies
		return m.OpenedAt.Valid && time.Since(m.OpenedAt.Time) >= settle ||
			m.OpenedAt.Valid && m.UpdatedAt.Sub(m.OpenedAt.Time) >= settle
	case routing.MigrationVerifying:
		return m.VerifyPending
	}
	return false
}

// work runs the tenant's migration as far as it goes: batches until the
// copy is complete (or paused), then routes, then verification.
func (mg *Migrator) work(ctx context.Context, db *sql.DB, tenant string) error {
	pace := pacer{rate: float64(mg.p.Config.RowsPerSecond)}
	window := rateWindow{span: rateSpan}
	for ctx.Err() == nil {
		m, err := routing.LoadMigration(ctx, db)
		if err != nil {
			return err
		}
		mg.m.export(tenant, m)
		switch {
		case m.State == routing.MigrationBackfilling && m.CursorID < m.LegacyMax:
			start := time.Now()
			achieved := window.rate(start)
			mg.m.limit.WithLabelValues(tenant).Set(float64(mg.p.Config.RowsPerSecond))
			mg.m.achieved.WithLabelValues(tenant).Set(achieved)
			n, err := mg.batch(ctx, db, tenant, m, achieved)
			if err != nil {
				mg.m.failures.WithLabelValues(tenant).Inc()
				mg.p.Log.Warn().Err(err).Str("tenant", tenant).Int64("cursor", m.CursorID).Msg("backfill batch failed; retrying")
				return err
			}
			window.add(start, n)
			_ = sleep(ctx, pace.wait(time.Now(), n))
		case m.State == routing.MigrationBackfilling:
			if err := mg.afterCopy(ctx, db, tenant, m); err != nil {
				return err
			}
		case m.State == routing.MigrationVerifying && m.VerifyPending:
			if err := mg.verify(ctx, db, tenant, m); err != nil {
				return err
			}
		default:
			return nil
		}
	}
	return nil
}

// rateSpan is how far back the achieved copy rate looks.
const rateSpan = 10 * time.Second

// batch copies the next batch_size legacy rows after the cursor (keyset on
// message_id, never OFFSET) into their month tables in one transaction,
// with the cursor and counts; a row already present is left as it is
// (ON DUPLICATE KEY UPDATE no-op) and counted — a difference of its
// content is the verification's to find. achieved is the copy rate of the
// batches before it, recorded with it. It returns the rows read.
func (mg *Migrator) batch(ctx context.Context, db *sql.DB, tenant string, m routing.Migration, achieved float64) (int, error) {
	started := time.Now()
	// the batch's bounds: the next batch_size keys after the cursor
	var n int
	var last sql.NullInt64
	if err := sq.Select("COUNT(*)", "MAX(message_id)").
		FromSelect(sq.Select("message_id").From(routing.LegacyQuoted()).
			Where(sq.Gt{"message_id": m.CursorID}).Where(sq.LtOrEq{"message_id": m.LegacyMax}).
			OrderBy("message_id").Limit(uint64(mg.p.Config.BatchSize)), "b").
		RunWith(db).QueryRowContext(ctx).Scan(&n, &last); err != nil {
		return 0, mg.failed(ctx, db, m, started, fmt.Errorf("read the batch's keys: %w", err))
	}
	if n == 0 {
		// nothing left below the bound: the copy is complete
		return 0, routing.Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := routing.SetMigration(ctx, tx, routing.MigrationChange{CursorID: &m.LegacyMax}, routing.MigrationBackfilling)
			return err
		})
	}
	var res copied
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		var err error
		res, err = mg.copyRange(ctx, tx, tenant, sq.And{sq.Gt{"l.message_id": m.CursorID}, sq.LtOrEq{"l.message_id": last.Int64}})
		if err == nil && res.read != n {
			err = fmt.Errorf("%d of the %d rows after message_id %d have no recorded month range (rows added to the legacy table after cutover?)",
				n-res.read, n, m.CursorID)
		}
		if err != nil {
			return err
		}
		return mg.recordBatch(ctx, tx, m, last.Int64, res, started, achieved)
	})
	committed := err == nil
	if errors.Is(err, errMovedOn) {
		err = nil
	}
	if err != nil {
		return 0, mg.failed(ctx, db, m, started, err)
	}
	if committed {
		mg.m.rows.WithLabelValues(tenant, "inserted").Add(float64(res.inserted))
		mg.m.rows.WithLabelValues(tenant, "present").Add(float64(res.present))
		mg.m.rows.WithLabelValues(tenant, "skewed").Add(float64(res.skewed))
		mg.m.lastBatch.WithLabelValues(tenant).SetToCurrentTime()
		mg.m.rate.WithLabelValues(tenant).Set(perSecond(n, time.Since(started)))
	}
	return n, nil
}

// copied is what one batch did.
type copied struct {
	read                      int
	inserted, present, skewed int
}

// legacyAs are the legacy columns of the table aliased l.
func legacyAs() []string {
	out := columnNames()
	for i, c := range out {
		out[i] = "l." + c
	}
	return out
}

// copyRange copies the legacy rows where (over the legacy table as l)
// selects, in tx, each into the month its seq range goes to — on the
// server, one INSERT … SELECT per month and one more for their mention
// index entries: no row travels through imshard, and what comes back is a
// line per month. read counts the rows that have
// a month range (every row of a recorded topic). The route mirror is left
// to the pass after the copy (afterCopy).
func (mg *Migrator) copyRange(ctx context.Context, tx *sql.Tx, tenant string, where sq.Sqlizer) (copied, error) {
	var res copied
	rows, err := sq.Select("s.shard_month", "COUNT(*)", "SUM(DATE_FORMAT(l.created_at, '%Y%m') <> s.shard_month)").
		From(routing.LegacyQuoted() + " AS l").Join(routing.SplitsJoin).Where(where).
		GroupBy("1").OrderBy("1").RunWith(tx).QueryContext(ctx)
	if err != nil {
		return res, fmt.Errorf("count the rows by month: %w", err)
	}
	var months []routing.Month
	for rows.Next() {
		var ms string
		var n, skewed int
		if err := rows.Scan(&ms, &n, &skewed); err != nil {
			_ = rows.Close()
			return res, err
		}
		m, err := routing.ParseMonth(ms)
		if err != nil {
			_ = rows.Close()
			return res, err
		}
		months = append(months, m)
		res.read += n
		res.skewed += skewed
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return res, err
	}
	for _, m := range months {
		t, _, err := mg.p.Catalog.Table(ctx, tenant, m)
		if err != nil {
			return res, fmt.Errorf("month %s: %w", m, err)
		}
		// a no-op on a present row: never INSERT IGNORE, which would turn
		// truncation and invalid values into warnings
		out, err := sq.Insert(t.Quoted()).Columns(columnNames()...).
			Select(sq.Select(legacyAs()...).From(routing.LegacyQuoted() + " AS l").Join(routing.SplitsJoin).
				Where(where).Where(sq.Eq{"s.shard_month": m.String()})).
			Suffix("ON DUPLICATE KEY UPDATE message_id = " + t.Quoted() + ".message_id").RunWith(tx).ExecContext(ctx)
		if err != nil {
			return res, fmt.Errorf("insert into %s: %w", t.Name(), err)
		}
		n, err := out.RowsAffected()
		if err != nil {
			return res, err
		}
		res.inserted += int(n)
	}
	// the copied messages' mentions, in the same transaction: a backfilled
	// message counts in mention_unread like one persist stored
	if err := routing.CopyLegacyMentions(ctx, tx, where); err != nil {
		return res, err
	}
	res.present = res.read - res.inserted
	return res, nil
}

// errMovedOn rolls a batch back: the migration was paused meanwhile (or
// moved on by someone else).
var errMovedOn = errors.New("migrate: the backfill moved on meanwhile")

// recordBatch records the batch — cursor, counts, pace and its log line —
// in the batch's transaction: errMovedOn when the migration was paused
// meanwhile (or moved on by someone else), and the batch is rolled back.
func (mg *Migrator) recordBatch(ctx context.Context, tx *sql.Tx, m routing.Migration, last int64, res copied, started time.Time, achieved float64) error {
	ok, err := routing.RecordMigrationBatch(ctx, tx, routing.MigrationBatch{FromID: m.CursorID, ToID: last, Read: res.read,
		Inserted: res.inserted, Present: res.present, Skew: res.skewed, Started: started, Finished: time.Now()},
		routing.MigrationRate{Limit: mg.p.Config.RowsPerSecond, Achieved: int(achieved), Batch: int(perSecond(res.read, time.Since(started)))})
	if err == nil && !ok {
		err = errMovedOn
	}
	return err
}

// failed records a failed batch attempt and returns its error.
func (mg *Migrator) failed(ctx context.Context, db *sql.DB, m routing.Migration, started time.Time, cause error) error {
	if ctx.Err() != nil {
		return cause
	}
	msg := cause.Error()
	_ = routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		if err := routing.LogMigrationBatch(ctx, tx, routing.MigrationBatch{FromID: m.CursorID, ToID: m.CursorID, Err: msg,
			Started: started, Finished: time.Now()}); err != nil {
			return err
		}
		_, err := routing.SetMigration(ctx, tx, routing.MigrationChange{Failure: truncate(msg, 500)})
		return err
	})
	return cause
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// mirrorChunk is how many topics one transaction of the mirror pass widens.
const mirrorChunk = 500

// afterCopy runs once the cursor reached the end: a first pass widens the
// route mirror by the legacy rows and rebuilds every topic's Redis route
// from it (or, when some rows were already present, recomputes each
// topic's mirror and route from the month tables); after a failed
// verification it copies the listed ranges again first (rows still
// missing are inserted, present ones stay), then re-runs the verification.
func (mg *Migrator) afterCopy(ctx context.Context, db *sql.DB, tenant string, m routing.Migration) error {
	var topics []string
	exact := false // every legacy row was inserted by the batches, once
	if m.VerifyRuns > 0 {
		diffs, err := routing.LoadMigrationDiffs(ctx, db, 0)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, d := range diffs {
			if err := mg.recopy(ctx, db, tenant, d); err != nil {
				return err
			}
			if !seen[d.Topic] {
				seen[d.Topic] = true
				topics = append(topics, d.Topic)
			}
		}
	} else {
		all, err := routing.MigrationTopics(ctx, db)
		if err != nil {
			return err
		}
		for _, t := range all {
			topics = append(topics, t.Topic)
		}
		exact = m.RowsPresent == 0
	}
	if exact {
		// every legacy row was inserted by the batches, once: the mirror
		// grows by the legacy rows' ranges and counts, topic by topic
		if err := routing.MirrorLegacy(ctx, db, topics, mirrorChunk); err != nil {
			return fmt.Errorf("route mirror: %w", err)
		}
		if err := mg.p.RebuildRoutes(ctx, tenant, topics); err != nil {
			return fmt.Errorf("routes: %w", err)
		}
	} else {
		for i, topic := range topics {
			if err := mg.p.FixRoute(ctx, tenant, topic); err != nil {
				return fmt.Errorf("route of %s: %w", topic, err)
			}
			if i%100 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	_, err := routing.StepMigration(ctx, db, routing.StepBackfilled, routing.MigrationChange{})
	if err == nil {
		mg.p.Log.Info().Str("tenant", tenant).Int("topics", len(topics)).Msg("backfill complete, routes rebuilt; verifying")
	}
	return err
}

// recopy copies the legacy rows of one listed difference again.
func (mg *Migrator) recopy(ctx context.Context, db *sql.DB, tenant string, d routing.MigrationDiff) error {
	return routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		res, err := mg.copyRange(ctx, tx, tenant, sq.And{sq.Eq{"l.topic": d.Topic}, sq.GtOrEq{"l.seqid": d.MinSeq}, sq.LtOrEq{"l.seqid": d.MaxSeq}})
		if err != nil || res.inserted == 0 { // a range whose rows were all there already adds nothing
			return err
		}
		_, err = routing.SetMigration(ctx, tx, routing.MigrationChange{Inserted: int64(res.inserted)})
		return err
	})
}
