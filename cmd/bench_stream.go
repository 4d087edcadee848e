package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
)

type benchStreamOptions struct {
	sockets  int
	topics   int
	tenants  int
	rate     int
	duration time.Duration
}

func newBenchStreamCmd(g *globals) *cobra.Command {
	o := &benchStreamOptions{}
	c := &cobra.Command{
		Use:   "stream",
		Short: "Realtime delivery p50/p99 beside raw Redis pub/sub, and memory per idle socket",
		Long: "Starts every role in-process, prepares groups over several bench tenants, opens --sockets\n" +
			"WebSockets over --topics topics, measures the Go heap and stacks they hold idle, then sends\n" +
			"--rate messages/s for --duration and times each from the send request to the frame read,\n" +
			"beside a raw SPUBLISH → subscriber pair at the same rate on the same Redis.",
		Example: "  imshard bench stream\n  imshard bench stream --sockets=500 --topics=50 --rate=200 --duration=10s",
		Args:    cobra.NoArgs,
	}
	c.Flags().IntVar(&o.sockets, "sockets", 5000, "sockets to open")
	c.Flags().IntVar(&o.topics, "topics", 500, "topics the sockets follow")
	c.Flags().IntVar(&o.tenants, "tenants", 4, "bench tenants the topics are spread over")
	c.Flags().IntVar(&o.rate, "rate", 1000, "messages sent per second")
	c.Flags().DurationVar(&o.duration, "duration", 20*time.Second, "measured time")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.sockets < 1 || o.topics < 1 || o.tenants < 1 || o.rate < 1 || o.duration <= 0 {
			return usagef("--sockets, --topics, --tenants, --rate and --duration must be positive")
		}
		cfg, err := g.load(nil, "send", "query")
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		rep, err := runBenchStream(ctx, cfg, o, g)
		if err != nil {
			return err
		}
		printBenchStream(g.stdout, o, rep)
		return nil
	}
	return c
}

func runBenchStream(ctx context.Context, cfg *config.Config, o *benchStreamOptions, g *globals) (rep bench.StreamReport, err error) {
	var tenants []bench.StreamTenant
	for i := range o.tenants {
		id := fmt.Sprintf("bench_stream%d", i)
		tenants = append(tenants, bench.StreamTenant{ID: id, Secret: []byte(benchTenant(cfg, id))})
	}
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.MaxConns = max(cfg.HTTP.MaxConns, 1024)
	cfg.Stream.MaxConnections = max(cfg.Stream.MaxConnections, o.sockets)
	if len(cfg.Kafka.Brokers) == 0 {
		cfg.Kafka.DataDir = ""
	}
	a := app.New(cfg, g.logger(cfg))
	if err := a.Start(ctx, []string{app.Send, app.Query, app.Persist}); err != nil {
		return bench.StreamReport{}, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	for _, t := range tenants {
		if err := prepareBenchTenant(ctx, a, t.ID); err != nil {
			return bench.StreamReport{}, err
		}
		db, dbErr := a.Pools().DB(ctx, t.ID)
		if dbErr != nil {
			return bench.StreamReport{}, dbErr
		}
		defer func() { err = errors.Join(err, dropBenchTenant(ctx, a, db, t.ID)) }()
	}
	return bench.Stream(ctx, bench.StreamParams{
		BaseURL: "http://" + a.APIAddr(), Tenants: tenants, Topics: o.topics, Sockets: o.sockets,
		Rate: o.rate, Duration: o.duration, Redis: a.Redis(), Progress: g.stderr,
	})
}

func printBenchStream(w io.Writer, o *benchStreamOptions, rep bench.StreamReport) {
	fmt.Fprintf(w, "stream bench: sockets=%d topics=%d tenants=%d rate=%d/s duration=%s sent=%d errors=%d\n",
		o.sockets, o.topics, o.tenants, o.rate, o.duration, rep.Sent, rep.Errors)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tframes\tp50\tp99")
	for _, r := range []bench.StreamLatency{rep.Delivery, rep.PubSub} {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", r.Name, r.Count, r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "memory per idle socket (Go heap + stacks, server and client ends in this process): %.1f KiB\n", rep.IdleBytes/1024)
}
