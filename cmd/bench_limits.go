package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
)

type benchLimitsOptions struct {
	processes int
	duration  time.Duration
	perSecond float64
	burst     int
	offered   float64
	benchFlags
}

// limitsBar is the largest deviation of the accepted rate from the limit
// the bar allows.
const limitsBar = 0.05

func newBenchLimitsCmd(g *globals) *cobra.Command {
	o := &benchLimitsOptions{}
	c := &cobra.Command{
		Use:     "limits",
		Short:   "One user sending through several send processes at a multiple of its limit: is the limit exact across them?",
		Example: "  imshard bench limits\n  imshard bench limits --duration=30s --per-second=100 --offered=3",
		Long: "Starts --processes send roles in this process, each its own API, all on the configured Redis and MySQL,\n" +
			"gives a tenant of its own the user send limit --per-second (burst --burst; every other limit off), and\n" +
			"has one user send to one topic at --offered times the limit for --duration, open loop, the sends spread\n" +
			"evenly over the processes. It prints the sends accepted per process, the refusals (429), and the\n" +
			"accepted rate (less the starting burst) beside the limit; the bar: within 5 %.",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.processes, "processes", 2, "send processes (in-process, each with its own API)")
	c.Flags().DurationVar(&o.duration, "duration", 30*time.Second, "sending time")
	c.Flags().Float64Var(&o.perSecond, "per-second", 100, "the user's send limit (limits.send.user.per_second)")
	c.Flags().IntVar(&o.burst, "burst", 100, "the limit's burst (limits.send.user.burst): a second of the limit absorbs the load generator's own stalls on a busy machine")
	c.Flags().Float64Var(&o.offered, "offered", 3, "the offered rate as a multiple of the limit")
	o.tenantFlag(c, "bench_limits", "the bench's own tenant (created, then dropped)")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.processes < 1 || o.duration <= 0 || o.perSecond <= 0 || o.burst < 1 || o.offered <= 0 {
			return usagef("--processes, --duration, --per-second, --burst and --offered must be positive")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.LimitsReport, error) {
			return runBenchLimits(ctx, cfg, o, g)
		}, printBenchLimits)
	}
	return c
}

func runBenchLimits(ctx context.Context, cfg *config.Config, o *benchLimitsOptions, g *globals) (rep bench.LimitsReport, err error) {
	secret := benchTenant(cfg, o.tenant)
	t := &cfg.Tenants[len(cfg.Tenants)-1]
	t.Limits.Send.User = &config.Rate{PerSecond: o.perSecond, Burst: o.burst}
	if err := cfg.Validate(); err != nil {
		return rep, usagef("%v", err)
	}
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain
	if len(cfg.Kafka.Brokers) == 0 {
		cfg.Kafka.DataDir = "" // each process's in-process Kafka in memory: nothing to clean up
	}
	var urls []string
	var first *app.App
	for range o.processes {
		a := app.New(cfg, g.logger(cfg))
		if err := a.Start(ctx, []string{app.Send}); err != nil {
			return rep, err
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(runCtx) }()
		defer func() { cancel(); <-done }()
		urls = append(urls, "http://"+a.APIAddr())
		if first == nil {
			first = a
		}
	}
	if err := prepareBenchTenant(ctx, first, o.tenant); err != nil {
		return rep, err
	}
	db, err := first.Pools().DB(ctx, o.tenant)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, dropBenchTenant(ctx, first, db, o.tenant)) }()
	return bench.Limits(ctx, bench.LimitsParams{BaseURLs: urls, Tenant: o.tenant, Secret: []byte(secret),
		PerSecond: o.perSecond, Burst: o.burst, Offered: o.offered, Duration: o.duration, Progress: g.stderr})
}

func printBenchLimits(w io.Writer, rep bench.LimitsReport) {
	p := rep.Params
	fmt.Fprintf(w, "limits bench: %d processes, one user at %.0f/s offered (%.1f× its limit of %g/s, burst %d) for %s\n",
		len(p.BaseURLs), p.PerSecond*p.Offered, p.Offered, p.PerSecond, p.Burst, rep.Elapsed.Round(time.Millisecond))
	var total int64
	for i, a := range rep.Accepted {
		fmt.Fprintf(w, "process %d: %d accepted\n", i+1, a)
		total += a
	}
	fmt.Fprintf(w, "accepted %d, refused 429 %d, failed %d\n", total, rep.Refused, rep.Failed)
	if rep.FirstErr != nil {
		fmt.Fprintf(w, "first failure: %v\n", rep.FirstErr)
	}
	fmt.Fprintf(w, "accepted rate (less the burst): %.2f/s = %.4f× the limit; bar: within %.0f %% — %s\n",
		rep.AcceptedRate(), rep.AcceptedRate()/p.PerSecond, limitsBar*100, verdict(rep.Failed == 0 && rep.Deviation() <= limitsBar))
}
