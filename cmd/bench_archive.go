package cmd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"gocloud.dev/blob"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/routing"
)

type benchArchiveOptions struct {
	rows     int
	topics   int
	duration time.Duration
	warmup   time.Duration
	url      string
	benchFlags
}

// Bars of the archive (docs/performance.md).
const (
	archiveExportBar = 0.5                   // export rate ≥ this × the raw SELECT's
	archiveBytesBar  = 0.2                   // archived bytes ≤ this × the table's data + index
	archiveWarmBar   = 3.0                   // warm archived page p99 ≤ this × the month-table page p99
	archiveColdBar   = 50 * time.Millisecond // cold archived page p99
)

func newBenchArchiveCmd(g *globals) *cobra.Command {
	o := &benchArchiveOptions{}
	c := &cobra.Command{
		Use:   "archive",
		Short: "A sealed month's export beside a raw SELECT, its archive's size beside the table's, archived pages warm and cold beside the month table's",
		Long: "Fills the previous month's table of a tenant of its own with --rows messages over --topics topics (bulk\n" +
			"INSERT … SELECT), seals it and proves it complete, then measures in one run: the table's data_length +\n" +
			"index_length, one raw SELECT of its rows and one in the archive's (topic, seqid) order; p50/p99 of a\n" +
			"newest-first 50-message page below a random seq of a random topic, read through the read path from the\n" +
			"month table; the month's archive (pre-checks, export, verification, mark; archive.rows_per_second is\n" +
			"lifted) with its export's rate and the bytes of its objects; the same page from the archive, warm and\n" +
			"with the archive cache emptied before each page (cold). One reader: latencies, not throughput. The\n" +
			"archive is written to a temporary directory (file://) unless --url; the tenant database, its Redis keys\n" +
			"and the archive's objects are removed afterwards.",
		Example: "  imshard bench archive\n  imshard bench archive --rows=100000 --topics=100 --duration=2s",
		Args:    cobra.NoArgs,
	}
	c.Flags().IntVar(&o.rows, "rows", 1_000_000, "messages of the month")
	c.Flags().IntVar(&o.topics, "topics", 1000, "topics of the month")
	c.Flags().DurationVar(&o.duration, "duration", 5*time.Second, "measured time of each page run")
	c.Flags().DurationVar(&o.warmup, "warmup", time.Second, "unmeasured time before each page run")
	o.ownTenant(c, "bench_archive")
	c.Flags().StringVar(&o.url, "url", "", "archive bucket URL (default: a temporary file:// directory)")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.rows < 1 || o.topics < 1 || o.topics > 1024 || o.duration <= 0 || o.warmup < 0 {
			return usagef("--rows and --duration must be positive, --topics 1..1024, --warmup not negative")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.ArchiveReport, error) {
			return runBenchArchive(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.ArchiveReport) { printBenchArchive(w, o, rep) })
	}
	return c
}

// runBenchArchive starts the clients and the read path for the benchmark
// tenant with the archive at the bench's bucket, and runs the bench on the
// tenant's previous month.
func runBenchArchive(ctx context.Context, cfg *config.Config, o *benchArchiveOptions, g *globals) (rep bench.ArchiveReport, err error) {
	benchTenant(cfg, o.tenant)
	url := o.url
	if url == "" {
		dir, err := os.MkdirTemp("", "imshard-bench-archive-")
		if err != nil {
			return rep, err
		}
		defer os.RemoveAll(dir)
		url = "file://" + dir
	}
	// the export at the machine's speed
	cfg.Archive.URL, cfg.Archive.RowsPerSecond = url, 0
	a := app.New(cfg, g.logger(cfg))
	if err := a.StartTools(ctx, app.ReadPath); err != nil {
		return rep, err
	}
	defer a.Close()
	if err := prepareBenchTenant(ctx, a, o.tenant); err != nil {
		return rep, err
	}
	db, err := a.Pools().DB(ctx, o.tenant)
	if err != nil {
		return rep, err
	}
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return rep, err
	}
	m := now.Prev()
	prefix := o.tenant + "/" + m.String() + "/"
	defer func() {
		_, derr := archivedObjects(context.WithoutCancel(ctx), url, prefix, true)
		err = errors.Join(err, dropBenchTenant(ctx, a, db, o.tenant), derr)
	}()
	t, _, err := a.Catalog().Table(ctx, o.tenant, m)
	if err != nil {
		return rep, err
	}
	p := &bench.ArchiveParams{
		DB: db, Tenant: o.tenant, Table: t, Reader: a.Reader(),
		Seal: func(ctx context.Context) error { return sealBenchMonth(ctx, a, db, o.tenant, m) },
		Archive: func(ctx context.Context) (time.Duration, int64, error) {
			ar, err := a.NewArchiver().Archive(ctx, o.tenant, m, false)
			if err != nil {
				return 0, 0, err
			}
			n, err := archivedObjects(ctx, url, prefix, false)
			return ar.Export, n, err
		},
		EmptyCache: a.NewColdReader().Purge,
		Topics:     o.topics, Rows: o.rows, Duration: o.duration, Warmup: o.warmup, Progress: g.stderr,
	}
	if err := p.Check(); err != nil {
		return rep, usagef("%v", err)
	}
	return p.Run(ctx)
}

// sealBenchMonth seals month m of the bench tenant as the patrol would
// once its grace passed (sealing, stamped deactivated, then sealed), and
// tells the completeness proof that persist has handled every event
// produced until the month's last could be: the bench tenant has no
// producer, so none can be pending.
func sealBenchMonth(ctx context.Context, a *app.App, db *sql.DB, tenant string, m routing.Month) error {
	if _, err := routing.SetStatus(ctx, db, m, routing.StatusSealing, routing.StatusWritable, routing.StatusSealing); err != nil {
		return err
	}
	a.Catalog().Invalidate(tenant)
	if err := a.NewShardManager().Seal(ctx, tenant, m); err != nil {
		return err
	}
	keys, err := a.KeySpace().Tenant(tenant)
	if err != nil {
		return err
	}
	handled := time.Now().Add(a.Config.Send.ProduceTimeout).UnixMilli()
	rdb := a.Redis()
	return rdb.Do(ctx, rdb.B().Set().Key(keys.PersistedBefore()).Value(strconv.FormatInt(handled, 10)).Build()).Error()
}

// archivedObjects is the bytes of the objects under prefix in the bucket
// at url; drop deletes them as well.
func archivedObjects(ctx context.Context, url, prefix string, drop bool) (int64, error) {
	b, err := archive.OpenBucket(ctx, url)
	if err != nil {
		return 0, err
	}
	defer b.Close()
	var n int64
	it := b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n += obj.Size
		if drop {
			if err := b.Delete(ctx, obj.Key); err != nil {
				return n, err
			}
		}
	}
}

func printBenchArchive(w io.Writer, o *benchArchiveOptions, rep bench.ArchiveReport) {
	fmt.Fprintf(w, "archive bench: rows=%d topics=%d duration=%s/page run gomaxprocs=%d; fixture built and sealed in %s\n",
		rep.Rows, o.topics, o.duration, runtime.GOMAXPROCS(0), rep.Build.Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "page (50 messages, newest first)\tpages\terrors\tp50\tp99")
	for _, r := range []bench.QueryResult{rep.TablePage, rep.WarmPage, rep.ColdPage} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", r.Name, r.Count, r.Errors, r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	fmt.Fprintf(w, "raw SELECT of the month   %d rows in %s: %.0f rows/s\n", rep.Rows, rep.RawSelect.Round(time.Millisecond), rep.RawRate())
	fmt.Fprintf(w, "the same, ORDER BY topic, seqid (the archive's order)  %s: %.0f rows/s\n", rep.RawOrdered.Round(time.Millisecond), rep.RawOrderedRate())
	fmt.Fprintf(w, "archive export            %d rows in %s: %.0f rows/s (the whole archive, with pre-checks and verification: %s)\n",
		rep.Rows, rep.Export.Round(time.Millisecond), rep.ExportRate(), rep.ArchiveRun.Round(time.Millisecond))
	// a table larger than the buffer pool reads its pages from disk: slow month-table figures
	fmt.Fprintf(w, "month table               %.1f MiB (data_length + index_length; InnoDB buffer pool %.0f MiB)\n",
		mib(rep.TableBytes), mib(rep.BufferPool))
	fmt.Fprintf(w, "archive objects           %.1f MiB (Parquet and manifest)\n", mib(rep.ArchiveBytes))
	bar := func(name string, v float64, unit, op string, limit float64) {
		ok := v <= limit
		if op == ">=" {
			ok = v >= limit
		}
		fmt.Fprintf(w, "%-48s %7.2f%s (bar %s %.2f%s: %s)\n", name, v, unit, op, limit, unit, verdict(ok))
	}
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	bar("export rate / raw SELECT rate", ratio(rep.ExportRate(), rep.RawRate()), "", ">=", archiveExportBar)
	fmt.Fprintf(w, "%-48s %7.2f (beside the bar, not it)\n", "export rate / ordered raw SELECT rate", ratio(rep.ExportRate(), rep.RawOrderedRate()))
	bar("archived bytes / table data + index", ratio(float64(rep.ArchiveBytes), float64(rep.TableBytes)), "", "<=", archiveBytesBar)
	bar("archived page p99 warm / month-table page p99", ratio(float64(rep.WarmPage.P99), float64(rep.TablePage.P99)), "", "<=", archiveWarmBar)
	bar("archived page p99 cold (empty cache)", float64(rep.ColdPage.P99)/float64(time.Millisecond), " ms", "<=",
		float64(archiveColdBar)/float64(time.Millisecond))
}
