package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/changes"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
)

type benchQueryOptions struct {
	topics      int
	rows        int
	months      int
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	keep        bool
	only        []string
	benchFlags
}

func newBenchQueryCmd(g *globals) *cobra.Command {
	o := &benchQueryOptions{}
	c := &cobra.Command{
		Use:     "query",
		Short:   "50-message pages (one month, two months, the single legacy table, hot cache, HTTP) and edits/recalls, beside raw SQL",
		Example: "  imshard bench query\n  imshard bench query --keep --only='service page, hot cache' --warmup=5s --duration=15s",
		Long: "Builds a fixture in a tenant database of its own (--rows messages over --topics topics, spread over\n" +
			"--months month tables ending with the current one, and the same rows in one legacy single table), then\n" +
			"measures p50/p99 and rate of each read with --concurrency readers on random topics at random\n" +
			"positions within the last two months; then edits and recalls of messages of any month through the service\n" +
			"beside the raw SELECT … FOR UPDATE + UPDATE + revision INSERT transaction (these change the fixture).\n" +
			"The tenant database and its Redis keys are dropped afterwards unless --keep; a complete kept fixture is\n" +
			"reused by the next run (which drops it unless --keep again).",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.topics, "topics", 1000, "topics of the fixture")
	c.Flags().IntVar(&o.rows, "rows", 2_000_000, "messages of the fixture")
	c.Flags().IntVar(&o.months, "months", 12, "months of history the rows are spread over (at least 2)")
	c.Flags().IntVar(&o.concurrency, "concurrency", 16, "concurrent readers")
	c.Flags().DurationVar(&o.duration, "duration", 20*time.Second, "measured time of each run")
	c.Flags().DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured time before each run")
	o.ownTenant(c, "bench_query")
	c.Flags().BoolVar(&o.keep, "keep", false, "keep the fixture for the next run (a complete kept fixture is always reused)")
	c.Flags().StringArrayVar(&o.only, "only", nil, "run only the runs whose name contains this (repeatable; run names hold commas, so none are split: --only='service page, hot cache' --only='raw SQL')")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.concurrency < 1 || o.topics < 1 || o.topics > 1024 || o.rows < 1 || o.duration <= 0 || o.months < 2 || o.months > 120 {
			return usagef("--concurrency, --rows and --duration must be positive, --topics 1..1024, --months 2..120")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.QueryReport, error) {
			return runBenchQuery(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.QueryReport) { printBenchQuery(w, o, rep) })
	}
	return c
}

// runBenchQuery starts the clients and the query service with its HTTP
// handlers for the benchmark tenant, builds or reuses the fixture, measures.
func runBenchQuery(ctx context.Context, cfg *config.Config, o *benchQueryOptions, g *globals) (bench.QueryReport, error) {
	secret := benchTenant(cfg, o.tenant)
	for attempt := 0; ; attempt++ {
		rep, again, err := benchQueryOnce(ctx, cfg, o, g, []byte(secret), attempt == 0)
		if !again {
			return rep, err
		}
	}
}

// benchQueryOnce runs the benchmark on fresh clients; again asks for a
// second run after it dropped the leftovers of an interrupted one.
func benchQueryOnce(ctx context.Context, cfg *config.Config, o *benchQueryOptions, g *globals, secret []byte, first bool) (rep bench.QueryReport, again bool, err error) {
	log := g.logger(cfg)
	a := app.New(cfg, log)
	if err := a.StartTools(ctx, app.ReadPath); err != nil {
		return rep, false, err
	}
	defer a.Close()
	if err := prepareBenchTenant(ctx, a, o.tenant); err != nil {
		return rep, false, err
	}
	db, err := a.Pools().DB(ctx, o.tenant)
	if err != nil {
		return rep, false, err
	}
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return rep, false, err
	}
	from := now.Add(1 - o.months)
	if res := a.NewShardManager().SyncTenant(ctx, o.tenant, shardmgr.Options{MonthsAhead: -1, From: from}); res.Err != nil {
		return rep, false, fmt.Errorf("bench: shard ensure --from=%s: %w", from, res.Err)
	}
	a.Catalog().Invalidate(o.tenant)
	var tables []routing.Table
	for _, m := range routing.Range(from, now) {
		t, _, err := a.Catalog().Table(ctx, o.tenant, m)
		if err != nil {
			return rep, false, err
		}
		tables = append(tables, t)
	}
	svc, ch := a.NewQuery(), a.NewChanges()
	mux := httpapi.NewMux()
	auth := httpapi.NewAuthenticator(a.Keys(), a.Config.Auth.MaxTokenTTL)
	// the bench measures the read path, not the per-user limits in front
	// of it: its one user reads far above them
	svc.Register(mux, auth, log, nil)
	ch.Register(mux, auth, log, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, false, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(context.Background()) }()
	token, err := httpapi.Sign(secret, o.tenant, 1, "", 24*time.Hour)
	if err != nil {
		return rep, false, err
	}
	p := &bench.QueryParams{
		Page: func(ctx context.Context, me httpapi.Principal, topic string, before int64, limit int) (int, error) {
			pg, err := svc.Before(ctx, me, topic, before, limit)
			return len(pg.Messages), err
		},
		Reader: a.Reader(),
		Edit: func(ctx context.Context, me httpapi.Principal, topic string, seq int64, content json.RawMessage, version int) (int64, error) {
			res, err := ch.Edit(ctx, me, topic, seq, changes.EditRequest{Content: content, ExpectedVersion: &version})
			return res.ChangeSeq, err
		},
		Recall: func(ctx context.Context, me httpapi.Principal, topic string, seq int64, reason string) (int64, error) {
			res, err := ch.Recall(ctx, me, topic, seq, reason)
			return res.ChangeSeq, err
		},
		Routes: a.Routes(), Groups: a.ACL(), Redis: a.Redis(), KeySpace: a.KeySpace(), DB: db, Tenant: o.tenant,
		Tables: tables, BaseURL: "http://" + ln.Addr().String(), Token: token,
		Topics: o.topics, Rows: o.rows, Concurrency: o.concurrency, Duration: o.duration, Warmup: o.warmup, Only: o.only,
		Progress: g.stderr,
	}
	drop := func() error {
		return dropBenchTenant(ctx, a, db, o.tenant)
	}
	if err := p.Check(); err != nil {
		return rep, false, usagef("%v", err)
	}
	complete, dirty := p.Fixtures(ctx)
	switch {
	case complete:
		fmt.Fprintf(g.stderr, "bench: reusing the kept fixture of tenant %s\n", o.tenant)
	case dirty && first:
		fmt.Fprintf(g.stderr, "bench: dropping an incomplete or unwanted fixture of tenant %s\n", o.tenant)
		return rep, true, drop()
	default:
		if err := p.Build(ctx); err != nil {
			return rep, false, errors.Join(err, drop())
		}
	}
	rep, err = p.Measure(ctx)
	if err == nil {
		rep.Changes, err = p.MeasureChanges(ctx)
	}
	if !o.keep {
		err = errors.Join(err, drop())
	}
	return rep, false, err
}

func printBenchQuery(w io.Writer, o *benchQueryOptions, rep bench.QueryReport) {
	fmt.Fprintf(w, "query bench: rows=%d topics=%d months=%d concurrency=%d duration=%s gomaxprocs=%d\n",
		o.rows, o.topics, o.months, o.concurrency, o.duration, runtime.GOMAXPROCS(0))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tpages\terrors\trate/s\tp50\tp99")
	for _, r := range []bench.QueryResult{rep.OneMonth, rep.TwoMonths, rep.HotCache, rep.HotSolo, rep.RawMonth, rep.RawLegacy, rep.HTTP,
		rep.Changes.RawBefore, rep.Changes.Edit, rep.Changes.Recall, rep.Changes.RawAfter} {
		if r.Skipped {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\n", r.Name, r.Count, r.Errors, r.Rate(),
			r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	// a bar is printed only when both of its runs ran
	ratio := func(name string, a, b bench.QueryResult, limit float64, atMost bool, of func(bench.QueryResult) float64) {
		if a.Skipped || b.Skipped || of(b) <= 0 {
			return
		}
		r := of(a) / of(b)
		ok, op := r >= limit, ">="
		if atMost {
			ok, op = r <= limit, "<="
		}
		fmt.Fprintf(w, "%-52s %6.2f (bar %s %.2f: %s)\n", name, r, op, limit, verdict(ok))
	}
	p99 := func(r bench.QueryResult) float64 { return float64(r.P99) }
	rate := func(r bench.QueryResult) float64 { return r.Rate() }
	ratio("two-month p99 / one-month p99", rep.TwoMonths, rep.OneMonth, 1.5, true, p99)
	ratio("month-table p99 / single-table p99 (raw SQL)", rep.RawMonth, rep.RawLegacy, 0.5, true, p99)
	ratio("HTTP rate / raw SQL rate", rep.HTTP, rep.RawMonth, 0.5, false, rate)
	ratio("service edits/s / raw edit transactions/s (mean)", rep.Changes.Edit, rep.Changes.Raw(), 0.6, false, rate)
	ratio("service recalls/s / raw edit transactions/s (mean)", rep.Changes.Recall, rep.Changes.Raw(), 0.6, false, rate)
	for _, r := range []bench.QueryResult{rep.HotCache, rep.HotSolo} {
		if !r.Skipped {
			fmt.Fprintf(w, "%-52s %6.2f ms (bar < 2 ms: %s)\n", r.Name+" p99",
				float64(r.P99.Microseconds())/1000, verdict(r.P99 < 2*time.Millisecond))
		}
	}
	if n := runtime.NumCPU(); n <= 4 && runtime.GOMAXPROCS(0) >= n {
		fmt.Fprintf(w, "note: GOMAXPROCS=%d lets this process use every core; if Redis and MariaDB run on this machine too,\n"+
			"GOMAXPROCS=%d leaves them one (docs/operations.md, \"Sharing a small VM with Redis\")\n", runtime.GOMAXPROCS(0), max(1, n-1))
	}
}
