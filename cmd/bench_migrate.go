package cmd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/migrate"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
)

type benchMigrateOptions struct {
	topics, perTopic, months, batch, readers, rounds int
	duration                                         time.Duration
	scan                                             []int
	keep                                             bool
	benchFlags
}

func newBenchMigrateCmd(g *globals) *cobra.Command {
	o := &benchMigrateOptions{}
	c := &cobra.Command{
		Use:     "migrate",
		Short:   "Legacy-table backfill rows/s beside a raw INSERT … SELECT, and foreground page p99 under a throttled backfill",
		Example: "  imshard bench migrate\n  imshard bench migrate --topics=2000 --per-topic=100 --duration=10s",
		Long: "In a tenant database of its own: fills a legacy table (--topics × --per-topic rows over --months months),\n" +
			"copies it with a raw INSERT … SELECT into a fresh table of the month template and migrates the tenant\n" +
			"(plan, cutover, the migrate module's backfill and verification, in this process), --rounds times in\n" +
			"alternating order (raw first, then backfill first, …; the month tables and the mirror are emptied between\n" +
			"backfills). Then --readers readers\n" +
			"page random topics (the dual read) for --duration without a backfill, beside the unthrottled backfill, and\n" +
			"beside the backfill throttled to half the rate it had beside them; it reports the throttled copy's achieved\n" +
			"rate against its limit. The database and Redis keys are dropped unless --keep.",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.topics, "topics", 10_000, "legacy topics")
	c.Flags().IntVar(&o.perTopic, "per-topic", 200, "legacy rows per topic")
	c.Flags().IntVar(&o.months, "months", 6, "months the legacy rows span")
	c.Flags().IntVar(&o.batch, "batch", 0, "backfill batch size (default migrate.batch_size)")
	c.Flags().IntVar(&o.readers, "readers", 16, "concurrent foreground readers")
	c.Flags().IntVar(&o.rounds, "rounds", 2, "rounds of the two copies (odd rounds copy raw first, even ones backfill first)")
	c.Flags().DurationVar(&o.duration, "duration", 15*time.Second, "each foreground round")
	c.Flags().IntSliceVar(&o.scan, "scan-readers", nil, "after the other rounds, run the unthrottled backfill beside each of these reader counts (e.g. 0,1,2,4,8,16): its rate as the readers grow")
	o.tenantFlag(c, "bench_migrate", ownTenantHelp)
	c.Flags().BoolVar(&o.keep, "keep", false, "keep the tenant database")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.topics < 1 || o.perTopic < o.months || o.months < 1 || o.months > 24 || o.readers < 1 || o.duration <= 0 || o.batch < 0 || o.rounds < 1 {
			return usagef("--topics, --readers, --duration, --rounds must be positive, --months 1..24, --per-topic at least --months")
		}
		for _, n := range o.scan {
			if n < 0 {
				return usagef("--scan-readers: reader counts are 0 or more, got %d", n)
			}
		}
		if err := o.checkTenant(); err != nil {
			return err
		}
		cfg, err := g.load(nil)
		if err != nil {
			return err
		}
		if o.batch > 0 {
			cfg.Migrate.BatchSize = o.batch
		}
		ctx, stop := signalContext()
		defer stop()
		rep, err := runBenchMigrate(ctx, cfg, o, g)
		if err != nil {
			return err
		}
		printBenchMigrate(g.stdout, o, cfg.Migrate.BatchSize, rep)
		return nil
	}
	return c
}

func runBenchMigrate(ctx context.Context, cfg *config.Config, o *benchMigrateOptions, g *globals) (bench.MigrateReport, error) {
	benchTenant(cfg, o.tenant)
	a := app.New(cfg, g.logger(cfg))
	if err := a.StartTools(ctx, app.ReadPath); err != nil {
		return bench.MigrateReport{}, err
	}
	defer a.Close()
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return bench.MigrateReport{}, err
	}
	if res := a.NewShardManager().SyncTenant(ctx, o.tenant, shardmgr.Options{MonthsAhead: -1}); res.Err != nil {
		return bench.MigrateReport{}, fmt.Errorf("bench: shard ensure: %w", res.Err)
	}
	db, err := a.Pools().DB(ctx, o.tenant)
	if err != nil {
		return bench.MigrateReport{}, err
	}
	f := bench.LegacyFixture{First: now.Add(-o.months), Months: o.months, Topics: o.topics, PerTopic: o.perTopic,
		Prefix: "bench-", Width: 6, GroupID: 1}
	raw, err := routing.TableFor(now.Add(24))
	if err != nil {
		return bench.MigrateReport{}, err
	}
	mg := a.NewMigrator()
	q := a.NewQuery()
	admin := httpapi.Principal{Tenant: o.tenant, UserID: 1, Role: httpapi.RoleAdmin}
	say := func(string, ...any) {}
	rep, err := bench.Migrate(ctx, bench.MigrateParams{
		Fixture: f, Tenant: o.tenant, DB: db, RawTable: raw,
		Plan: func(ctx context.Context) error {
			// reads need every topic's group: the benchmark loads them in bulk
			if err := acl.GroupEveryTopic(ctx, db, routing.LegacyQuoted()); err != nil {
				return err
			}
			_, err := mg.Plan(ctx, o.tenant)
			return err
		},
		Start: func(ctx context.Context) error { _, err := mg.Start(ctx, o.tenant, say); return err },
		Run: func(ctx context.Context, rate int) error {
			return mg.WithThrottle(rate).RunUntilDone(ctx, o.tenant)
		},
		Reset: func(ctx context.Context) error {
			shards, err := a.Catalog().List(ctx, o.tenant)
			if err != nil {
				return err
			}
			for _, s := range shards {
				if _, err := db.ExecContext(ctx, "TRUNCATE TABLE "+s.Table.Quoted()); err != nil {
					return err
				}
			}
			return routing.Fenced(ctx, db, func(tx *sql.Tx) error {
				if err := routing.ClearMirror(ctx, tx); err != nil {
					return err
				}
				return routing.RestartBackfill(ctx, tx)
			})
		},
		Page: func(ctx context.Context, topic string, before int64) error {
			_, err := q.Before(ctx, admin, topic, before, 50)
			return err
		},
		Readers: o.readers, Duration: o.duration, Rounds: o.rounds, Scan: o.scan, Progress: g.stderr,
	})
	if !o.keep {
		err = errors.Join(err, dropBenchTenant(ctx, a, db, o.tenant))
	}
	return rep, err
}

func printBenchMigrate(w io.Writer, o *benchMigrateOptions, batch int, rep bench.MigrateReport) {
	fmt.Fprintf(w, "migrate bench: %d legacy rows (%d topics × %d, %d months), batch %d, %d readers\n",
		rep.Rows, o.topics, o.perTopic, o.months, batch, o.readers)
	fmt.Fprintf(w, "legacy fixture built in %v\n", rep.Fixture.Round(time.Millisecond))
	for i, c := range rep.Copies {
		order := "backfill first"
		if c.RawFirst {
			order = "raw first"
		}
		fmt.Fprintf(w, "round %d (%s): raw %v (%.0f rows/s), backfill %v (%.0f rows/s)\n", i+1, order,
			c.Raw.Round(time.Millisecond), bench.Rate(rep.Rows, c.Raw), c.Backfill.Round(time.Millisecond), bench.Rate(rep.Rows, c.Backfill))
	}
	fmt.Fprintf(w, "raw INSERT … SELECT      %8.0f rows/s (%d rounds)\n", rep.RawRate(), len(rep.Copies))
	fmt.Fprintf(w, "backfill, unthrottled    %8.0f rows/s (routes + verification after the first %v)\n",
		rep.BackfillRate(), rep.Verify.Round(time.Millisecond))
	ratio := 0.0
	if rep.RawRate() > 0 {
		ratio = rep.BackfillRate() / rep.RawRate()
	}
	fmt.Fprintf(w, "backfill / raw           = %.2f (bar >= 0.50: %s)\n", ratio, verdict(ratio >= 0.5))
	fmt.Fprintf(w, "pages, no backfill       %d pages, p50 %v, p99 %v\n", rep.Idle.Pages, rep.Idle.P50.Round(time.Microsecond), rep.Idle.P99.Round(time.Microsecond))
	u, t := rep.Unthrottled, rep.Throttled
	fmt.Fprintf(w, "pages, backfill unthrottled %d pages, p50 %v, p99 %v; the copy beside them %.0f rows/s (%d rows, %d batches, %v), %.2f of its %.0f rows/s alone\n",
		rep.Loaded.Pages, rep.Loaded.P50.Round(time.Microsecond), rep.Loaded.P99.Round(time.Microsecond),
		u.Achieved(), u.Rows, u.Batches, u.Wall.Round(time.Millisecond), u.Achieved()/max(rep.BackfillRate(), 1), rep.BackfillRate())
	fmt.Fprintf(w, "pages, backfill %6d/s  %d pages, p50 %v, p99 %v\n", rep.Throttle,
		rep.Busy.Pages, rep.Busy.P50.Round(time.Microsecond), rep.Busy.P99.Round(time.Microsecond))
	fmt.Fprintf(w, "throttled copy           achieved %.0f of the %d rows/s allowed (%.0f%%): %d rows in %d batches over %v; batches alone %.0f rows/s: %s\n",
		t.Achieved(), rep.Throttle, 100*t.Achieved()/float64(max(rep.Throttle, 1)), t.Rows, t.Batches, t.Wall.Round(time.Millisecond),
		t.Capacity(), migrate.Pace(rep.Throttle, t.Achieved(), t.Capacity()))
	rise := 0.0
	if rep.Idle.P99 > 0 {
		rise = float64(rep.Busy.P99)/float64(rep.Idle.P99) - 1
	}
	fmt.Fprintf(w, "p99 rise, throttled      = %+.0f%% (bar <= +20%%: %s; the copy at %.0f%% of its limit)\n", 100*rise, verdict(rise <= 0.2),
		100*t.Achieved()/float64(max(rep.Throttle, 1)))
	for _, r := range rep.Scan {
		fmt.Fprintf(w, "beside %2d readers        the unthrottled copy %.0f rows/s (%.2f of its rate alone; %d batches), %d pages, p99 %v\n",
			r.Readers, r.Copy.Achieved(), r.Copy.Achieved()/max(rep.BackfillRate(), 1), r.Copy.Batches, r.Pages.Pages, r.Pages.P99.Round(time.Microsecond))
	}
}
