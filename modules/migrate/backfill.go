package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	keys, err := routing.KeysFor(tenant)
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
	// splits never change after cutover: read once per run of work
	var splits map[string][]routing.Split
	for ctx.Err() == nil {
		m, err := routing.LoadMigration(ctx, db)
		if err != nil {
			return err
		}
		mg.m.export(tenant, m)
		switch {
		case m.State == routing.MigrationBackfilling && m.CursorID < m.LegacyMax:
			if splits == nil {
				if splits, err = routing.LoadSplits(ctx, db, nil); err != nil {
					return err
				}
			}
			start := time.Now()
			n, err := mg.batch(ctx, db, tenant, m, splits)
			if err != nil {
				mg.m.failures.WithLabelValues(tenant).Inc()
				mg.p.Log.Warn().Err(err).Str("tenant", tenant).Int64("cursor", m.CursorID).Msg("backfill batch failed; retrying")
				return err
			}
			mg.throttle(ctx, n, time.Since(start))
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

// throttle sleeps so that the backfill copies at most rows_per_second.
func (mg *Migrator) throttle(ctx context.Context, rows int, took time.Duration) {
	rate := mg.p.Config.RowsPerSecond
	if rate <= 0 || rows == 0 {
		return
	}
	want := time.Duration(float64(rows) / float64(rate) * float64(time.Second))
	if want > took {
		_ = sleep(ctx, want-took)
	}
}

// insertChunk bounds the rows of one INSERT (placeholders per statement).
const insertChunk = 1000

// batch copies the next batch_size legacy rows after the cursor (keyset on
// message_id, never OFFSET) into their month tables in one transaction,
// with the cursor and counts; a row already present is left as it is
// (ON DUPLICATE KEY UPDATE no-op) and counted — a difference of its
// content is the verification's to find. It returns the rows read.
func (mg *Migrator) batch(ctx context.Context, db *sql.DB, tenant string, m routing.Migration, splits map[string][]routing.Split) (int, error) {
	started := time.Now()
	cols := columnNames()
	rows, err := sq.Select(cols...).From(routing.LegacyQuoted()).
		Where(sq.Gt{"message_id": m.CursorID}).Where(sq.LtOrEq{"message_id": m.LegacyMax}).
		OrderBy("message_id").Limit(uint64(mg.p.Config.BatchSize)).RunWith(db).QueryContext(ctx)
	if err != nil {
		return 0, mg.failed(ctx, db, m, started, fmt.Errorf("read legacy rows: %w", err))
	}
	batch, err := scanAll(rows)
	if err != nil {
		return 0, mg.failed(ctx, db, m, started, err)
	}
	if len(batch) == 0 {
		// nothing left below the bound: the copy is complete
		_, err := routing.SetMigration(ctx, db, map[string]any{"cursor_id": m.LegacyMax}, routing.MigrationBackfilling)
		return 0, err
	}
	last := batch[len(batch)-1][colMessageID].(int64)
	res, err := mg.copyRows(ctx, db, tenant, batch, splits)
	if err != nil {
		return 0, mg.failed(ctx, db, m, started, err)
	}
	committed, err := mg.commitBatch(ctx, db, m, last, res, started)
	if err != nil {
		return 0, mg.failed(ctx, db, m, started, err)
	}
	if committed {
		mg.m.rows.WithLabelValues(tenant, "inserted").Add(float64(res.inserted))
		mg.m.rows.WithLabelValues(tenant, "present").Add(float64(res.present))
		mg.m.rows.WithLabelValues(tenant, "skewed").Add(float64(res.skewed))
		mg.m.lastBatch.WithLabelValues(tenant).SetToCurrentTime()
		if took := time.Since(started).Seconds(); took > 0 {
			mg.m.rate.WithLabelValues(tenant).Set(float64(len(batch)) / took)
		}
	}
	return len(batch), nil
}

// copied is what one batch did.
type copied struct {
	tx                        *sql.Tx
	read                      int
	inserted, present, skewed int
}

// copyRows inserts rows into their month tables in a transaction it
// leaves open in the result (commitBatch ends it).
func (mg *Migrator) copyRows(ctx context.Context, db *sql.DB, tenant string, batch [][]any, splits map[string][]routing.Split) (copied, error) {
	res := copied{read: len(batch)}
	if splits == nil {
		topics := map[string]bool{}
		for _, r := range batch {
			topics[r[colTopic].(string)] = true
		}
		var err error
		if splits, err = routing.LoadSplits(ctx, db, sortedTopics(topics)); err != nil {
			return res, err
		}
	}
	byMonth := map[routing.Month][][]any{}
	mirror := map[mirrorKey]*routing.MirrorRow{}
	var months []routing.Month
	for _, r := range batch {
		topic := r[colTopic].(string)
		sp := splits[topic]
		if len(sp) == 0 {
			return res, fmt.Errorf("topic %q has no recorded month ranges (rows added to the legacy table after cutover?)", topic)
		}
		m := routing.MonthOfSeq(sp, r[colSeq].(int64))
		if created, ok := r[colCreatedAt].(time.Time); ok && routing.MonthOf(created) != m {
			res.skewed++
		}
		if _, ok := byMonth[m]; !ok {
			months = append(months, m)
		}
		byMonth[m] = append(byMonth[m], r)
		widen(mirror, topic, m, r[colSeq].(int64), r[colCreatedAt])
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return res, err
	}
	res.tx = tx
	cols := columnNames()
	for _, m := range months {
		t, _, err := mg.p.Catalog.Table(ctx, tenant, m)
		if err != nil {
			_ = tx.Rollback()
			return res, fmt.Errorf("month %s: %w", m, err)
		}
		rs := byMonth[m]
		for lo := 0; lo < len(rs); lo += insertChunk {
			ins := sq.Insert(t.Quoted()).Columns(cols...)
			for _, r := range rs[lo:min(lo+insertChunk, len(rs))] {
				ins = ins.Values(r...)
			}
			// a no-op on a present row: never INSERT IGNORE, which would
			// turn truncation and invalid values into warnings
			out, err := ins.Suffix("ON DUPLICATE KEY UPDATE message_id = message_id").RunWith(tx).ExecContext(ctx)
			if err != nil {
				_ = tx.Rollback()
				return res, fmt.Errorf("insert into %s: %w", t.Name(), err)
			}
			n, err := out.RowsAffected()
			if err != nil {
				_ = tx.Rollback()
				return res, err
			}
			chunk := min(insertChunk, len(rs)-lo)
			res.inserted += int(n)
			res.present += chunk - int(n)
		}
	}
	if res.present == 0 {
		// every row is new: the mirror's counts grow by exactly these rows
		// (with rows already present the counts are recomputed from the
		// tables once the copy is complete)
		if err := routing.WidenMirror(ctx, tx, mirrorRows(mirror)); err != nil {
			_ = tx.Rollback()
			return res, err
		}
	}
	return res, nil
}

type mirrorKey struct {
	topic string
	month routing.Month
}

// widen adds one row to the mirror rows of its topic month.
func widen(rows map[mirrorKey]*routing.MirrorRow, topic string, m routing.Month, seq int64, created any) {
	at, _ := created.(time.Time)
	k := mirrorKey{topic, m}
	r := rows[k]
	if r == nil {
		rows[k] = &routing.MirrorRow{Topic: topic, MonthRange: routing.MonthRange{Month: m, MinSeq: seq, MaxSeq: seq, Count: 1},
			MinCreatedAt: at, MaxCreatedAt: at}
		return
	}
	r.MinSeq, r.MaxSeq, r.Count = min(r.MinSeq, seq), max(r.MaxSeq, seq), r.Count+1
	if at.Before(r.MinCreatedAt) {
		r.MinCreatedAt = at
	}
	if at.After(r.MaxCreatedAt) {
		r.MaxCreatedAt = at
	}
}

// mirrorRows lists the rows in topic then month order, the order every
// writer locks mirror rows in.
func mirrorRows(rows map[mirrorKey]*routing.MirrorRow) []routing.MirrorRow {
	out := make([]routing.MirrorRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b routing.MirrorRow) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return a.Month.Compare(b.Month)
	})
	return out
}

// commitBatch moves the cursor and counts and logs the batch in the
// batch's transaction, fenced by the cursor it started from and the
// state: a batch whose migration was paused meanwhile (or moved on by
// someone else) is rolled back (false).
func (mg *Migrator) commitBatch(ctx context.Context, db *sql.DB, m routing.Migration, last int64, res copied, started time.Time) (bool, error) {
	defer func() { _ = res.tx.Rollback() }()
	out, err := sq.Update("im_migration").
		Set("cursor_id", last).
		Set("rows_read", sq.Expr("rows_read + ?", res.read)).
		Set("rows_inserted", sq.Expr("rows_inserted + ?", res.inserted)).
		Set("rows_present", sq.Expr("rows_present + ?", res.present)).
		Set("rows_skewed", sq.Expr("rows_skewed + ?", res.skewed)).
		Set("batches", sq.Expr("batches + 1")).
		Where(sq.Eq{"id": 1, "cursor_id": m.CursorID, "state": string(routing.MigrationBackfilling)}).
		RunWith(res.tx).ExecContext(ctx)
	if err != nil {
		return false, err
	}
	if n, err := out.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if err := routing.LogMigrationBatch(ctx, res.tx, routing.MigrationBatch{FromID: m.CursorID, ToID: last, Read: res.read,
		Inserted: res.inserted, Present: res.present, Skew: res.skewed, Started: started, Finished: time.Now()}); err != nil {
		return false, err
	}
	return true, res.tx.Commit()
}

// failed records a failed batch attempt and returns its error.
func (mg *Migrator) failed(ctx context.Context, db *sql.DB, m routing.Migration, started time.Time, cause error) error {
	if ctx.Err() != nil {
		return cause
	}
	msg := cause.Error()
	_ = routing.LogMigrationBatch(ctx, db, routing.MigrationBatch{FromID: m.CursorID, ToID: m.CursorID, Err: msg,
		Started: started, Finished: time.Now()})
	_, _ = routing.SetMigration(ctx, db, map[string]any{"batch_failures": sq.Expr("batch_failures + 1"),
		"last_error": truncate(msg, 500)})
	return cause
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// afterCopy runs once the cursor reached the end: a first pass rebuilds
// every topic's route mirror and Redis route from the month tables; after a
// failed verification it copies the listed ranges again first (rows still
// missing are inserted, present ones stay), then re-runs the verification.
func (mg *Migrator) afterCopy(ctx context.Context, db *sql.DB, tenant string, m routing.Migration) error {
	var topics []string
	exact := false // the mirror is exact: only Redis needs the routes
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
	_, err := routing.StepMigration(ctx, db, routing.StepBackfilled, map[string]any{
		"routes_done": 1, "verify_pending": 1, "backfilled_at": sq.Expr("COALESCE(backfilled_at, NOW(3))"),
	})
	if err == nil {
		mg.p.Log.Info().Str("tenant", tenant).Int("topics", len(topics)).Msg("backfill complete, routes rebuilt; verifying")
	}
	return err
}

// recopy copies the legacy rows of one listed difference again.
func (mg *Migrator) recopy(ctx context.Context, db *sql.DB, tenant string, d routing.MigrationDiff) error {
	rows, err := sq.Select(columnNames()...).From(routing.LegacyQuoted()).
		Where(sq.Eq{"topic": d.Topic}).Where(sq.GtOrEq{"seqid": d.MinSeq}).Where(sq.LtOrEq{"seqid": d.MaxSeq}).
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return err
	}
	batch, err := scanAll(rows)
	if err != nil {
		return err
	}
	if len(batch) == 0 {
		return nil
	}
	res, err := mg.copyRows(ctx, db, tenant, batch, nil)
	if err != nil {
		return err
	}
	defer func() { _ = res.tx.Rollback() }()
	if _, err := routing.SetMigration(ctx, res.tx, map[string]any{"rows_inserted": sq.Expr("rows_inserted + ?", res.inserted)}); err != nil {
		return err
	}
	return res.tx.Commit()
}

// scanAll reads every row of the legacy columns and closes rows; text
// comes back as string (JSON columns take text, not binary strings, on
// MySQL 8).
func scanAll(rows *sql.Rows) ([][]any, error) {
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(legacyColumns))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			_ = rows.Close()
			return nil, err
		}
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				vals[i] = string(b)
			}
		}
		out = append(out, vals)
	}
	return out, errors.Join(rows.Err(), rows.Close())
}
