package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/send"
	"github.com/imshard/imshard/modules/shardmgr"
)

type benchSendOptions struct {
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	topics      int
	rounds      int
	addr        string
	tenant      string
	cpuProfile  string
}

func newBenchSendCmd(g *globals) *cobra.Command {
	o := &benchSendOptions{}
	c := &cobra.Command{
		Use:     "send",
		Short:   "HTTP send throughput and p50/p99 beside the raw Redis + Kafka pipeline and the raw allocation rate",
		Example: "  imshard bench send\n  imshard bench send --concurrency=16 --duration=10s --rounds=2",
		Long: "Starts the send role in-process (or targets --addr), prepares groups and members for a tenant,\n" +
			"then measures the raw allocation FCALL, the raw per-message pipeline (the same Redis commands and\n" +
			"Kafka produce, issued directly) and HTTP sends, each with the same concurrency on the same services.",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.concurrency, "concurrency", 64, "concurrent clients")
	c.Flags().DurationVar(&o.duration, "duration", 20*time.Second, "measured time of each run")
	c.Flags().DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured time before each run")
	c.Flags().IntVar(&o.topics, "topics", 100, "topics (groups) to spread the sends over")
	c.Flags().IntVar(&o.rounds, "rounds", 4, "HTTP and raw pipeline alternate in this many slices of --duration")
	c.Flags().StringVar(&o.addr, "addr", "", "API address of a running send role (default: start one in-process)")
	c.Flags().StringVar(&o.tenant, "tenant", "bench", "tenant to send as (with --addr: a configured tenant)")
	c.Flags().StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (in-process API included) to this file")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.concurrency < 1 || o.topics < 1 || o.rounds < 1 || o.duration <= 0 {
			return usagef("--concurrency, --topics, --rounds and --duration must be positive")
		}
		cfg, err := g.load(nil, "send")
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		return withCPUProfile(o.cpuProfile, func() error {
			rep, err := runBenchSend(ctx, cfg, o, g)
			if err != nil {
				return err
			}
			printBenchSend(g.stdout, o, rep)
			return nil
		})
	}
	return c
}

// runBenchSend starts what the bench needs and runs bench.Send.
func runBenchSend(ctx context.Context, cfg *config.Config, o *benchSendOptions, g *globals) (bench.SendReport, error) {
	var secret []byte
	if o.addr == "" {
		// a tenant of our own with a one-off secret; its database is kept
		// (seqs just continue on the next run)
		secret = []byte(benchTenant(cfg, o.tenant))
		cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
		cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain
		if len(cfg.Kafka.Brokers) == 0 {
			cfg.Kafka.DataDir = "" // the in-process Kafka in memory: nothing to clean up
		}
	} else {
		if len(cfg.Kafka.Brokers) == 0 {
			return bench.SendReport{}, usagef("--addr needs kafka.brokers: the raw baseline must produce to the API's Kafka")
		}
		for _, t := range cfg.Tenants {
			if t.ID == o.tenant {
				secret = []byte(t.JWTSecret)
			}
		}
		if secret == nil {
			return bench.SendReport{}, usagef("--tenant %q is not configured", o.tenant)
		}
	}
	if err := routing.ValidTenant(o.tenant); err != nil {
		return bench.SendReport{}, usagef("--tenant: %v", err)
	}
	a := app.New(cfg, g.logger(cfg))
	baseURL := "http://" + o.addr
	var conn []kgo.Opt
	if o.addr == "" {
		if err := a.Start(ctx, []string{app.Send}); err != nil {
			return bench.SendReport{}, err
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(runCtx) }()
		defer func() { cancel(); <-done }()
		baseURL = "http://" + a.APIAddr()
		if err := prepareBenchTenant(ctx, a, o.tenant); err != nil {
			return bench.SendReport{}, err
		}
		conn = a.KafkaConn()
	} else {
		if err := a.StartTools(ctx); err != nil {
			return bench.SendReport{}, err
		}
		defer a.Close()
		var err error
		if conn, err = app.KafkaOpts(cfg.Kafka); err != nil {
			return bench.SendReport{}, err
		}
	}
	return bench.Send(ctx, bench.SendParams{
		Concurrency: o.concurrency, Duration: o.duration, Warmup: o.warmup, Topics: o.topics, Rounds: o.rounds,
		BaseURL: baseURL, Tenant: o.tenant, Secret: secret,
		Redis: a.Redis(), Allocator: a.Allocator(), Flight: a.Flight(), Scripts: a.Scripts(),
		Producer: send.ProducerOpts(conn, cfg.Kafka.Topic, cfg.Send.ProduceTimeout), Send: cfg.Send, HotCache: cfg.HotCache,
		Progress: g.stderr,
	})
}

// prepareBenchTenant creates the tenant's month tables and makes sure a
// month is active (`shard ensure`, then `shard activate` of the Redis-time
// month when auto_advance is off).
func prepareBenchTenant(ctx context.Context, a *app.App, tenant string) error {
	mg := a.NewShardManager()
	if res := mg.SyncTenant(ctx, tenant, shardmgr.Options{MonthsAhead: -1}); res.Err != nil {
		return fmt.Errorf("bench: shard ensure %s: %w", tenant, res.Err)
	}
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return err
	}
	if err := mg.Activate(ctx, tenant, now); err != nil && !errors.Is(err, routing.ErrMonthOlder) {
		return fmt.Errorf("bench: activate %s: %w", now, err)
	}
	return nil
}

func printBenchSend(w io.Writer, o *benchSendOptions, rep bench.SendReport) {
	fmt.Fprintf(w, "send bench: concurrency=%d duration=%s topics=%d rounds=%d\n", o.concurrency, o.duration, o.topics, o.rounds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tmessages\terrors\trate/s\tp50\tp99")
	for _, r := range []bench.SendResult{rep.HTTP, rep.Raw, rep.Alloc} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\n", r.Name, r.Count, r.Errors, r.Rate(),
			r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	verdict := "met"
	if rep.Ratio() < 0.5 {
		verdict = "MISSED"
	}
	fmt.Fprintf(w, "HTTP / raw pipeline = %.2f (bar >= 0.50: %s)\n", rep.Ratio(), verdict)
}
