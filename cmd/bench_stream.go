package cmd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/routing"
)

type benchStreamOptions struct {
	sockets  int
	topics   int
	tenants  int
	rate     int
	duration time.Duration
	rounds   int
	hoarders int
	hoardMB  int
	clients  bool // this process is the client side the bench started

	benchFlags
}

func newBenchStreamCmd(g *globals) *cobra.Command {
	o := &benchStreamOptions{}
	c := &cobra.Command{
		Use:   "stream",
		Short: "Realtime delivery p50/p99 beside raw Redis pub/sub, and memory per idle socket",
		Long: "Starts the send, query and persist roles in this process (the server) and the clients in a\n" +
			"child process, prepares groups over several bench tenants, opens --sockets WebSockets over\n" +
			"--topics topics, measures the Go heap and stacks the server holds for them idle, then sends\n" +
			"--rate messages/s for --duration, evenly spaced, and times each from its due time and from\n" +
			"the moment the server took it in (its created_at) to the frame read (open loop), beside a raw\n" +
			"SPUBLISH → subscriber pair published at the same due times on the same Redis; --rounds times\n" +
			"over the same sockets, reporting each round and the median of the rounds' p99 ratios.",
		Example: "  imshard bench stream\n  imshard bench stream --sockets=500 --topics=50 --rate=200 --duration=10s --rounds=1",
		Args:    cobra.NoArgs,
	}
	c.Flags().IntVar(&o.sockets, "sockets", 5000, "sockets to open")
	c.Flags().IntVar(&o.topics, "topics", 500, "topics the sockets follow")
	c.Flags().IntVar(&o.tenants, "tenants", 4, "bench tenants the topics are spread over")
	c.Flags().IntVar(&o.rate, "rate", 1000, "messages sent per second")
	c.Flags().DurationVar(&o.duration, "duration", 20*time.Second, "measured time of each round")
	c.Flags().IntVar(&o.rounds, "rounds", 3, "measured rounds, one after the other on the same sockets")
	c.Flags().IntVar(&o.hoarders, "hoarders", 0, "after the rounds, open this many sockets of one member that catch up --hoard-mb of history and never read, and time another user's catch-up and /readyz meanwhile (0: no hoard phase)")
	c.Flags().IntVar(&o.hoardMB, "hoard-mb", 18, "MB of history the hoarders catch up")
	c.Flags().BoolVar(&o.clients, "clients", false, "run as the client side of a bench (started by the bench itself)")
	_ = c.Flags().MarkHidden("clients")
	o.cpuProfileFlag(c, "write a CPU profile of the server process (not the clients) to this file")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.clients {
			return runBenchStreamClients(g)
		}
		if o.sockets < 1 || o.topics < 1 || o.tenants < 1 || o.rate < 1 || o.duration <= 0 || o.rounds < 1 {
			return usagef("--sockets, --topics, --tenants, --rate, --duration and --rounds must be positive")
		}
		if o.hoarders < 0 || o.hoardMB < 1 {
			return usagef("--hoarders must be 0 or more and --hoard-mb positive")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (streamResult, error) {
			return runBenchStream(ctx, cfg, o, g)
		}, func(w io.Writer, rep streamResult) { printBenchStream(w, o, rep) })
	}
	return c
}

func runBenchStream(ctx context.Context, cfg *config.Config, o *benchStreamOptions, g *globals) (rep streamResult, err error) {
	var tenants []bench.StreamTenant
	for i := range o.tenants {
		id := fmt.Sprintf("bench_stream%d", i)
		tenants = append(tenants, bench.StreamTenant{ID: id, Secret: []byte(benchTenant(cfg, id))})
	}
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.MaxConns = max(cfg.HTTP.MaxConns, 1024)
	cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain
	cfg.Stream.MaxConnections = max(cfg.Stream.MaxConnections, o.sockets)
	cfg.Stream.MaxConnectionsPerUser = 0 // a user of the bench holds many sockets
	if len(cfg.Kafka.Brokers) == 0 {
		cfg.Kafka.DataDir = ""
	}
	a := app.New(cfg, g.logger(cfg))
	if err := a.Start(ctx, []string{app.Send, app.Query, app.Persist}); err != nil {
		return streamResult{}, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	for _, t := range tenants {
		if err := prepareBenchTenant(ctx, a, t.ID); err != nil {
			return streamResult{}, err
		}
		db, dbErr := a.Pools().DB(ctx, t.ID)
		if dbErr != nil {
			return streamResult{}, dbErr
		}
		defer func() { err = errors.Join(err, dropBenchTenant(ctx, a, db, t.ID)) }()
	}
	return runStreamChild(ctx, g, streamPlan{
		BaseURL: "http://" + a.APIAddr(), Tenants: tenants, Topics: o.topics, Sockets: o.sockets,
		Rate: o.rate, Duration: o.duration, Rounds: o.rounds, Hoarders: o.hoarders, HoardBytes: int64(o.hoardMB) << 20,
		OpsURL: "http://" + a.OpsAddr(),
	})
}

// streamPlan is what the bench tells its client process (one JSON line on
// the child's stdin).
type streamPlan struct {
	BaseURL    string               `json:"base_url"`
	Tenants    []bench.StreamTenant `json:"tenants"`
	Topics     int                  `json:"topics"`
	Sockets    int                  `json:"sockets"`
	Rate       int                  `json:"rate"`
	Duration   time.Duration        `json:"duration"`
	Rounds     int                  `json:"rounds"`
	Hoarders   int                  `json:"hoarders"`
	HoardBytes int64                `json:"hoard_bytes"`
	OpsURL     string               `json:"ops_url"`
}

// streamResult is the whole measurement: the clients' report and the
// server process's memory at the stages.
type streamResult struct {
	bench.StreamReport
	Server map[string]bench.Process
}

// IdleBytes is the server's Go heap and stacks per idle socket.
func (r streamResult) IdleBytes() float64 {
	return float64(int64(r.Server[bench.StageIdleAfter].HeapStacks)-int64(r.Server[bench.StageIdleBefore].HeapStacks)) / float64(r.Sockets)
}

// IdleGoroutines is the server's goroutines per idle socket.
func (r streamResult) IdleGoroutines() float64 {
	return float64(r.Server[bench.StageIdleAfter].Goroutines-r.Server[bench.StageIdleBefore].Goroutines) / float64(r.Sockets)
}

// The lines the client process writes on its stdout: "mark <stage>" (it
// waits for a line on its stdin before going on) and, last, "report
// <json>".
const (
	streamMarkLine   = "mark "
	streamReportLine = "report "
)

// runStreamChild runs the clients in a child process (this executable,
// `bench stream --clients`), so that the memory measured here, at the
// child's marks, is the server's alone.
func runStreamChild(ctx context.Context, g *globals, plan streamPlan) (streamResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return streamResult{}, err
	}
	args := []string{"bench", "stream", "--clients"}
	if g.configPath != "" {
		args = append([]string{"--config", g.configPath}, args...)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env, cmd.Stderr = g.env, g.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return streamResult{}, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return streamResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return streamResult{}, err
	}
	res := streamResult{Server: map[string]bench.Process{}}
	talk := func() error {
		defer in.Close()
		if err := json.NewEncoder(in).Encode(plan); err != nil {
			return err
		}
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, streamMarkLine):
				res.Server[strings.TrimPrefix(line, streamMarkLine)] = bench.ReadProcess()
				if _, err := io.WriteString(in, "ok\n"); err != nil {
					return err
				}
			case strings.HasPrefix(line, streamReportLine):
				return json.Unmarshal([]byte(strings.TrimPrefix(line, streamReportLine)), &res.StreamReport)
			}
		}
		return errors.Join(sc.Err(), errors.New("bench stream: the client process ended without a report"))
	}
	err = talk()
	return res, errors.Join(err, cmd.Wait())
}

// runBenchStreamClients is the client process: it reads the plan, runs
// the sockets and senders, and answers the report.
func runBenchStreamClients(g *globals) error {
	cfg, err := g.load(nil)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	keys, err := routing.NewKeySpace(cfg.Redis.KeyPrefix)
	if err != nil {
		return err
	}
	rdb, err := app.NewRedis(cfg.Redis)
	if err != nil {
		return err
	}
	defer rdb.Close()
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench stream --clients: reading the plan on stdin: %w", err)
	}
	var plan streamPlan
	if err := json.Unmarshal(line, &plan); err != nil {
		return fmt.Errorf("bench stream --clients: the plan: %w", err)
	}
	rep, err := bench.Stream(ctx, bench.StreamParams{
		BaseURL: plan.BaseURL, Tenants: plan.Tenants, Topics: plan.Topics, Sockets: plan.Sockets,
		Rate: plan.Rate, Duration: plan.Duration, Rounds: plan.Rounds, Redis: rdb,
		Hoarders: plan.Hoarders, HoardBytes: plan.HoardBytes, OpsURL: plan.OpsURL, KeySpace: keys, Progress: g.stderr,
		Mark: func(stage string) error {
			if _, err := fmt.Fprintf(g.stdout, "%s%s\n", streamMarkLine, stage); err != nil {
				return err
			}
			_, err := in.ReadBytes('\n')
			return err
		},
	})
	if err != nil {
		return err
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(g.stdout, "%s%s\n", streamReportLine, b)
	return err
}

func printBenchStream(w io.Writer, o *benchStreamOptions, rep streamResult) {
	fmt.Fprintf(w, "stream bench: sockets=%d topics=%d tenants=%d rate=%d/s duration=%s rounds=%d\n",
		o.sockets, o.topics, o.tenants, o.rate, o.duration, len(rep.Rounds))
	for i, r := range rep.Rounds {
		fmt.Fprintf(w, "round %d: sent=%d (%.0f/s) not sent (senders busy)=%d errors=%d\n",
			i+1, r.Sent, float64(r.Sent)/max(r.Seconds, 1e-9), r.Skipped, r.Errors)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "run\tframes\tp50\tp99")
		for _, l := range []bench.StreamLatency{r.Delivery, r.Arrival, r.Published, r.FanOut, r.Send, r.PubSub} {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", l.Name, l.Count, l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond))
		}
		_ = tw.Flush()
		if a, d := r.Ratios(); a > 0 {
			fmt.Fprintf(w, "round %d: delivery p99 / raw pub/sub p99: %.2f from the send's arrival, %.2f from its due time\n", i+1, a, d)
		}
	}
	fmt.Fprintf(w, "%s: %d sends, p50 %s, p99 %s\n", rep.Warmup.Name, rep.Warmup.Count, rep.Warmup.P50.Round(time.Microsecond), rep.Warmup.P99.Round(time.Microsecond))
	if a, d := rep.MedianRatios(); a > 0 {
		fmt.Fprintf(w, "delivery p99 / raw pub/sub p99, median of the rounds: %.2f from the send's arrival (bar: <= 3), %.2f from its due time\n", a, d)
	}
	fmt.Fprintf(w, "server memory per idle socket (Go heap + stacks of the server process; the clients run in another): %.1f KiB, %.2f goroutines (bar: <= 20 KiB)\n",
		rep.IdleBytes()/1024, rep.IdleGoroutines())
	if h := rep.Hoard; h != nil {
		fmt.Fprintf(w, "hoard: %d of %d sockets of one member opened, each catching up %d messages (%d MB) without reading\n",
			h.Opened, h.Hoarders, h.HistoryMsgs, h.HistoryBytes>>20)
		for _, l := range []bench.StreamLatency{h.VictimBefore, h.VictimDuring} {
			fmt.Fprintf(w, "hoard: %s (%d runs): p50 %s, max %s\n", l.Name, l.Count, l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond))
		}
		before, during := rep.Server[bench.StageHoardBefore], rep.Server[bench.StageHoardDuring]
		fmt.Fprintf(w, "hoard: server Go heap + stacks %.1f MB before, %.1f MB while hoarded; /readyz not 200 in %d of %d checks\n",
			float64(before.HeapStacks)/(1<<20), float64(during.HeapStacks)/(1<<20), h.ReadyFailures, h.ReadyChecks)
	}
}
