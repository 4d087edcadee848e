package cmd

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/localsrv"
	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	imsql "github.com/imshard/imshard/sql"
)

type benchMoveOptions struct {
	rows, topics, months, chunkRows int
	sendRate, readRate              float64
	warmup, baseline, tail          time.Duration
	to, other                       string
	benchFlags
}

func newBenchMoveCmd(g *globals) *cobra.Command {
	o := &benchMoveOptions{}
	c := &cobra.Command{
		Use:     "move",
		Short:   "A live tenant move under a steady send and read load, another tenant beside it; copy beside a raw streamed copy",
		Example: "  imshard bench move\n  imshard bench move --to='root@tcp(db2:3306)/imshard_bench_move' --rows=200000 --topics=200",
		Long: "Builds a tenant of its own (--rows messages over --topics topics and --months month tables ending with\n" +
			"the current one) and a second tenant beside it, starts the send, persist and query roles in this process\n" +
			"and a steady open-loop load: --send-rate sends/s to each tenant, --read-rate pages/s of the moving one.\n" +
			"After --warmup it measures the other tenant's sends for --baseline without a move, copies the moving\n" +
			"tenant's tables to the target server raw (one SELECT streamed into 200-row INSERTs, a transaction every\n" +
			"--chunk-rows rows, one connection each side: MySQL has no INSERT … SELECT between two servers), then\n" +
			"moves the tenant there with `imshard tenant move --yes` in a process of its own, as an operator runs it\n" +
			"(continued by `tenant move resume` if it fails; `tenant move status` logged every 15 s), and keeps the\n" +
			"load on for --tail.\n" +
			"Without --to it starts a private mariadbd on a temporary port and data directory as the target and\n" +
			"stops it at the end. It reports each figure beside its bar; both tenants' databases (source and\n" +
			"target copies), placement record and Redis keys are dropped afterwards.",
		Args: cobra.NoArgs,
	}
	c.Flags().IntVar(&o.rows, "rows", 1_000_000, "messages of the moving tenant")
	c.Flags().IntVar(&o.topics, "topics", 1000, "topics of the moving tenant")
	c.Flags().IntVar(&o.months, "months", 3, "month tables the rows are spread over, ending with the current one (at least 2)")
	c.Flags().IntVar(&o.chunkRows, "chunk-rows", 2000, "rows per chunk of the move (and per transaction of the raw copy)")
	c.Flags().Float64Var(&o.sendRate, "send-rate", 100, "sends per second to each tenant")
	c.Flags().Float64Var(&o.readRate, "read-rate", 100, "pages per second read from the moving tenant")
	c.Flags().DurationVar(&o.warmup, "warmup", 5*time.Second, "unmeasured load before the baseline")
	c.Flags().DurationVar(&o.baseline, "baseline", 20*time.Second, "the other tenant's sends measured without a move")
	c.Flags().DurationVar(&o.tail, "tail", 3*time.Second, "load kept on after the move")
	c.Flags().StringVar(&o.to, "to", "", "the target database's DSN on another server (default: a private mariadbd started and stopped here)")
	o.tenantFlag(c, "bench_move", "the moving tenant (the benchmark's own: dropped afterwards)")
	c.Flags().StringVar(&o.other, "other", "bench_move_other", "the tenant beside it (the benchmark's own: dropped afterwards)")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.rows < 1 || o.topics < 1 || o.topics > 1024 || o.months < 2 || o.months > 120 || o.chunkRows < 1 ||
			o.sendRate <= 0 || o.readRate < 0 || o.warmup < 0 || o.baseline <= 0 || o.tail < 0 {
			return usagef("--rows, --chunk-rows, --send-rate and --baseline must be positive, --topics 1..1024, --months 2..120")
		}
		if err := routing.ValidTenant(o.other); err != nil {
			return usagef("--other: %v", err)
		}
		if o.tenant == o.other {
			return usagef("--tenant and --other must differ")
		}
		// the fixture's shape, checked before any server starts
		shape := bench.QueryParams{Rows: o.rows, Topics: o.topics, Tables: make([]routing.Table, o.months)}
		if err := shape.Check(); err != nil {
			return usagef("%v", err)
		}
		return runBench(g, &o.benchFlags, func(ctx context.Context, cfg *config.Config) (bench.MoveReport, error) {
			return runBenchMove(ctx, cfg, o, g)
		}, func(w io.Writer, rep bench.MoveReport) { printBenchMove(w, o, rep) })
	}
	return c
}

// runBenchMove starts the target (unless --to), Kafka (unless
// configured) and the roles, builds both tenants and runs bench.Move;
// whatever it built is dropped on the way out.
func runBenchMove(ctx context.Context, cfg *config.Config, o *benchMoveOptions, g *globals) (rep bench.MoveReport, err error) {
	secret := benchTenant(cfg, o.tenant)
	otherSecret := benchTenant(cfg, o.other)
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain
	stopKafka, err := benchKafka(&cfg.Kafka)
	if err != nil {
		return rep, err
	}
	defer stopKafka()
	tlsCfg, err := cfg.MySQL.TLS.Client("mysql.tls")
	if err != nil {
		return rep, err
	}
	// the private target starts first and stops last: the roles hold
	// connections to it until they stop
	var srv *localsrv.MariaDB
	if o.to == "" {
		var stop func()
		if srv, stop, err = startTargetServer(g.stderr); err != nil {
			return rep, err
		}
		defer stop()
	}
	a := app.New(cfg, g.logger(cfg))
	if err := a.Start(ctx, []string{app.Send, app.Persist, app.Query}); err != nil {
		return rep, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	at, err := a.Pools().Placement(o.tenant)
	if err != nil {
		return rep, err
	}
	to := o.to
	if srv != nil {
		if to, err = onServer(at.DSN, srv.Addr); err != nil {
			return rep, err
		}
	}
	// everything below is dropped whatever happens; the roles still run
	defer func() { err = errors.Join(err, dropMoveBench(ctx, a, o, at.DSN, to, tlsCfg)) }()

	for _, t := range []string{o.tenant, o.other} {
		if err := prepareBenchTenant(ctx, a, t); err != nil {
			return rep, err
		}
	}
	fixture, err := moveFixture(ctx, a, o, g.stderr)
	if err != nil {
		return rep, err
	}
	fmt.Fprintf(g.stderr, "bench: fixture of %d rows …\n", o.rows)
	if err := fixture.Build(ctx); err != nil {
		return rep, err
	}
	other, err := otherTenant(ctx, a, o.other, otherSecret)
	if err != nil {
		return rep, err
	}
	token, err := httpapi.Sign([]byte(secret), o.tenant, 1, "", 24*time.Hour)
	if err != nil {
		return rep, err
	}
	src, _, err := move.OpenDB(at.DSN, tlsCfg, true)
	if err != nil {
		return rep, err
	}
	defer src.Close()
	raw, err := openRawTarget(ctx, to, tlsCfg)
	if err != nil {
		return rep, err
	}
	defer raw.Close()
	return bench.Move(ctx, bench.MoveParams{
		BaseURL: "http://" + a.APIAddr(), Moving: fixture.Load(token), Other: other,
		SendRate: o.sendRate, ReadRate: o.readRate, Warmup: o.warmup, Baseline: o.baseline, Tail: o.tail,
		Source: src, Tables: move.CopiedTables, RawTarget: raw, ChunkRows: o.chunkRows,
		Move: (&moverProcess{g: g, tenant: o.tenant, secret: secret, to: to, chunkRows: o.chunkRows}).run,
		Epoch: func() (int64, error) {
			p, err := a.Pools().Placement(o.tenant)
			return p.Epoch, err
		},
		DB:       func(ctx context.Context) (*sql.DB, error) { return a.Pools().DB(ctx, o.tenant) },
		Current:  fixture.Tables[len(fixture.Tables)-1],
		Progress: g.stderr,
	})
}

// moveFixture is the moving tenant's fixture: the query bench's months
// without its legacy table.
func moveFixture(ctx context.Context, a *app.App, o *benchMoveOptions, progress io.Writer) (*bench.QueryParams, error) {
	now, err := routing.NewClock(a.Redis()).Month(ctx)
	if err != nil {
		return nil, err
	}
	from := now.Add(1 - o.months)
	if res := a.NewShardManager().SyncTenant(ctx, o.tenant, shardmgr.Options{MonthsAhead: -1, From: from}); res.Err != nil {
		return nil, fmt.Errorf("bench: shard ensure --from=%s: %w", from, res.Err)
	}
	a.Catalog().Invalidate(o.tenant)
	p := &bench.QueryParams{Reader: a.Reader(), Routes: a.Routes(), Groups: a.ACL(), Redis: a.Redis(), KeySpace: a.KeySpace(),
		Tenant: o.tenant, Topics: o.topics, Rows: o.rows, MonthsOnly: true, Progress: progress}
	for _, m := range routing.Range(from, now) {
		t, _, err := a.Catalog().Table(ctx, o.tenant, m)
		if err != nil {
			return nil, err
		}
		p.Tables = append(p.Tables, t)
	}
	p.DB, err = a.Pools().DB(ctx, o.tenant)
	return p, err
}

// otherTenant makes the tenant beside the move a few topics with user 1 a
// member of each.
func otherTenant(ctx context.Context, a *app.App, tenant, secret string) (bench.MoveTenant, error) {
	token, err := httpapi.Sign([]byte(secret), tenant, 1, "", 24*time.Hour)
	t := bench.MoveTenant{Tenant: tenant, Token: token}
	for i := range 10 {
		topic := fmt.Sprintf("other%02d", i)
		if err == nil {
			err = a.ACL().PutGroup(ctx, tenant, topic, int64(i+1), topic, "active")
		}
		if err == nil {
			err = a.ACL().PutMember(ctx, tenant, topic, 1, "member", nil)
		}
		t.SendTopics = append(t.SendTopics, topic)
	}
	return t, err
}

// startTargetServer starts the private mariadbd the tenant moves to; stop
// shuts it down and removes its data.
func startTargetServer(progress io.Writer) (*localsrv.MariaDB, func(), error) {
	dir, err := os.MkdirTemp("", "ims")
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(progress, "bench: starting a private mariadbd in %s …\n", dir)
	srv, err := localsrv.StartMariaDB(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	fmt.Fprintf(progress, "bench: target server %s\n", srv.Addr)
	return srv, func() {
		if err := srv.Proc.Stop(syscall.SIGTERM, time.Minute); err != nil {
			fmt.Fprintf(progress, "bench: %v\n", err)
		}
		_ = os.RemoveAll(dir)
	}, nil
}

// onServer is the DSN of dsn's database on the private server at addr
// (root, no password, no TLS).
func onServer(dsn, addr string) (string, error) {
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	c.User, c.Passwd, c.Net, c.Addr, c.TLSConfig, c.TLS = "root", "", "tcp", addr, "", nil
	return c.FormatDSN(), nil
}

// openRawTarget creates the raw copy's database on the target server (the
// target database's name with _raw) and opens it.
func openRawTarget(ctx context.Context, to string, tlsCfg *tls.Config) (*sql.DB, error) {
	c, err := mysql.ParseDSN(to)
	if err != nil {
		return nil, err
	}
	c.DBName += "_raw"
	dsn := c.FormatDSN()
	server, _, err := move.OpenDB(dsn, tlsCfg, false)
	if err != nil {
		return nil, err
	}
	defer server.Close()
	if _, err := server.ExecContext(ctx, strings.Replace(imsql.CreateDatabase(), imsql.DatabasePlaceholder, "`"+c.DBName+"`", 1)); err != nil {
		return nil, fmt.Errorf("bench: create the raw copy's database: %w", err)
	}
	db, _, err := move.OpenDB(dsn, tlsCfg, true)
	return db, err
}

// dropMoveBench drops what the bench built: the moving tenant's database
// on both servers and the raw copy's, the other tenant's, their Redis keys
// and the moving tenant's placement record and move note.
func dropMoveBench(ctx context.Context, a *app.App, o *benchMoveOptions, from, to string, tlsCfg *tls.Config) error {
	ctx = context.WithoutCancel(ctx)
	drop := func(name string) string {
		return strings.Replace(imsql.DropDatabase(), imsql.DatabasePlaceholder, name, 1)
	}
	var errs []error
	dsns := []string{from, to}
	if raw, err := mysql.ParseDSN(to); err == nil {
		raw.DBName += "_raw"
		dsns = append(dsns, raw.FormatDSN())
	}
	for _, dsn := range dsns {
		db, _, err := move.OpenDB(dsn, tlsCfg, true)
		if err == nil {
			err = bench.DropFixtures(ctx, db, drop)
			db.Close()
		}
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1049 { // unknown database: never made
			err = nil
		}
		errs = append(errs, err)
	}
	errs = append(errs, a.PlacementStore().Delete(ctx, o.tenant))
	for _, t := range []string{o.tenant, o.other} {
		errs = append(errs, a.KeySpace().DropTenantKeys(ctx, a.Redis(), t))
	}
	other, err := a.Pools().DB(ctx, o.other)
	if err == nil {
		err = bench.DropFixtures(ctx, other, drop)
	}
	return errors.Join(append(errs, err)...)
}

func printBenchMove(w io.Writer, o *benchMoveOptions, rep bench.MoveReport) {
	fmt.Fprintf(w, "move bench: %d rows, %d topics, %d months; %.0f sends/s to each tenant, %.0f reads/s; chunk %d rows; GOMAXPROCS=%d\n",
		o.rows, o.topics, o.months, o.sendRate, o.readRate, o.chunkRows, runtime.GOMAXPROCS(0))
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	failed := func(l bench.OpLog) string {
		if l.Failed == 0 {
			return ""
		}
		return " (first: " + l.FirstErr + ")"
	}
	fmt.Fprintf(w, "%-44s %d of %d%s (bar 0: %s)\n", "moving tenant: failed sends", rep.Sends.Failed, rep.Sends.Ops, failed(rep.Sends), verdict(rep.Sends.Failed == 0))
	fmt.Fprintf(w, "%-44s %d of %d%s (bar 0: %s)\n", "moving tenant: failed reads", rep.Reads.Failed, rep.Reads.Ops, failed(rep.Reads), verdict(rep.Reads.Failed == 0))
	fmt.Fprintf(w, "%-44s %d accepted, %d rows, %d distinct on the target (%s)\n", "moving tenant: sends stored exactly once",
		rep.Accepted, rep.Stored, rep.Distinct, verdict(rep.Stored == rep.Accepted && rep.Distinct == rep.Accepted))
	fmt.Fprintf(w, "%-44s %s (bar <= 2 s: %s; the move recorded a switch of %d ms)\n", "persistence paused (fence → roles follow)",
		ms(rep.Pause), verdict(rep.Pause <= 2*time.Second), rep.Switch.MS)
	fmt.Fprintf(w, "%-44s %s (bar <= 2 s: %s; the same window: changes are refused from the fence until the roles follow)\n",
		"changes held", ms(rep.Pause), verdict(rep.Pause <= 2*time.Second))
	fmt.Fprintf(w, "%-44s verification before the fence %s; behind it %s (%d marked rows copied and verified, %d unverified chunks compared, %d of them copied); move %v in all\n",
		"the switch's parts", ms(rep.Verify), ms(rep.Fenced), rep.Switch.FencedKeys, rep.Switch.Compared, rep.Switch.Chunks, rep.Move.Round(time.Millisecond))
	ratio := 0.0
	if rep.OtherIdle.P99 > 0 {
		ratio = float64(rep.OtherMoving.P99) / float64(rep.OtherIdle.P99)
	}
	fmt.Fprintf(w, "%-44s %s without a move (%d sends, %d failed), %s during it (%d, %d failed): %.2f x (bar <= 1.10: %s)\n",
		"other tenant: send p99", ms(rep.OtherIdle.P99), rep.OtherIdle.Ops, rep.OtherIdle.Failed, ms(rep.OtherMoving.P99),
		rep.OtherMoving.Ops, rep.OtherMoving.Failed, ratio, verdict(ratio <= 1.1))
	copyRatio := 0.0
	if rep.RawRate() > 0 {
		copyRatio = rep.CopyRate() / rep.RawRate()
	}
	fmt.Fprintf(w, "%-44s %.0f rows/s (%d rows in %v) beside the raw streamed copy's %.0f rows/s (%d rows in %v): %.2f x (bar >= 0.50: %s)\n",
		"copy", rep.CopyRate(), rep.Rows, rep.Copy.Round(time.Millisecond), rep.RawRate(), rep.RawRows, rep.Raw.Round(time.Millisecond),
		copyRatio, verdict(copyRatio >= 0.5))
	fmt.Fprintf(w, "%-44s %.0f rows/s over all the move's time on it (%d rows in %v: the copy step's wait for its proofs of the tables nobody wrote %v, the verify step %v) (bar >= 200000: %s); the verify step alone %.0f rows/s; the proofs ran beside the copy over %v\n",
		"verification", rep.VerifyRate(), rep.VerifyRows, (rep.Proofs + rep.Verify).Round(time.Millisecond), rep.Proofs.Round(time.Millisecond),
		rep.Verify.Round(time.Millisecond), verdict(rep.VerifyRate() >= 200_000), rep.StepVerifyRate(), rep.ProofSpan.Round(time.Millisecond))
}
