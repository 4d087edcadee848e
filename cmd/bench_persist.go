package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/persist"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	imsql "github.com/imshard/imshard/sql"
)

type benchPersistOptions struct {
	rows, batch, writers, topics, pairs, legacyRows int
	keep                                            bool
	benchFlags
}

func newBenchPersistCmd(g *globals) *cobra.Command {
	o := &benchPersistOptions{}
	c := &cobra.Command{
		Use:   "persist",
		Short: "Persist throughput beside the raw multi-row insert in paired rounds, and the batches into a 2M-row legacy table",
		Example: "  imshard bench persist\n  imshard bench persist --legacy-rows=0 --cpuprofile=persist.pprof\n" +
			"  imshard bench persist --rows=50000 --legacy-rows=200000 --keep",
		Long: "In a tenant database of its own, --pairs rounds; each round empties two month tables, produces --rows\n" +
			"events to a Kafka topic of its own and runs both sides once, the first side alternating:\n" +
			"  persist     the persist role consumes them until all are stored (Redis follow-ups included)\n" +
			"  raw insert  the same rows, batch size and writers, directly: multi-row INSERT + route-mirror upsert\n" +
			"It prints every round, the medians, and the median of the rounds' persist / raw ratios (bar >= 0.80),\n" +
			"with per batch the MySQL statements and row lock waits, the Redis commands, and per row this\n" +
			"process's CPU and the Redis CPU (the servers' counters include their other clients). Then, unless\n" +
			"--legacy-rows=0, the same batches go once into the legacy single table im_group_messages pre-filled\n" +
			"to --legacy-rows rows. The database is dropped afterwards unless --keep (a kept legacy fixture is reused).",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.rows, "rows", 200_000, "rows per side and round")
	c.Flags().IntVar(&o.batch, "batch", 500, "rows per batch transaction")
	c.Flags().IntVar(&o.writers, "writers", persist.DefaultWriters, "concurrent batch transactions")
	c.Flags().IntVar(&o.topics, "topics", 10_000, "topics the rows (and the legacy fixture's history) are spread over")
	c.Flags().IntVar(&o.pairs, "pairs", minPairs, "rounds, each running both sides once; the bar reads medians of at least 5")
	c.Flags().IntVar(&o.legacyRows, "legacy-rows", 2_000_000, "rows in the legacy table before its run (0 = no legacy run)")
	o.tenantFlag(c, "bench_persist", ownTenantHelp)
	c.Flags().BoolVar(&o.keep, "keep", false, "keep the tenant database (and the legacy fixture) for the next run")
	o.cpuProfileFlag(c, "write a CPU profile of the whole run (persist role and in-process Kafka included) to this file")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.rows < 1 || o.batch < 1 || o.writers < 1 || o.topics < 1 || o.pairs < 1 || o.legacyRows < 0 {
			return usagef("--rows, --batch, --writers, --topics and --pairs must be positive")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.PersistReport, error) {
			return runBenchPersist(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.PersistReport) { printBenchPersist(w, o, rep) })
	}
	return c
}

func runBenchPersist(ctx context.Context, cfg *config.Config, o *benchPersistOptions, g *globals) (bench.PersistReport, error) {
	suffix := benchTenant(cfg, o.tenant)[:12]
	// a topic and consumer group of the benchmark's own: nothing else reads
	// its events, and it reads nothing else
	k := cfg.Kafka
	k.Topic, k.DLQTopic, k.Group = k.Topic+".bench-"+suffix, k.DLQTopic+".bench-"+suffix, "imshard-bench-"+suffix
	external := len(k.Brokers) > 0
	stopKafka, err := benchKafka(&k)
	if err != nil {
		return bench.PersistReport{}, err
	}
	defer stopKafka()
	conn, err := app.KafkaOpts(k)
	if err != nil {
		return bench.PersistReport{}, err
	}
	if external {
		admin, err := kgo.NewClient(conn...)
		if err != nil {
			return bench.PersistReport{}, err
		}
		err = app.EnsureTopics(ctx, admin, k)
		admin.Close()
		if err != nil {
			return bench.PersistReport{}, err
		}
	}
	log := g.logger(cfg)
	a := app.New(cfg, log)
	if err := a.StartTools(ctx); err != nil {
		return bench.PersistReport{}, err
	}
	defer a.Close()
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return bench.PersistReport{}, err
	}
	if res := a.NewShardManager().SyncTenant(ctx, o.tenant, shardmgr.Options{MonthsAhead: -1}); res.Err != nil {
		return bench.PersistReport{}, fmt.Errorf("bench: shard ensure: %w", res.Err)
	}
	persistMonth, rawMonth := now, now.Next()
	for _, m := range []routing.Month{persistMonth, rawMonth} {
		if _, st, err := a.Catalog().Table(ctx, o.tenant, m); err != nil || !st.AcceptsWrites() {
			return bench.PersistReport{}, fmt.Errorf("bench: month %s not writable (%s, %v)", m, st, err)
		}
	}
	db, err := a.Pools().DB(ctx, o.tenant)
	if err != nil {
		return bench.PersistReport{}, err
	}
	// the real persist role, on the benchmark's topic and group only
	run := func(ctx context.Context, onBatch func(rows int, d time.Duration)) error {
		svc, err := persist.New(persist.Params{
			Config: config.Persist{BatchSize: o.batch, BatchLinger: 20 * time.Millisecond, MaxRetries: 10,
				RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: 5 * time.Second},
			Kafka: k, KafkaConn: conn, DBs: a.Pools(), Tenants: func() []string { return []string{o.tenant} },
			Redis: a.Redis(), KeySpace: a.KeySpace(), Scripts: a.Scripts(), Catalog: a.Catalog(), Flight: a.Flight(), Routes: a.Routes(),
			Metrics: routing.NewMetrics(prometheus.NewRegistry()), Log: log, Registerer: prometheus.NewRegistry(),
			Writers: o.writers, OnBatch: onBatch,
		})
		if err != nil {
			return err
		}
		err = svc.Run(ctx)
		return errors.Join(err, svc.Stop(context.WithoutCancel(ctx)))
	}
	rep, err := bench.Persist(ctx, bench.PersistParams{
		Rows: o.rows, Batch: o.batch, Writers: o.writers, Topics: o.topics, Pairs: o.pairs, LegacyRows: o.legacyRows,
		Tenant: o.tenant, DB: db, Redis: a.Redis(), PersistMonth: persistMonth, RawMonth: rawMonth,
		Topic: k.Topic, KafkaConn: conn, Persist: run, Progress: g.stderr,
	})
	if !o.keep {
		cleanup := context.WithoutCancel(ctx)
		err = errors.Join(err,
			bench.DropFixtures(cleanup, db, func(name string) string {
				return strings.Replace(imsql.DropDatabase(), imsql.DatabasePlaceholder, name, 1)
			}),
			a.KeySpace().DropTenantKeys(cleanup, a.Redis(), o.tenant))
	}
	return rep, err
}

func printBenchPersist(w io.Writer, o *benchPersistOptions, rep bench.PersistReport) {
	fmt.Fprintf(w, "persist bench: rows=%d batch=%d writers=%d topics=%d pairs=%d\n", o.rows, o.batch, o.writers, o.topics, len(rep.Rounds))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "round\tside\trows/s\tbatch p50\tbatch p99\trows/batch\tSQL/batch\tprepares/batch\tlock waits/batch\tlock ms/batch\tRedis cmds/batch\tRedis CPU µs/row\tCPU µs/row\tallocs/row")
	line := func(round string, r bench.PersistResult) {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%.0f\t%.1f\t%.1f\t%.2f\t%.1f\t%.0f\t%.1f\t%.1f\t%.0f\n", round, r.Name, r.Rate(),
			r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.RowsPerBatch(), r.SQLCalls, r.SQLPrepares, r.LockWaits, r.LockWaitMS,
			r.RedisCalls, r.RedisCPUUS, r.ProcCPUUS, r.AllocsPerRow)
	}
	for i, round := range rep.Rounds {
		for _, r := range round {
			line(fmt.Sprint(i+1), r)
		}
	}
	line("median", rep.Median(0))
	line("median", rep.Median(1))
	_ = tw.Flush()
	note := ""
	if len(rep.Rounds) < minPairs {
		note = fmt.Sprintf(" — only %d rounds: the bar needs medians of %d", len(rep.Rounds), minPairs)
	}
	ratio := rep.Ratio()
	fmt.Fprintf(w, "persist / raw insert     = %.2f, median of the rounds' ratios (bar >= 0.80: %s)%s\n", ratio, verdict(ratio >= 0.8), note)
	if rep.Legacy.Rows == 0 {
		return
	}
	fmt.Fprintf(w, "legacy table (%d rows before): %d rows, %.0f rows/s, batch p50 %s, p99 %s\n", rep.LegacyFixture,
		rep.Legacy.Rows, rep.Legacy.Rate(), rep.Legacy.P50.Round(time.Millisecond), rep.Legacy.P99.Round(time.Millisecond))
	raw, persisted := rep.Median(1).Rate(), rep.Median(0).Rate()
	if legacy := rep.Legacy.Rate(); legacy > 0 {
		fmt.Fprintf(w, "month table / legacy     = %.2f (bar >= 3.00: %s)\n", raw/legacy, verdict(raw/legacy >= 3))
		fmt.Fprintf(w, "persist / legacy         = %.2f\n", persisted/legacy)
	}
}
