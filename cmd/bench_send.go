package cmd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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
	pairs       int
	bodyBytes   int
	rate        string
	peer        string
	addr        string
	profileHTTP string
	limits      string
	benchFlags
}

// The --limits of bench send: the cost of the send call's limit check
// with every bucket on (and never reached), or without it.
const (
	limitsUnhit = "unhit"
	limitsOff   = "off"
)

// minPairs is the fewest rounds whose medians the bars are read from.
const minPairs = 5

func newBenchSendCmd(g *globals) *cobra.Command {
	o := &benchSendOptions{}
	c := &cobra.Command{
		Use:   "send",
		Short: "HTTP send beside a reference send (and an outside peer) in paired rounds; open loop; Redis cost per send",
		Example: "  imshard bench send\n" +
			"  imshard bench send --pairs=5 --duration=10s --peer='cd ../peer && go run . -clients 64 -dur 10s'\n" +
			"  imshard bench send --rate=4000,6000 --pairs=1",
		Long: "Starts the send role in-process (or targets --addr), prepares groups and members for a tenant, measures\n" +
			"the raw allocation FCALL, then runs --pairs rounds; each round runs every side once for --duration with\n" +
			"--concurrency keep-alive clients and the same message body, the first side rotating:\n" +
			"  HTTP send       the product's POST /v1/topics/{topic}/messages, end to end\n" +
			"  reference send  the simplest correct send, in this process from plain Redis and Kafka client calls:\n" +
			"                  token check, strict decode, membership map, one script call, produce, one pipeline\n" +
			"  peer            --peer=CMD, run by sh; it must print \"N ok, F failed, R/s, p50 D, p99 D\"\n" +
			"A persist role runs during the preparation until the tenant's idempotency horizon stands, then stops.\n" +
			"It prints every round and the medians over the rounds, the ratios (bars: rate >= 0.80, p99 <= 1.50),\n" +
			"Redis µs per send (INFO commandstats), Redis memory per idempotency record, this process's peak RSS,\n" +
			"CPU µs and allocations per send, then open-loop runs (--rate) with latency from each request's scheduled time.",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.concurrency, "concurrency", 64, "concurrent clients of every side")
	c.Flags().DurationVar(&o.duration, "duration", 10*time.Second, "measured time of each side in each round (and of each open-loop run)")
	c.Flags().DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured time of each side before the rounds")
	c.Flags().IntVar(&o.topics, "topics", 100, "topics (groups) to spread the sends over")
	c.Flags().IntVar(&o.pairs, "pairs", minPairs, "rounds, each running every side once; the bars read medians of at least 5")
	c.Flags().IntVar(&o.bodyBytes, "body-bytes", 100, "length of each message's text")
	c.Flags().StringVar(&o.rate, "rate", "auto", "open-loop arrival rates per second, comma-separated; auto = 50%, 80% and 95% of the reference send's median closed-loop rate; 0 = none")
	c.Flags().StringVar(&o.peer, "peer", "", "shell command of an outside peer to run as a third side each round")
	c.Flags().StringVar(&o.addr, "addr", "", "API address of a running send role (default: start one in-process)")
	o.tenantFlag(c, "bench", "tenant to send as (with --addr: a configured tenant)")
	o.cpuProfileFlag(c, "write a CPU profile of the whole run (in-process API included) to this file")
	c.Flags().StringVar(&o.limits, "limits", limitsUnhit, "the in-process tenant's send limits: unhit (its tenant, user and topic buckets on at 1,000,000/s, decided on every send and never reached) or off (no bucket)")
	c.Flags().StringVar(&o.profileHTTP, "profile-http", "", "write a CPU profile of the first round's HTTP side alone to this file (not with --cpuprofile)")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.concurrency < 1 || o.topics < 1 || o.pairs < 1 || o.duration <= 0 || o.bodyBytes < 1 || o.warmup < 0 {
			return usagef("--concurrency, --topics, --pairs, --body-bytes and --duration must be positive")
		}
		rates, shares, err := parseRates(o.rate)
		if err != nil {
			return err
		}
		if o.limits != limitsUnhit && o.limits != limitsOff {
			return usagef("--limits must be %s or %s, got %q", limitsUnhit, limitsOff, o.limits)
		}
		if o.profileHTTP != "" && o.cpuProfile != "" {
			return usagef("--profile-http and --cpuprofile cannot run together (one CPU profile at a time)")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.SendReport, error) {
			return runBenchSend(ctx, cfg, o, rates, shares, g)
		}, func(w io.Writer, rep bench.SendReport) { printBenchSend(w, o, rep) })
	}
	return c
}

// parseRates reads --rate: "auto", "0" or a list of positive rates.
func parseRates(s string) (rates, shares []float64, err error) {
	switch strings.TrimSpace(s) {
	case "auto":
		return nil, []float64{0.5, 0.8, 0.95}, nil
	case "0", "":
		return nil, nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 1 {
			return nil, nil, usagef("--rate: %q is not auto, 0 or a list of rates >= 1", s)
		}
		rates = append(rates, v)
	}
	return rates, nil, nil
}

// runBenchSend starts what the bench needs and runs bench.Send.
func runBenchSend(ctx context.Context, cfg *config.Config, o *benchSendOptions, rates, shares []float64, g *globals) (rep bench.SendReport, err error) {
	var secret []byte
	if o.addr == "" {
		// a tenant of our own with a one-off secret; its database and Redis
		// keys are dropped at the end
		secret = []byte(benchTenant(cfg, o.tenant))
		if o.limits == limitsUnhit {
			unhit := &config.Rate{PerSecond: 1_000_000, Burst: 1_000_000}
			cfg.Tenants[len(cfg.Tenants)-1].Limits.Send = config.TenantSendLimits{Tenant: unhit, User: unhit, Topic: unhit}
		}
	} else {
		if len(cfg.Kafka.Brokers) == 0 {
			return bench.SendReport{}, usagef("--addr needs kafka.brokers: the reference send must produce to the API's Kafka")
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
	var a *app.App
	baseURL := "http://" + o.addr
	var conn []kgo.Opt
	var persist func(context.Context) (func(), error)
	if o.addr == "" {
		r, err := startBenchSend(ctx, cfg, g, o.tenant)
		if err != nil {
			return bench.SendReport{}, err
		}
		defer func() { err = errors.Join(err, r.stop()) }()
		a, baseURL = r.a, "http://"+r.a.APIAddr()
		conn = a.KafkaConn()
		persist = r.persist
	} else {
		a = app.New(cfg, g.logger(cfg))
		if err := a.StartTools(ctx); err != nil {
			return bench.SendReport{}, err
		}
		defer a.Close()
		var err error
		if conn, err = app.KafkaOpts(cfg.Kafka); err != nil {
			return bench.SendReport{}, err
		}
	}
	var profile io.Writer
	if o.profileHTTP != "" {
		f, err := os.Create(o.profileHTTP)
		if err != nil {
			return bench.SendReport{}, err
		}
		defer f.Close()
		profile = f
	}
	return bench.Send(ctx, bench.SendParams{
		Concurrency: o.concurrency, Round: o.duration, Warmup: o.warmup, Topics: o.topics, Pairs: o.pairs,
		BodyBytes: o.bodyBytes, Rates: rates, RateShares: shares, Peer: o.peer, ProfileHTTP: profile,
		BaseURL: baseURL, Tenant: o.tenant, Secret: secret,
		Redis: a.Redis(), KeySpace: a.KeySpace(), Allocator: a.Allocator(),
		Producer: send.ProducerOpts(conn, cfg.Kafka.Topic, cfg.Send.ProduceTimeout),
		Persist:  persist, ProduceTimeout: cfg.Send.ProduceTimeout,
		Progress: g.stderr,
	})
}

// benchSend is a send role of this process for a bench tenant of its own,
// its months ready (prepareBenchTenant).
type benchSend struct {
	a  *app.App
	db *sql.DB // the tenant's database
	// persist starts a persist role beside it (runPersist)
	persist func(context.Context) (func(), error)
	// stop drops the tenant and stops the role (and the in-memory Kafka)
	stop func() error
}

// startBenchSend starts the send role of cfg (which has the bench tenant)
// on loopback ports, on the in-memory Kafka unless kafka.brokers are set.
func startBenchSend(ctx context.Context, cfg *config.Config, g *globals, tenant string) (_ *benchSend, err error) {
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain
	var undo []func()
	stop := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	// started here so that a persist role of the bench reaches it too
	stopKafka, err := benchKafka(&cfg.Kafka)
	if err != nil {
		return nil, err
	}
	undo = append(undo, stopKafka)
	a := app.New(cfg, g.logger(cfg))
	if err := a.Start(ctx, []string{app.Send}); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	undo = append(undo, func() { cancel(); <-done })
	if err := prepareBenchTenant(ctx, a, tenant); err != nil {
		return nil, err
	}
	db, err := a.Pools().DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return &benchSend{a: a, db: db,
		persist: func(ctx context.Context) (func(), error) { return runPersist(ctx, cfg, g) },
		stop: func() error {
			err := dropBenchTenant(ctx, a, db, tenant)
			stop()
			return err
		}}, nil
}

// runPersist starts a persist role of its own in this process, against the
// bench's Kafka, Redis and MySQL, until the returned stop is called: a send
// role trusts its idempotency horizon only once persist's progress vouches
// that MySQL holds everything sent before Redis's memory began, as it does
// wherever persist runs. It runs during the preparation only, so that the
// rounds measure the send alone, as the reference send is measured.
func runPersist(ctx context.Context, cfg *config.Config, g *globals) (func(), error) {
	pc := *cfg
	pc.Metrics.Addr = "127.0.0.1:0"
	a := app.New(&pc, g.logger(&pc))
	if err := a.Start(ctx, []string{app.Persist}); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	return func() { cancel(); <-done }, nil
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
	limits := "limits=" + o.limits
	if o.addr != "" {
		limits = "limits as the API's configuration has them"
	}
	fmt.Fprintf(w, "send bench: concurrency=%d duration=%s/side/round rounds=%d topics=%d body=%dB GOMAXPROCS=%d %s\n",
		o.concurrency, o.duration, len(rep.Rounds), o.topics, o.bodyBytes, rep.GOMAXPROCS, limits)
	if o.peer != "" {
		fmt.Fprintf(w, "peer: %s\n", o.peer)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	opt := func(v float64, format string) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf(format, v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "round\tside\tsends\terrors\trate/s\tp50\tp99\tp99.9\tRedis µs/send\tRedis CPU µs/send\tCPU µs/send\tallocs/send\tpeak RSS MiB")
	row := func(label string, r bench.RoundResult) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", label, r.Side, r.Sends, r.Errors, r.Rate,
			ms(r.P50), ms(r.P99), opt(float64(r.P999)/1e6, "%.2fms"), opt(r.RedisUS, "%.1f"), opt(r.RedisCPUUS, "%.1f"),
			opt(r.CPUUS, "%.0f"), opt(r.AllocsPerSend, "%.0f"), opt(float64(r.PeakRSS)/(1<<20), "%.0f"))
	}
	for i, round := range rep.Rounds {
		for _, r := range round {
			row(strconv.Itoa(i+1), r)
		}
	}
	for _, side := range rep.Sides {
		row("median", rep.Median(side))
	}
	row("-", rep.Alloc)
	_ = tw.Flush()
	note := ""
	if len(rep.Rounds) < minPairs {
		note = fmt.Sprintf(" — only %d rounds: the bars need medians of %d", len(rep.Rounds), minPairs)
	}
	for _, ref := range rep.Sides[1:] {
		rate, p99 := rep.Ratios(bench.SideHTTP, ref)
		fmt.Fprintf(w, "HTTP / %s = rate %.2f (bar >= 0.80: %s), p99 %.2f (bar <= 1.50: %s)%s\n", ref, rate, verdict(rate >= 0.8), p99, verdict(p99 <= 1.5), note)
	}
	for _, side := range rep.Sides[:2] {
		if n, ok := rep.RecordBytes[side]; ok {
			fmt.Fprintf(w, "Redis memory per idempotency record, %s: %.0f B\n", side, n)
		}
	}
	if len(rep.OpenLoop) > 0 {
		fmt.Fprintln(w, "open loop (latency from each request's scheduled time):")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "offered/s\tside\tsends\terrors\tachieved/s\tp50\tp99\tp99.9\tpeak in flight")
		for _, pair := range rep.OpenLoop {
			for _, r := range pair {
				fmt.Fprintf(tw, "%.0f\t%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%d\n", r.Offered, r.Side, r.Sends, r.Errors, r.Rate, ms(r.P50), ms(r.P99), ms(r.P999), r.PeakInFlight)
			}
		}
		_ = tw.Flush()
		// the latency bars: at each offered rate the HTTP send keeps up
		// (achieved >= 0.99 x offered) with a p99 within 1.5 x the
		// reference's at the same rate (they hold at 50 % and 80 % of the
		// reference's closed-loop rate; 95 % shows how the tail grows)
		for _, pair := range rep.OpenLoop {
			if len(pair) < 2 || pair[1].P50 <= 0 {
				continue
			}
			h, r := pair[0], pair[1]
			kept := h.Rate / h.Offered
			fmt.Fprintf(w, "open loop at %.0f/s: HTTP achieved %.3f x offered (bar >= 0.99: %s); HTTP / reference p50 %.2f, p99 %.2f (bar <= 1.50: %s), p99.9 %.2f\n",
				h.Offered, kept, verdict(kept >= 0.99), ratio(h.P50, r.P50), ratio(h.P99, r.P99), verdict(ratio(h.P99, r.P99) <= 1.5), ratio(h.P999, r.P999))
		}
	}
}
