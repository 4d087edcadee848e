package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// ArchiveParams shape one `imshard bench archive` run. The tenant must be
// the benchmark's own: its month table Table gets the fixture rows, is
// sealed, archived and then read from its archive.
type ArchiveParams struct {
	DB     *sql.DB
	Tenant string
	Table  routing.Table // a month before the current one
	// Reader is the process's read path: its walk over one month reads the
	// month's table, or its archive once the catalog says archived.
	Reader *readpath.Reader
	// Seal seals the filled month so that it is proven complete.
	Seal func(ctx context.Context) error
	// Archive archives the month (pre-checks, export, verification, mark)
	// and returns its export's duration and the bytes of its objects.
	Archive func(ctx context.Context) (export time.Duration, bytes int64, err error)
	// EmptyCache empties Reader's cache of archive manifests and footers,
	// as a process just started has it.
	EmptyCache func()
	Topics     int
	Rows       int
	Duration   time.Duration // measured time of each page run
	Warmup     time.Duration
	Progress   io.Writer
}

// ArchiveReport holds the figures of one run.
type ArchiveReport struct {
	Rows         int64
	Build        time.Duration
	TableBytes   int64         // data_length + index_length of the month table
	BufferPool   int64         // the server's innodb_buffer_pool_size
	ArchiveBytes int64         // the month's archive objects (Parquet and manifest)
	RawSelect    time.Duration // one SELECT of every row of the month table
	RawOrdered   time.Duration // the same in (topic, seqid) order, the archive's
	Export       time.Duration // the archive's export step
	ArchiveRun   time.Duration // the whole archive: pre-checks, export, verification, mark
	TablePage    QueryResult   // the page from the month table, before archiving
	WarmPage     QueryResult   // the same page from the archive, footers cached
	ColdPage     QueryResult   // the same page from the archive, cache emptied before each
}

// RawRate is rows per second of the raw SELECT.
func (r ArchiveReport) RawRate() float64 { return perSecond(r.Rows, r.RawSelect) }

// RawOrderedRate is rows per second of the raw SELECT in the archive's
// order.
func (r ArchiveReport) RawOrderedRate() float64 { return perSecond(r.Rows, r.RawOrdered) }

// ExportRate is rows per second of the export.
func (r ArchiveReport) ExportRate() float64 { return perSecond(r.Rows, r.Export) }

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// perTopic is each topic's messages: seqs 1 … perTopic.
func (p *ArchiveParams) perTopic() int64 { return int64(p.Rows / p.Topics) }

// Check rejects a shape whose topics are too short for a page.
func (p *ArchiveParams) Check() error {
	if n := p.perTopic(); n < benchPage {
		return fmt.Errorf("bench: %d rows over %d topics leaves %d per topic; need at least %d", p.Rows, p.Topics, n, benchPage)
	}
	return nil
}

func (p *ArchiveParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// Run builds the sealed month, then measures in this order: the table's
// size and a raw SELECT of its rows, the page from the table, the archive,
// its size, the page from the archive warm and cold.
func (p *ArchiveParams) Run(ctx context.Context) (ArchiveReport, error) {
	rep := ArchiveReport{Rows: p.perTopic() * int64(p.Topics)}
	if err := p.Check(); err != nil {
		return rep, err
	}
	start := time.Now()
	if err := fillMonth(ctx, p.DB, p.Table, p.Topics, 0, p.perTopic()); err != nil {
		return rep, err
	}
	if err := routing.Fenced(ctx, p.DB, func(tx *sql.Tx) error { return routing.MirrorFromTable(ctx, tx, p.Table) }); err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	if err := p.Seal(ctx); err != nil {
		return rep, fmt.Errorf("bench: seal %s: %w", p.Table.Month(), err)
	}
	rep.Build = time.Since(start)
	p.logf("bench: %s filled and sealed (%d rows, %s)", p.Table.Name(), rep.Rows, rep.Build.Round(time.Second))
	var err error
	if rep.TableBytes, rep.BufferPool, err = p.tableBytes(ctx); err != nil {
		return rep, err
	}
	if rep.RawSelect, err = p.rawSelect(ctx, rep.Rows); err != nil {
		return rep, err
	}
	if rep.RawOrdered, err = p.rawSelect(ctx, rep.Rows, "topic", "seqid"); err != nil {
		return rep, err
	}
	runs := &QueryParams{Duration: p.Duration, Warmup: p.Warmup, Progress: p.Progress}
	rep.TablePage = runs.run(ctx, "month-table page (before archiving)", 1, p.page)
	p.logf("bench: archiving %s …", p.Table.Month())
	start = time.Now()
	if rep.Export, rep.ArchiveBytes, err = p.Archive(ctx); err != nil {
		return rep, fmt.Errorf("bench: archive %s: %w", p.Table.Month(), err)
	}
	rep.ArchiveRun = time.Since(start)
	rep.WarmPage = runs.run(ctx, "archived page, warm", 1, p.page)
	rep.ColdPage = runs.runStaged(ctx, "archived page, cold (empty cache)", 1, func(_ context.Context, rng *rand.Rand) (func(context.Context) error, error) {
		p.EmptyCache()
		return func(ctx context.Context) error { return p.page(ctx, rng) }, nil
	})
	return rep, ctx.Err()
}

// page reads the newest 50 messages below a random seq of a random topic
// of the month through the read path's walk, from whichever tier the
// catalog names.
func (p *ArchiveParams) page(ctx context.Context, rng *rand.Rand) error {
	before := 1 + benchPage + rng.Int64N(p.perTopic()-benchPage+1)
	ms, err := sourcePage(ctx, p.Reader, p.DB, p.Tenant, readpath.Source{Table: p.Table.Quoted(), Month: p.Table.Month()},
		benchTopic(rng.IntN(p.Topics)), before, benchPage)
	return checkPage(len(ms), err)
}

// tableBytes is the month table's data_length + index_length, its
// statistics refreshed first (the fixture was just written), and the
// buffer pool's size: a table larger than the pool reads its pages from
// disk, which a reader of the month-table figures must know.
func (p *ArchiveParams) tableBytes(ctx context.Context) (table, pool int64, err error) {
	rows, err := p.DB.QueryContext(ctx, "ANALYZE TABLE "+p.Table.Quoted())
	if err != nil {
		return 0, 0, fmt.Errorf("bench: analyze %s: %w", p.Table.Name(), err)
	}
	rows.Close()
	if err := sq.Select("data_length + index_length", "@@innodb_buffer_pool_size").From("information_schema.TABLES").
		Where(sq.Expr("table_schema = DATABASE()")).Where(sq.Eq{"table_name": p.Table.Name()}).
		RunWith(p.DB).QueryRowContext(ctx).Scan(&table, &pool); err != nil {
		return 0, 0, fmt.Errorf("bench: size of %s: %w", p.Table.Name(), err)
	}
	return table, pool, nil
}

// rawSelect times one SELECT of every row of the month table, in orderBy
// order when given, each row scanned into the driver's values as the
// export scans them: the raw limit of the export.
func (p *ArchiveParams) rawSelect(ctx context.Context, want int64, orderBy ...string) (time.Duration, error) {
	p.logf("bench: raw SELECT of %s %v …", p.Table.Name(), orderBy)
	cols := routing.LegacyColumnNames()
	vals, ptrs := make([]any, len(cols)), make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	start := time.Now()
	rows, err := sq.Select(cols...).From(p.Table.Quoted()).OrderBy(orderBy...).RunWith(p.DB).QueryContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("bench: raw SELECT of %s: %w", p.Table.Name(), err)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return 0, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	took := time.Since(start)
	if n != want {
		return 0, fmt.Errorf("bench: raw SELECT of %s read %d rows, want %d", p.Table.Name(), n, want)
	}
	return took, nil
}
