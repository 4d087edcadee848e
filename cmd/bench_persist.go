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
	rows, batch, writers, topics, legacyRows int
	tenant                                   string
	keep                                     bool
}

func newBenchPersistCmd(g *globals) *cobra.Command {
	o := &benchPersistOptions{}
	c := &cobra.Command{
		Use:     "persist",
		Short:   "Persist throughput and p50/p99 per batch beside the raw insert and a 2M-row legacy table",
		Example: "  imshard bench persist\n  imshard bench persist --rows=50000 --legacy-rows=200000 --keep",
		Long: "In a tenant database of its own: produces --rows events to a Kafka topic of its own, runs the persist\n" +
			"role until all are stored, then inserts the same rows with the same batch size and writers directly\n" +
			"(multi-row INSERT + route-mirror upsert) into a fresh month table, and the same batches into the legacy\n" +
			"single table im_group_messages pre-filled to --legacy-rows rows. The database is dropped afterwards\n" +
			"unless --keep (a kept legacy fixture is reused).",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.rows, "rows", 200_000, "rows per run")
	c.Flags().IntVar(&o.batch, "batch", 500, "rows per batch transaction")
	c.Flags().IntVar(&o.writers, "writers", persist.DefaultWriters, "concurrent batch transactions")
	c.Flags().IntVar(&o.topics, "topics", 10_000, "topics the rows (and the legacy fixture's history) are spread over")
	c.Flags().IntVar(&o.legacyRows, "legacy-rows", 2_000_000, "rows in the legacy table before its run")
	c.Flags().StringVar(&o.tenant, "tenant", "bench_persist", "the benchmark's own tenant (its database is dropped afterwards)")
	c.Flags().BoolVar(&o.keep, "keep", false, "keep the tenant database (and the legacy fixture) for the next run")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.rows < 1 || o.batch < 1 || o.writers < 1 || o.topics < 1 || o.legacyRows < 0 {
			return usagef("--rows, --batch, --writers and --topics must be positive")
		}
		if err := routing.ValidTenant(o.tenant); err != nil {
			return usagef("--tenant: %v", err)
		}
		cfg, err := g.load(nil, "persist")
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		rep, err := runBenchPersist(ctx, cfg, o, g)
		if err != nil {
			return err
		}
		printBenchPersist(g.stdout, o, rep)
		return nil
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
	if !external {
		k.DataDir = ""
		cluster, err := app.StartKafka(k, "")
		if err != nil {
			return bench.PersistReport{}, err
		}
		defer cluster.Close()
		k.Brokers = cluster.ListenAddrs()
	}
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
			Redis: a.Redis(), Scripts: a.Scripts(), Catalog: a.Catalog(), Flight: a.Flight(), Routes: a.Routes(),
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
		Rows: o.rows, Batch: o.batch, Writers: o.writers, Topics: o.topics, LegacyRows: o.legacyRows,
		Tenant: o.tenant, DB: db, PersistMonth: persistMonth, RawMonth: rawMonth,
		Topic: k.Topic, KafkaConn: conn, Persist: run, RawBatch: persist.RawBatch, Progress: g.stderr,
	})
	if !o.keep {
		cleanup := context.WithoutCancel(ctx)
		err = errors.Join(err,
			bench.DropFixtures(cleanup, db, func(name string) string {
				return strings.Replace(imsql.DropDatabase(), imsql.DatabasePlaceholder, name, 1)
			}),
			routing.DropTenantKeys(cleanup, a.Redis(), o.tenant))
	}
	return rep, err
}

func printBenchPersist(w io.Writer, o *benchPersistOptions, rep bench.PersistReport) {
	fmt.Fprintf(w, "persist bench: rows=%d batch=%d writers=%d topics=%d legacy fixture=%d rows\n",
		o.rows, o.batch, o.writers, o.topics, rep.LegacyFixture)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\trows\trows/s\tbatch p50\tbatch p99")
	for _, r := range []bench.PersistResult{rep.Persist, rep.Raw, rep.Legacy} {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\n", r.Name, r.Rows, r.Rate(), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	ratio := func(a, b bench.PersistResult) float64 {
		if b.Rate() == 0 {
			return 0
		}
		return a.Rate() / b.Rate()
	}
	pr, ml, pl := ratio(rep.Persist, rep.Raw), ratio(rep.Raw, rep.Legacy), ratio(rep.Persist, rep.Legacy)
	fmt.Fprintf(w, "persist / raw insert     = %.2f (bar >= 0.60: %s)\n", pr, verdict(pr >= 0.6))
	fmt.Fprintf(w, "month table / legacy     = %.2f (bar >= 3.00: %s)\n", ml, verdict(ml >= 3))
	fmt.Fprintf(w, "persist / legacy         = %.2f\n", pl)
}
