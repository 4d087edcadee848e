package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

type benchInboxOptions struct {
	users, topics, minPer, maxPer, heavy, messages int
	concurrency                                    int
	duration, warmup                               time.Duration
	cold                                           bool
	benchFlags
}

func newBenchInboxCmd(g *globals) *cobra.Command {
	o := &benchInboxOptions{}
	c := &cobra.Command{
		Use:   "inbox",
		Short: "read state: GET /v1/me/unread and a topic-list page (50) beside the raw SQL of the same answer; read-cursor moves",
		Long: "Builds a fixture in a tenant database of its own (--users users, each a member of --min-per..--max-per of\n" +
			"--topics topics, the first --heavy of them in exactly --max-per; --messages stored messages per topic; a\n" +
			"fifth of the memberships with something unread; the messages in the topics' hot caches with their seq\n" +
			"counters, as sending them would leave them, unless --cold), then measures p50/p99 with --concurrency readers acting\n" +
			"as the heavy users: the service's unread badges and first topic-list page, each beside one raw SQL\n" +
			"statement giving the same answer, and read-cursor moves. The database and its Redis keys are dropped\n" +
			"afterwards.",
		Example: "  imshard bench inbox\n  imshard bench inbox --users=2000 --topics=5000 --duration=5s",
		Args:    cobra.NoArgs,
	}
	c.Flags().IntVar(&o.users, "users", 10_000, "users of the fixture")
	c.Flags().IntVar(&o.topics, "topics", 20_000, "topics of the fixture")
	c.Flags().IntVar(&o.minPer, "min-per", 200, "fewest topics a user is in")
	c.Flags().IntVar(&o.maxPer, "max-per", 500, "most topics a user is in")
	c.Flags().IntVar(&o.heavy, "heavy", 100, "users in exactly --max-per topics (the readers)")
	c.Flags().IntVar(&o.messages, "messages", 20, "stored messages per topic")
	c.Flags().IntVar(&o.concurrency, "concurrency", 4, "concurrent readers")
	c.Flags().DurationVar(&o.duration, "duration", 10*time.Second, "measured time of each run")
	c.Flags().DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured time before each run")
	c.Flags().BoolVar(&o.cold, "cold", false, "leave the hot caches and seq counters empty (every count reads the month tables)")
	o.ownTenant(c, "bench_inbox")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.users < 1 || o.topics < 1 || o.minPer < 1 || o.maxPer < o.minPer || o.maxPer > o.topics ||
			o.heavy < 1 || o.heavy > o.users || o.messages < 1 || o.concurrency < 1 || o.duration <= 0 || o.warmup < 0 {
			return usagef("need users, topics, messages, concurrency, duration > 0; 1 <= min-per <= max-per <= topics; 1 <= heavy <= users")
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.InboxReport, error) {
			return runBenchInbox(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.InboxReport) { printBenchInbox(w, o, rep) })
	}
	return c
}

func runBenchInbox(ctx context.Context, cfg *config.Config, o *benchInboxOptions, g *globals) (rep bench.InboxReport, err error) {
	benchTenant(cfg, o.tenant)
	a := app.New(cfg, g.logger(cfg))
	if err := a.StartTools(ctx, app.ReadPath); err != nil {
		return rep, err
	}
	defer a.Close()
	if err := prepareBenchTenant(ctx, a, o.tenant); err != nil {
		return rep, err
	}
	db, err := a.Pools().DB(ctx, o.tenant)
	if err != nil {
		return rep, err
	}
	drop := func() error {
		return dropBenchTenant(ctx, a, db, o.tenant)
	}
	defer func() { err = errors.Join(err, drop()) }()
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return rep, err
	}
	t, _, err := a.Catalog().Table(ctx, o.tenant, now)
	if err != nil {
		return rep, err
	}
	svc := a.NewInbox()
	defer svc.Close()
	p := &bench.InboxParams{
		Unread: func(ctx context.Context, pr httpapi.Principal) error {
			_, err := svc.Unread(ctx, pr)
			return err
		},
		List: func(ctx context.Context, pr httpapi.Principal) error {
			_, err := svc.Topics(ctx, pr, inbox.DefaultTopicsLimit, "")
			return err
		},
		MarkRead: func(ctx context.Context, pr httpapi.Principal, topic string, seq int64) error {
			_, err := svc.MarkRead(ctx, pr, topic, seq)
			return err
		},
		NotHidden: readpath.NotHidden, Reader: a.Reader(), Redis: a.Redis(), KeySpace: a.KeySpace(), Cold: o.cold, DB: db, Tenant: o.tenant, Table: t, Users: o.users, Topics: o.topics,
		MinPer: o.minPer, MaxPer: o.maxPer, HeavyUsers: o.heavy, Messages: o.messages, Concurrency: o.concurrency,
		Duration: o.duration, Warmup: o.warmup, Progress: g.stderr}
	start := time.Now()
	rows, err := p.Build(ctx)
	if err != nil {
		return rep, err
	}
	fmt.Fprintf(g.stderr, "bench: fixture of %d memberships built in %s\n", rows, time.Since(start).Round(time.Second))
	rep = p.Measure(ctx)
	rep.Rows = rows
	return rep, nil
}

func printBenchInbox(w io.Writer, o *benchInboxOptions, rep bench.InboxReport) {
	fmt.Fprintf(w, "inbox bench: users=%d topics=%d per-user=%d..%d heavy=%d messages/topic=%d memberships=%d concurrency=%d duration=%s cold=%v gomaxprocs=%d\n",
		o.users, o.topics, o.minPer, o.maxPer, o.heavy, o.messages, rep.Rows, o.concurrency, o.duration, o.cold, runtime.GOMAXPROCS(0))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tcalls\terrors\trate/s\tp50\tp99")
	for _, r := range []bench.QueryResult{rep.Unread, rep.RawUnread, rep.List, rep.RawList, rep.Read, rep.Moved} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\n", r.Name, r.Count, r.Errors, r.Rate(),
			r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	_ = tw.Flush()
	bar := func(name string, a, b bench.QueryResult, abs time.Duration) {
		if b.P99 <= 0 {
			return
		}
		r := float64(a.P99) / float64(b.P99)
		fmt.Fprintf(w, "%-40s %6.2f ms, %5.2f x raw (bar <= %s and <= 0.5 x: %s)\n", name+" p99",
			float64(a.P99.Microseconds())/1000, r, abs, verdict(r <= 0.5 && a.P99 <= abs))
	}
	bar(rep.Unread.Name, rep.Unread, rep.RawUnread, 10*time.Millisecond)
	bar(rep.List.Name, rep.List, rep.RawList, 20*time.Millisecond)
}
