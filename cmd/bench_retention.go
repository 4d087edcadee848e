package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/retention"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
)

type benchRetentionOptions struct {
	rows          int
	topics        int
	eraseMessages int
	rate          float64
	duration      time.Duration
	benchFlags
}

// The bars of `imshard bench retention`.
const (
	dropBar     = 5 * time.Second // an expired month of >= 1M rows dropped
	dropP99Bar  = 1.1             // send p99 across the drop / without it
	eraseBar    = 0.5             // erase job rate / raw UPDATE rate
	dropBarRows = 1_000_000
	eraseBarMsg = 10_000
)

// benchRetentionMonths is the bench tenant's retention: the month before
// the three it keeps is the one dropped, the three hold the erased user's
// messages.
const benchRetentionMonths = 3

// benchEraseUser is the first erased user (the steady one is the next id,
// the warm-up's the one after): no user of the send load.
const benchEraseUser = 1_000_001

func newBenchRetentionCmd(g *globals) *cobra.Command {
	o := &benchRetentionOptions{}
	c := &cobra.Command{
		Use:   "retention",
		Short: "Drop an expired month under a send load beside the load without it; a user erase beside a raw UPDATE",
		Long: "Starts the send role in this process for a bench tenant of its own with retention_months=3, then:\n" +
			"(a) fills the month before the three it keeps with --rows messages over --topics topics (INSERT …\n" +
			"SELECT doublings, a mention row for every tenth message, the route mirror and Redis routes), seals it,\n" +
			"and sends --rate messages a second (open loop) for --duration without a drop, across the retention run\n" +
			"(started a quarter into the run), and without one again; prints the run's duration (bar <= 5 s at >= 1M\n" +
			"rows) and the send p99 across it over the mean p99 of the two runs without it (bar <= 1.1), and the second\n" +
			"of those over the first (no bar: how much two runs without a drop differ on this machine);\n" +
			"(b) writes --erase-messages messages of each of two users over the three months kept (a quarter of the\n" +
			"rows of 40 topics a month each; the other half of the oldest month a third user's), times a raw UPDATE of\n" +
			"each user's to tombstones, puts them back, archives the oldest of the three (the patrol's sync stops it\n" +
			"being active once its rows are written, a persist role runs until its progress proves the month complete,\n" +
			"then `shard seal` and the archive job, into a bucket in a temporary directory), and times the erase job of\n" +
			"the first user (the job of POST /v1/admin/users/{uid}/erase: the two tables by their sender index, the\n" +
			"archived month by a scan of its archive, its tombstones in the overlay), the tenant's first erase into its\n" +
			"overlay; runs the third user's (the warm-up: the overlay's file grows past its first megabyte, which InnoDB\n" +
			"extends a page at a time and a tenant pays once), then times the second user's: the steady state. Prints\n" +
			"both jobs' rates over their raw rates, the bar (>= 0.5) judged on the steady one, the archived month's raw\n" +
			"UPDATE being that of its table before the archive. The tenant database, its Redis keys and the bucket are\n" +
			"dropped afterwards.",
		Example: "  imshard bench retention\n  imshard bench retention --rows=100000 --erase-messages=3000 --duration=5s",
		Args:    cobra.NoArgs,
	}
	c.Flags().IntVar(&o.rows, "rows", dropBarRows, "messages of the expired month")
	c.Flags().IntVar(&o.topics, "topics", 1000, "topics of the expired month")
	c.Flags().IntVar(&o.eraseMessages, "erase-messages", eraseBarMsg, "messages of the erased user, over three months")
	c.Flags().Float64Var(&o.rate, "rate", 300, "sends per second of the send load")
	c.Flags().DurationVar(&o.duration, "duration", 10*time.Second, "each send-load run")
	o.ownTenant(c, "bench_retention")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.topics < 1 || o.topics > 1024 || o.rows < o.topics || o.eraseMessages < 3 || o.rate < 1 || o.duration <= 0 {
			return usagef("--topics must be 1..1024, --rows at least --topics, --erase-messages at least 3, --rate at least 1, --duration positive")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.RetentionReport, error) {
			return runBenchRetention(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.RetentionReport) { printBenchRetention(w, o, rep) })
	}
	return c
}

func runBenchRetention(ctx context.Context, cfg *config.Config, o *benchRetentionOptions, g *globals) (rep bench.RetentionReport, err error) {
	secret := benchTenant(cfg, o.tenant)
	cfg.Tenants[len(cfg.Tenants)-1].RetentionMonths = benchRetentionMonths
	dir, err := os.MkdirTemp("", "imshard-bench-retention-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	cfg.Archive.URL, cfg.Archive.RowsPerSecond = "file://"+dir, 0
	r, err := startBenchSend(ctx, cfg, g, o.tenant)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, r.stop()) }()
	a := r.a
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return rep, err
	}
	expired := now.Add(-benchRetentionMonths - 1)
	mg := a.NewShardManager()
	if res := mg.SyncTenant(ctx, o.tenant, shardmgr.Options{MonthsAhead: -1, From: expired}); res.Err != nil {
		return rep, fmt.Errorf("bench: shard ensure --from=%s: %w", expired, res.Err)
	}
	a.Catalog().Invalidate(o.tenant)
	var tables []routing.Table
	for _, m := range routing.Range(expired, now.Add(-1)) {
		t, _, err := a.Catalog().Table(ctx, o.tenant, m)
		if err != nil {
			return rep, err
		}
		tables = append(tables, t)
	}
	ret := a.Retention()
	return bench.Retention(ctx, bench.RetentionParams{
		Load: bench.SendParams{Concurrency: 8, BaseURL: "http://" + a.APIAddr(), Tenant: o.tenant, Secret: []byte(secret),
			Redis: a.Redis(), KeySpace: a.KeySpace(), Persist: r.persist, ProduceTimeout: cfg.Send.ProduceTimeout},
		Rate: o.rate, Duration: o.duration,
		DB: r.db, Routes: a.Routes(),
		Expired: tables[0], Rows: o.rows, Topics: o.topics,
		Seal: func(ctx context.Context) error { return mg.Seal(ctx, o.tenant, expired) },
		Drop: func(ctx context.Context) (bench.Dropped, error) {
			rep, err := ret.Run(ctx, o.tenant)
			return bench.Dropped{Months: rep.Months, Rows: rep.RowsDropped}, err
		},
		EraseTables: tables[1:], EraseMessages: o.eraseMessages, EraseUser: benchEraseUser,
		Rotate: func(ctx context.Context, m routing.Month) error {
			// the patrol's sync: every writable month before the active one
			// starts sealing, its deactivation stamped
			if res := mg.SyncTenant(ctx, o.tenant, shardmgr.Options{MonthsAhead: -1}); res.Err != nil {
				return res.Err
			}
			a.Catalog().Invalidate(o.tenant)
			return nil
		},
		Archive: func(ctx context.Context, m routing.Month) error { return archiveBenchMonth(ctx, r, o.tenant, m) },
		Erase: func(ctx context.Context, user int64) (bench.Erased, error) {
			j, err := ret.StartErase(ctx, o.tenant, user)
			if err != nil {
				return bench.Erased{}, err
			}
			if _, err := ret.RunJobs(ctx, o.tenant, "bench", time.Minute); err != nil {
				return bench.Erased{}, err
			}
			if j, err = ret.Job(ctx, o.tenant, int64(j.ID)); err != nil {
				return bench.Erased{}, err
			}
			return bench.Erased{Done: j.State == retention.StateDone, State: j.State, Messages: j.RowsRemoved, Months: j.Report.Months}, nil
		},
		Progress: g.stderr,
	})
}

// archiveBenchMonth seals month m of the bench tenant (`shard seal`) and
// archives it through the archive job once the completeness proof holds:
// the month stopped being active when its rows were written, so a persist
// role runs until its published progress passes the month's deactivation
// plus send.produce_timeout, as wherever persist runs.
func archiveBenchMonth(ctx context.Context, r *benchSend, tenant string, m routing.Month) error {
	a := r.a
	if err := a.NewShardManager().Seal(ctx, tenant, m); err != nil {
		return err
	}
	keys, err := a.KeySpace().Tenant(tenant)
	if err != nil {
		return err
	}
	stop, err := r.persist(ctx)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = routing.AwaitComplete(wctx, r.db, a.Redis(), keys, m, a.Config.Send.ProduceTimeout, 100*time.Millisecond)
	cancel()
	stop()
	if err != nil {
		return err
	}
	rep, err := a.NewArchiver().Archive(ctx, tenant, m, false)
	if err == nil && rep.Step != archive.StepMarked {
		err = fmt.Errorf("the archive of %s stopped at step %q", m, rep.Step)
	}
	return err
}

func printBenchRetention(w io.Writer, o *benchRetentionOptions, rep bench.RetentionReport) {
	fmt.Fprintf(w, "retention bench: rows=%d topics=%d mention-rows=%d rate=%.0f/s duration=%s/run erase-messages=%d GOMAXPROCS=%d\n",
		rep.Rows, o.topics, rep.Mentions, o.rate, o.duration, rep.UserMessages, runtime.GOMAXPROCS(0))
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "send load\tsends\terrors\tachieved/s\tp50\tp99\tp99.9")
	for _, r := range []bench.RoundResult{rep.Steady, rep.During, rep.After} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\n", r.Side, r.Sends, r.Errors, r.Rate, ms(r.P50), ms(r.P99), ms(r.P999))
	}
	_ = tw.Flush()
	for _, r := range []bench.RoundResult{rep.Steady, rep.During, rep.After} {
		if r.FirstErr != nil {
			fmt.Fprintf(w, "%s: first error: %v\n", r.Side, r.FirstErr)
		}
	}
	fmt.Fprintf(w, "retention run: %d month(s), %d rows dropped\n", rep.Dropped.Months, rep.Dropped.Rows)
	// a bar is judged only at the size it names
	judge := func(ok, atSize bool, size string) string {
		if !atSize {
			return "not judged: below the bar's size, " + size
		}
		return verdict(ok)
	}
	bigMonth := rep.Rows >= dropBarRows
	fmt.Fprintf(w, "%-52s %6.2f s (bar <= %.0f s: %s)\n", "month drop (retention run)", rep.DropTook.Seconds(), dropBar.Seconds(),
		judge(rep.DropTook <= dropBar, bigMonth, ">= 1M rows"))
	fmt.Fprintf(w, "%-52s %6.2f (bar <= %.1f: %s)\n", "send p99 across the drop / without it (mean)", rep.DropP99Ratio(), dropP99Bar,
		judge(rep.DropP99Ratio() <= dropP99Bar, bigMonth, ">= 1M rows"))
	fmt.Fprintf(w, "%-52s %6.2f (no bar: two runs without a drop)\n", "send p99 without a drop, again / the first",
		float64(rep.After.P99)/float64(max(rep.Steady.P99, 1)))
	line := func(r bench.EraseRun) string {
		months := slices.Sorted(maps.Keys(r.Erased.Months))
		for i, m := range months {
			months[i] = fmt.Sprintf("%s: %d", m, r.Erased.Months[m])
		}
		return fmt.Sprintf("%d messages (%s) in %s, %.0f/s; raw UPDATE of the same rows: %s, %.0f/s (the archived month's %s)", r.Erased.Messages,
			strings.Join(months, ", "), r.Took.Round(time.Millisecond), float64(r.Erased.Messages)/r.Took.Seconds(),
			r.Raw.Round(time.Millisecond), float64(rep.UserMessages)/r.Raw.Seconds(), r.RawArchived.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "first erase (user %d, the tenant's overlay empty): %s; erase / raw %.3f (no bar: the overlay's first megabyte, paid once per tenant)\n",
		rep.FirstErase.User, line(rep.FirstErase), rep.FirstErase.Ratio())
	fmt.Fprintf(w, "warm-up erase: %d messages of the archived month into the overlay\n", rep.WarmUpMessages)
	fmt.Fprintf(w, "erase job (user %d, the steady state): %s\n", rep.SteadyErase.User, line(rep.SteadyErase))
	fmt.Fprintf(w, "%-52s %6.3f (bar >= %.1f: %s)\n", "erase job rate / raw UPDATE rate", rep.EraseRatio(), eraseBar,
		judge(rep.EraseRatio() >= eraseBar, rep.UserMessages >= eraseBarMsg, ">= 10,000 messages"))
	fmt.Fprintf(w, "archived month: %s, %d of each user's messages (erased into its overlay); sealed and archived in %s\n",
		rep.Archived, rep.ArchivedMessages, rep.ArchiveTook.Round(time.Millisecond))
}
