package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// LegacyFixture describes a legacy single table to fill: Topics topics
// named Prefix + a zero-padded number of Width digits, PerTopic rows each
// (seqs 1..PerTopic), spread evenly over Months months from First; every
// 97th message is recalled, some carry a head, mentions, a reply.
type LegacyFixture struct {
	First            routing.Month
	Months           int
	Topics, PerTopic int
	Prefix           string
	Width            int
	GroupID          int64
}

// Topic is the name of topic i.
func (f LegacyFixture) Topic(i int) string { return fmt.Sprintf("%s%0*d", f.Prefix, f.Width, i) }

// FillLegacy creates the legacy table (the month template under its fixed
// name) and fills it with one INSERT … SELECT per month of rows (an
// interrupted fill leaves at most a month's statement for the server to
// roll back): message ids grow with created_at, as Snowflake ids do.
func FillLegacy(ctx context.Context, db *sql.DB, f LegacyFixture) error {
	if _, err := db.ExecContext(ctx, routing.LegacyDDL()); err != nil {
		return err
	}
	per := max(f.PerTopic/f.Months, 1)
	q := fmt.Sprintf(`INSERT INTO %s (message_id, topic, group_id, seqid, from_user, client_msg_id, msg_type, status,
  content, head, mentioned_user_ids, mention_all, reply_seqid, version, created_at, updated_at)
WITH RECURSIVE s(i) AS (SELECT CAST(? AS SIGNED) UNION ALL SELECT i + 1 FROM s WHERE i < ?),
 tp(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM tp WHERE j < %d),
 r AS (SELECT i, j, TIMESTAMPADD(SECOND, ((i - 1) %% %d) * 600 + j %% 600,
   TIMESTAMPADD(MONTH, LEAST((i - 1) DIV %d, %d), ?)) AS at FROM s, tp)
SELECT (UNIX_TIMESTAMP(at) * 1000) * 4194304 + j * 1024 + i %% 1024, CONCAT(?, LPAD(j, %d, '0')), %d, i, 100 + i %% 5,
  CONCAT('c', j, '-', i), 'text', IF(i %% 97 = 0, 'recalled', 'normal'),
  IF(i %% 97 = 0, NULL, JSON_OBJECT('text', CONCAT('legacy message ', i, ' of ', j), 'n', i, 'tags', JSON_ARRAY('a', 'b'))),
  IF(i %% 11 = 0, JSON_OBJECT('k', 'v'), NULL), IF(i %% 13 = 0, JSON_ARRAY(100, 101), NULL), i %% 29 = 0,
  IF(i %% 17 = 0, i - 1, NULL), 1, at, at
FROM r`, routing.LegacyQuoted(), f.Topics-1, per, per, f.Months-1, f.Width, f.GroupID)
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// the recursive CTEs count up to the topics and the rows per topic
	// (MariaDB's and MySQL 8's limits; each server ignores the other's)
	_, _ = conn.ExecContext(ctx, "SET SESSION max_recursive_iterations = 100000000")
	_, _ = conn.ExecContext(ctx, "SET SESSION cte_max_recursion_depth = 100000000")
	for lo := 1; lo <= f.PerTopic; lo += per {
		// the seqs of one month (the last one takes the remainder)
		hi := lo + per - 1
		if (lo-1)/per >= f.Months-1 {
			hi = f.PerTopic
		}
		if _, err := conn.ExecContext(ctx, q, lo, hi, f.First.Start(), f.Prefix); err != nil {
			return err
		}
		if hi == f.PerTopic {
			break
		}
	}
	return nil
}

// MigrateParams configure `imshard bench migrate`: the backfill of a legacy
// table beside a raw INSERT … SELECT of the same rows on the same server,
// then the foreground page p99 beside no backfill, beside the unthrottled
// backfill, and beside the backfill throttled to half the rate it had
// beside the readers.
type MigrateParams struct {
	Fixture LegacyFixture
	Tenant  string
	DB      *sql.DB
	// RawTable is a fresh table of the month template the raw
	// INSERT … SELECT fills (not registered: nothing reads it).
	RawTable routing.Table
	// Plan and Start are the migration's commands; Run runs the migrate
	// module's work for the tenant with the throttle given (0: none) until
	// the migration reaches done or ctx ends.
	Plan, Start func(ctx context.Context) error
	Run         func(ctx context.Context, rowsPerSecond int) error
	// Reset undoes the copy for the throttled round: the month tables are
	// emptied and the migration's cursor and counts go back to 0.
	Reset func(ctx context.Context) error
	// Page reads one newest-first page of 50 of topic below before, as a
	// client's read does (the dual read while the tenant migrates).
	Page     func(ctx context.Context, topic string, before int64) error
	Readers  int
	Duration time.Duration
	// Rounds is how many times each copy runs: round 1 runs the raw copy
	// first, round 2 the backfill first, and so on (raw, backfill,
	// backfill, raw, …), so neither pays alone for what the server still
	// does after the other (flushing, purge).
	Rounds int
	// Scan lists reader counts to run the unthrottled backfill beside,
	// for Duration each, after the other rounds: what the copy gets of
	// the machine as the readers grow (MigrateReport.Scan).
	Scan     []int
	Progress io.Writer
}

// ScanRound is the unthrottled backfill beside Readers readers.
type ScanRound struct {
	Readers int
	Pages   Latencies
	Copy    BatchLog
}

// MigrateReport holds the measurements.
type MigrateReport struct {
	Rows    int64
	Fixture time.Duration // building the legacy table
	Copies  []CopyRound
	Verify  time.Duration // after the first backfill: routes and verification
	// Throttle is the rows/s the throttled round allowed: half of what the
	// unthrottled copy achieved beside the readers.
	Throttle int
	// Unthrottled and Throttled are what the two rounds beside the
	// readers' batch logs say: committed batches, the wall time from the
	// first one's start to the last one's end (throttle waits included)
	// and the time inside them.
	Unthrottled, Throttled BatchLog
	// foreground pages without a backfill, beside the unthrottled one and
	// beside the throttled one
	Idle, Loaded, Busy Latencies
	Scan               []ScanRound
}

// BatchLog sums committed backfill batches (im_migration_batches).
type BatchLog struct {
	Batches int
	Rows    int64
	// Wall is from the first batch's start to the last one's end, Inside
	// the time inside the batches; Paced is from the first batch's start
	// to the last one's, and PacedRows the rows of every batch but the
	// last: the pace the throttle kept.
	Wall, Inside, Paced time.Duration
	PacedRows           int64
}

// Achieved is the copy rate with the throttle's waits: the rows of every
// batch but the last over the time from the first batch's start to the
// last one's (the wait after the last batch lies beyond the log).
func (b BatchLog) Achieved() float64 {
	if b.Batches < 2 {
		return Rate(b.Rows, b.Wall)
	}
	return Rate(b.PacedRows, b.Paced)
}

// Capacity is the rate inside the batches alone: what the database gave
// the copy, whatever the throttle allowed.
func (b BatchLog) Capacity() float64 { return Rate(b.Rows, b.Inside) }

// CopyRound is one round of the two copies of the same rows.
type CopyRound struct {
	RawFirst      bool
	Raw, Backfill time.Duration
}

// Latencies are a reader round's page latencies.
type Latencies struct {
	Pages    int
	P50, P99 time.Duration
}

// RawRate and BackfillRate are rows per second over every round.
func (r MigrateReport) RawRate() float64 {
	var d time.Duration
	for _, c := range r.Copies {
		d += c.Raw
	}
	return Rate(r.Rows*int64(len(r.Copies)), d)
}

// BackfillRate: see RawRate.
func (r MigrateReport) BackfillRate() float64 {
	var d time.Duration
	for _, c := range r.Copies {
		d += c.Backfill
	}
	return Rate(r.Rows*int64(len(r.Copies)), d)
}

// Rate is n per second of d.
func Rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func (p *MigrateParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// Migrate runs the measurements in one process on the same services.
func Migrate(ctx context.Context, p MigrateParams) (MigrateReport, error) {
	var rep MigrateReport
	f := p.Fixture
	rep.Rows = int64(f.Topics * f.PerTopic)
	p.logf("legacy fixture: %d rows, %d topics, %d months …", rep.Rows, f.Topics, f.Months)
	start := time.Now()
	if err := FillLegacy(ctx, p.DB, f); err != nil {
		return rep, fmt.Errorf("bench: legacy fixture: %w", err)
	}
	rep.Fixture = time.Since(start)
	p.logf("legacy fixture built in %v", rep.Fixture.Round(time.Millisecond))
	if _, err := p.DB.ExecContext(ctx, p.RawTable.CreateDDL()); err != nil {
		return rep, err
	}
	p.logf("plan and cutover …")
	if err := p.Plan(ctx); err != nil {
		return rep, err
	}
	if err := p.Start(ctx); err != nil {
		return rep, err
	}
	// the module copies only once every process can see the writes open
	if err := sleepCtx(ctx, 2*routing.MigrationRefresh); err != nil {
		return rep, err
	}
	for i := range max(p.Rounds, 1) {
		c := CopyRound{RawFirst: i%2 == 0}
		var err error
		if c.RawFirst {
			if c.Raw, err = p.rawCopy(ctx, i); err != nil {
				return rep, err
			}
		}
		if i > 0 {
			if err := p.Reset(ctx); err != nil {
				return rep, err
			}
		}
		p.logf("round %d: backfill, unthrottled …", i+1)
		copied, verified, err := p.timeBackfill(ctx, 0)
		if err != nil {
			return rep, err
		}
		c.Backfill = copied
		if i == 0 {
			rep.Verify = verified - copied
		}
		if !c.RawFirst {
			if c.Raw, err = p.rawCopy(ctx, i); err != nil {
				return rep, err
			}
		}
		p.logf("round %d: raw %v, backfill %v", i+1, c.Raw.Round(time.Millisecond), c.Backfill.Round(time.Millisecond))
		rep.Copies = append(rep.Copies, c)
	}
	var err error
	p.logf("foreground pages, %d readers, no backfill, %v …", p.Readers, p.Duration)
	if rep.Idle, err = p.read(ctx, p.Duration); err != nil {
		return rep, err
	}
	p.logf("foreground pages beside the backfill, unthrottled, %v …", p.Duration)
	if rep.Loaded, rep.Unthrottled, err = p.busy(ctx, 0); err != nil {
		return rep, err
	}
	// half of what the copy gets beside the readers: a limit the copy
	// can reach there, so the round measures the readers beside a copy at
	// its limit (half its rate alone would be above what it gets beside
	// them, and the throttle would never bind)
	rep.Throttle = max(int(rep.Unthrottled.Achieved()/2), 1)
	p.logf("foreground pages beside the backfill throttled to %d rows/s, %v …", rep.Throttle, p.Duration)
	if rep.Busy, rep.Throttled, err = p.busy(ctx, rep.Throttle); err != nil {
		return rep, err
	}
	for _, n := range p.Scan {
		p.logf("the backfill, unthrottled, beside %d readers, %v …", n, p.Duration)
		sp := p
		sp.Readers = n
		r := ScanRound{Readers: n}
		if r.Pages, r.Copy, err = sp.busy(ctx, 0); err != nil {
			return rep, err
		}
		rep.Scan = append(rep.Scan, r)
	}
	return rep, nil
}

// busy runs the readers for Duration while the backfill (reset first)
// runs at rate (0: unthrottled), and returns their latencies and the
// backfill's committed batches.
func (p *MigrateParams) busy(ctx context.Context, rate int) (Latencies, BatchLog, error) {
	if err := p.Reset(ctx); err != nil {
		return Latencies{}, BatchLog{}, err
	}
	logFrom, err := routing.LastMigrationBatchID(ctx, p.DB)
	if err != nil {
		return Latencies{}, BatchLog{}, err
	}
	bctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runErr = p.Run(bctx, rate)
	}()
	lat, err := p.read(ctx, p.Duration)
	cancel()
	wg.Wait()
	if err != nil {
		return lat, BatchLog{}, err
	}
	if runErr != nil && ctx.Err() == nil && bctx.Err() == nil {
		return lat, BatchLog{}, runErr
	}
	b, err := batchLog(ctx, p.DB, logFrom)
	return lat, b, err
}

// batchLog sums the committed batches logged after id from.
func batchLog(ctx context.Context, db *sql.DB, from int64) (BatchLog, error) {
	var b BatchLog
	batches, err := routing.CommittedMigrationBatches(ctx, db, from)
	if err != nil || len(batches) == 0 {
		return b, err
	}
	for _, x := range batches {
		b.Rows += int64(x.Read)
		b.Inside += x.Finished.Sub(x.Started)
	}
	first, last := batches[0], batches[len(batches)-1]
	b.Batches = len(batches)
	b.Wall, b.Paced, b.PacedRows = last.Finished.Sub(first.Started), last.Started.Sub(first.Started), b.Rows-int64(last.Read)
	return b, nil
}

// rawCopy times one INSERT … SELECT of every legacy row into the emptied
// raw table.
func (p *MigrateParams) rawCopy(ctx context.Context, round int) (time.Duration, error) {
	if _, err := p.DB.ExecContext(ctx, "TRUNCATE TABLE "+p.RawTable.Quoted()); err != nil {
		return 0, err
	}
	p.logf("round %d: raw INSERT … SELECT into %s …", round+1, p.RawTable.Name())
	start := time.Now()
	if _, err := p.DB.ExecContext(ctx, "INSERT INTO "+p.RawTable.Quoted()+" SELECT * FROM "+routing.LegacyQuoted()); err != nil {
		return 0, fmt.Errorf("bench: raw insert: %w", err)
	}
	return time.Since(start), nil
}

// timeBackfill runs the migration to done and returns when the copy
// completed (every row read) and when it was verified, from its start.
func (p *MigrateParams) timeBackfill(ctx context.Context, throttle int) (copied, done time.Duration, err error) {
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(rctx, throttle) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	total := int64(p.Fixture.Topics * p.Fixture.PerTopic)
	for {
		select {
		case err := <-errc:
			if copied == 0 {
				copied = time.Since(start)
			}
			return copied, time.Since(start), err
		case <-tick.C:
		}
		if copied == 0 {
			m, err := routing.LoadMigration(ctx, p.DB)
			if err != nil {
				return 0, 0, err
			}
			if m.RowsRead >= total {
				copied = time.Since(start)
			}
		}
	}
}

// read runs Readers goroutines of pages on random topics at random
// positions for d and returns the latencies.
func (p *MigrateParams) read(ctx context.Context, d time.Duration) (Latencies, error) {
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var lats []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for range p.Readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for rctx.Err() == nil {
				topic := p.Fixture.Topic(rand.IntN(p.Fixture.Topics))
				before := int64(rand.IntN(p.Fixture.PerTopic)) + 2
				t := time.Now()
				err := p.Page(rctx, topic, before)
				if err != nil && rctx.Err() == nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				if err == nil {
					mine = append(mine, time.Since(t))
				}
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	<-rctx.Done() // the whole round, even with no reader
	l := Latencies{Pages: len(lats)}
	l.P50, l.P99 = percentiles(lats)
	return l, firstErr
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
