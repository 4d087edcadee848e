package cmd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/httpapi"
)

type benchRotationOptions struct {
	rate        int
	duration    time.Duration
	concurrency int
	benchFlags
}

// rotationBar is the request rate a key rotation must hold with no request failed.
const rotationBar = 1000

func newBenchRotationCmd(g *globals) *cobra.Command {
	o := &benchRotationOptions{}
	c := &cobra.Command{
		Use:   "rotation",
		Short: "Authenticated requests at a fixed rate across a key rotation (add, switch the issuer, remove), beside the same load without one",
		Long: "Starts the query role in this process for a bench tenant of its own with an HS256 key, then sends\n" +
			"--rate GET /v1/me/topics a second (open loop) for --duration without a rotation, and for --duration\n" +
			"across a rotation done as docs/operations.md \"Key rotation\" tells: a reload adds a second key at a\n" +
			"quarter of the run, the issuer switches to it at half, and a reload removes the first key once no\n" +
			"request carrying its token is under way. Every request not answered 200 is a failure; the bar is\n" +
			"none at 1,000 requests/s.",
		Example: "  imshard bench rotation\n  imshard bench rotation --rate=2000 --duration=20s",
		Args:    cobra.NoArgs,
	}
	c.Flags().IntVar(&o.rate, "rate", rotationBar, "requests per second")
	c.Flags().DurationVar(&o.duration, "duration", 20*time.Second, "measured time of each run")
	c.Flags().IntVar(&o.concurrency, "concurrency", 64, "requests under way at most")
	o.ownTenant(c, "bench_rotation")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.rate < 1 || o.duration <= 0 || o.concurrency < 1 {
			return usagef("--rate, --duration and --concurrency must be positive")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.RotationReport, error) {
			return runBenchRotation(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.RotationReport) { printBenchRotation(w, o, rep) })
	}
	return c
}

func runBenchRotation(ctx context.Context, cfg *config.Config, o *benchRotationOptions, g *globals) (rep bench.RotationReport, err error) {
	benchTenant(cfg, o.tenant)
	keys := map[string]config.TenantKey{}
	for _, kid := range []string{"bench-old", "bench-new"} {
		var b [32]byte
		_, _ = rand.Read(b[:])
		keys[kid] = config.TenantKey{KID: kid, Alg: config.AlgHS256, Secret: hex.EncodeToString(b[:])}
	}
	for i, t := range cfg.Tenants {
		if t.ID == o.tenant {
			cfg.Tenants[i].Keys = []config.TenantKey{keys["bench-old"]}
		}
	}
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.MaxConns = max(cfg.HTTP.MaxConns, o.concurrency*2)
	cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain
	a := app.New(cfg, g.logger(cfg))
	if err := a.Start(ctx, []string{app.Query}); err != nil {
		return rep, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	if err := prepareBenchTenant(ctx, a, o.tenant); err != nil {
		return rep, err
	}
	db, err := a.Pools().DB(ctx, o.tenant)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, dropBenchTenant(ctx, a, db, o.tenant)) }()
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = o.concurrency
	defer transport.CloseIdleConnections()
	return bench.Rotation(ctx, bench.RotationParams{
		URL: "http://" + a.APIAddr() + "/v1/me/topics",
		Token: func(kid string) (string, error) {
			k := keys[kid]
			return httpapi.SignWith(httpapi.Signer{KID: kid, Alg: k.Alg, Key: []byte(k.Secret)}, o.tenant, 1, "", time.Hour)
		},
		Keys: func(kids []string) {
			// a reload as SIGHUP makes it: the tenant list read again, with
			// the bench tenant's keys replaced
			next := *cfg
			next.Tenants = slices.Clone(cfg.Tenants)
			for i, t := range next.Tenants {
				if t.ID == o.tenant {
					t.Keys = nil
					for _, kid := range kids {
						t.Keys = append(t.Keys, keys[kid])
					}
					next.Tenants[i] = t
				}
			}
			a.Reload(&next)
		},
		Old: "bench-old", New: "bench-new",
		Rate: o.rate, Duration: o.duration, Concurrency: o.concurrency,
		Client:   &http.Client{Transport: transport, Timeout: 10 * time.Second},
		Progress: g.stderr,
	})
}

func printBenchRotation(w io.Writer, o *benchRotationOptions, rep bench.RotationReport) {
	fmt.Fprintf(w, "rotation bench: rate=%d/s duration=%s/run concurrency=%d GOMAXPROCS=%d\n",
		o.rate, o.duration, o.concurrency, runtime.GOMAXPROCS(0))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\trequests\tfailed\trate/s\tp50\tp99")
	for _, r := range []bench.RotationResult{rep.Steady, rep.Rotation} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\n", r.Name, r.Requests, r.Failed, r.Rate(),
			r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	for _, r := range []bench.RotationResult{rep.Steady, rep.Rotation} {
		if r.FirstFailure != "" {
			fmt.Fprintf(w, "%s: first failure: %s\n", r.Name, r.FirstFailure)
		}
	}
	r := rep.Rotation
	// the run kept up when it answered its requests at the rate asked
	// (within 1 %: the last ones answer after the last is due)
	kept := r.Rate() >= 0.99*float64(o.rate)
	fmt.Fprintf(w, "%-52s %d at %.0f/s (bar 0 at >= %d/s: %s)\n", "failed requests during the rotation", r.Failed, r.Rate(),
		rotationBar, verdict(r.Failed == 0 && o.rate >= rotationBar && kept))
}
