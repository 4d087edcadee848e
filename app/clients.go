package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"golang.org/x/sync/errgroup"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/changes"
	"github.com/imshard/imshard/modules/migrate"
	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/ratelimit"
	"github.com/imshard/imshard/modules/retention"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/modules/tenantdb"
)

// clients are the shared objects init functions build for later modules.
type clients struct {
	pools     *tenantdb.Pools
	redis     rueidis.Client
	keys      routing.KeySpace // redis.key_prefix: every key and channel is named in it
	kafka     []kgo.Opt        // KafkaOpts of the brokers in use
	scripts   *routing.Scripts
	rmetrics  *routing.Metrics
	catalog   *routing.Catalog
	alloc     *routing.Allocator
	flight    *routing.Flight
	routes    *routing.Routes
	acl       *acl.Checker
	shards    *shardmgr.Manager
	retention *retention.Retention
	changes   *changes.Service
	archiver  *archive.Archiver
	cold      *archive.Cold
	migs      *routing.Migrations
	migrator  *migrate.Migrator
	limits    *ratelimit.Limiter
	// placed reads the placement records; placement re-points pools by them
	placed    *placement.Store
	placement *placement.Watcher
}

// holder is the Service of a module that is only a client: nothing to run,
// something to close, something /readyz checks.
type holder struct {
	close func() error
	ready func(ctx context.Context) error
}

func (h holder) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (h holder) Stop(context.Context) error {
	if h.close == nil {
		return nil
	}
	return h.close()
}
func (h holder) Ready(ctx context.Context) error {
	if h.ready == nil {
		return nil
	}
	return h.ready(ctx)
}

// runner is the Service of a module that is one loop.
type runner struct {
	run  func(ctx context.Context) error
	stop func(ctx context.Context) error
}

func (r runner) Run(ctx context.Context) error { return r.run(ctx) }
func (r runner) Stop(ctx context.Context) error {
	if r.stop == nil {
		return nil
	}
	return r.stop(ctx)
}

// inits builds each module. Each reads only what its dependencies built.
var inits = map[string]func(ctx context.Context, a *App) (Service, error){
	Ops:      initOps,
	MySQL:    initMySQL,
	Redis:    initRedis,
	Kafka:    initKafka,
	Routing:  initRouting,
	Keys:     initKeys,
	ShardMgr: initShardMgr,
	Send:     initSend,
	Changes:  initChanges,
	Persist:  initPersist,
	ReadPath: initReadPath,
	Query:    initQuery,
	Inbox:    initInbox,
	Stream:   initStream,
	Migrate:  initMigrate,
	Relay:    initRelay,
	API:      initAPI,
	All:      func(context.Context, *App) (Service, error) { return holder{}, nil },
}

// Tenants converts the configured tenants for the pools (DSN resolved).
func Tenants(cfg *config.Config) []tenantdb.Tenant {
	out := make([]tenantdb.Tenant, 0, len(cfg.Tenants))
	for _, t := range cfg.Tenants {
		out = append(out, tenantdb.Tenant{ID: t.ID, DSN: cfg.TenantDSN(t)})
	}
	return out
}

func initMySQL(ctx context.Context, a *App) (Service, error) {
	c := a.Config.MySQL
	tlsCfg, err := c.TLS.Client("mysql.tls")
	if err != nil {
		return nil, err
	}
	a.clients.pools = tenantdb.New(tenantdb.Params{
		TLS:             tlsCfg,
		MaxOpenConns:    c.MaxOpenConns,
		MaxIdleConns:    c.MaxIdleConns,
		ConnMaxIdleTime: c.ConnMaxIdleTime,
		MaxOpenTenants:  c.MaxOpenTenants,
		ReadOnly:        a.ReadOnly,
		Log:             a.Log,
		Registerer:      a.Registry,
	}, Tenants(a.Config))
	pools := a.clients.pools
	// One connection at start, so that a certificate or a password the server
	// refuses stops the start with its reason; a server that is not up yet is
	// left to readiness and the pools, which open on first use.
	if ids := pools.IDs(); len(ids) > 0 {
		if err := pools.Reach(ctx, ids[0]); err != nil {
			if mysqlRejected(err) {
				return nil, fmt.Errorf("mysql refused the connection (check the DSN's user and password, and mysql.tls): %w", err)
			}
			a.Log.Warn().Err(err).Msg("mysql not reachable yet; tenant pools open on first use")
		}
	}
	if err := initPlacement(ctx, a, tlsCfg); err != nil {
		return nil, err
	}
	watcher, store := a.clients.placement, a.clients.placed
	return following{run: watcher.Run, holder: holder{close: func() error {
		return errors.Join(pools.Close(), store.Close())
	}, ready: func(ctx context.Context) error {
		ids := pools.IDs()
		if len(ids) == 0 {
			return errors.New("no tenant configured")
		}
		// opening the first tenant proves the server answers even before
		// any traffic opened a pool; then every open pool must answer
		if _, err := pools.DB(ctx, ids[0]); err != nil {
			return err
		}
		return pools.Ping(ctx)
	}}}, nil
}

// NewRedis builds the Redis client: several addrs mean Redis Cluster, one
// "unix:/path" a server on this machine reached through its Unix socket.
// It connects before returning, so a wrong password or certificate fails here.
func NewRedis(c config.Redis) (rueidis.Client, error) {
	tlsCfg, err := c.TLS.Client("redis.tls")
	if err != nil {
		return nil, err
	}
	opt := rueidis.ClientOption{
		InitAddress:  c.Addrs,
		Username:     c.Username,
		Password:     c.Password,
		TLSConfig:    tlsCfg,
		Dialer:       net.Dialer{Timeout: c.DialTimeout},
		DisableCache: true,
		ShuffleInit:  true,
	}
	if len(c.Addrs) == 1 {
		if path, ok := config.RedisSocket(c.Addrs[0]); ok {
			opt.InitAddress = []string{path}
			opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return d.DialContext(ctx, "unix", addr)
			}
		}
	}
	return rueidis.NewClient(opt)
}

func initRedis(ctx context.Context, a *App) (Service, error) {
	keys, err := routing.NewKeySpace(a.Config.Redis.KeyPrefix)
	if err != nil {
		return nil, err
	}
	rdb, err := NewRedis(a.Config.Redis)
	if err != nil {
		return nil, fmt.Errorf("redis %v: %w", a.Config.Redis.Addrs, err)
	}
	a.clients.redis, a.clients.keys = rdb, keys
	return holder{
		close: func() error { rdb.Close(); return nil },
		ready: func(ctx context.Context) error { return rdb.Do(ctx, rdb.B().Ping().Build()).Error() },
	}, nil
}

func initKafka(ctx context.Context, a *App) (Service, error) {
	k := a.Config.Kafka
	var cluster *kfake.Cluster
	if len(k.Brokers) == 0 {
		if _, err := os.Stat(k.DataDir); a.ReadOnly && k.DataDir != "" && err != nil {
			return nil, fmt.Errorf("kafka.brokers is empty and kafka.data_dir %s does not exist: no in-process Kafka log to read", k.DataDir)
		}
		var err error
		cluster, k, err = StartPrivateKafka(k)
		if err != nil {
			return nil, err
		}
		a.Log.Warn().Strs("brokers", k.Brokers).Str("data_dir", k.DataDir).
			Msg("kafka.brokers is empty: started the in-process kfake cluster (single-process use only; it requires a SASL secret drawn at this start)")
	}
	fail := func(err error) (Service, error) {
		if cluster != nil {
			cluster.Close()
		}
		return nil, err
	}
	conn, err := KafkaOpts(k)
	if err != nil {
		return fail(err)
	}
	admin, err := kgo.NewClient(conn...)
	if err != nil {
		return fail(err)
	}
	if err := checkKafka(ctx, admin, k); err != nil {
		admin.Close()
		return fail(err)
	}
	if !a.ReadOnly {
		if err := EnsureTopics(ctx, admin, k); err != nil {
			admin.Close()
			return fail(err)
		}
	}
	a.clients.kafka = conn
	return holder{
		close: func() error {
			admin.Close()
			if cluster != nil {
				cluster.Close()
			}
			return nil
		},
		ready: func(ctx context.Context) error { return admin.Ping(ctx) },
	}, nil
}

// KafkaOpts are the connection options every Kafka client of the service
// starts from: the seed brokers, TLS and SASL of k.
func KafkaOpts(k config.Kafka) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	tlsCfg, err := k.TLS.Client("kafka.tls")
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	s := k.SASL
	switch s.Mechanism {
	case "":
	case config.SASLPlain:
		opts = append(opts, kgo.SASL(plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()))
	case config.SASLScramSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()))
	case config.SASLScramSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()))
	default:
		return nil, &config.KeyError{Key: "kafka.sasl.mechanism", Msg: fmt.Sprintf("unsupported %q", s.Mechanism)}
	}
	return opts, nil
}

// checkKafka makes one attempt to reach a broker, so that a certificate or a
// credential the brokers refuse stops the start at once with its reason,
// rather than being retried until a timeout hides it. A broker that is merely
// not up yet (refused, timed out) is left to the retries of what follows.
func checkKafka(ctx context.Context, cl *kgo.Client, k config.Kafka) error {
	err := cl.Ping(ctx)
	if err == nil || !kafkaRejected(err, k) {
		return nil
	}
	return fmt.Errorf("kafka %v refused the connection (check kafka.tls and kafka.sasl): %w", k.Brokers, err)
}

// tlsRejected tells a TLS handshake that failed for good: a certificate not
// trusted, or TLS spoken on one side only.
func tlsRejected(err error) bool {
	var (
		verify *tls.CertificateVerificationError
		alert  tls.AlertError
		header tls.RecordHeaderError
	)
	return errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &header)
}

// mysqlRejected tells errors no retry can cure: TLS, or the server refusing
// the account (wrong password, or a user that requires TLS connecting
// without it).
func mysqlRejected(err error) bool {
	var me *mysql.MySQLError
	return tlsRejected(err) || errors.Is(err, mysql.ErrNoTLS) || errors.As(err, &me) && me.Number == 1045
}

// kafkaRejected tells errors no retry can cure.
func kafkaRejected(err error, k config.Kafka) bool {
	var first *kgo.ErrFirstReadEOF
	switch {
	case tlsRejected(err), errors.As(err, &first):
		return true
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return true
	case k.SASL.Mechanism != "" && errors.Is(err, io.EOF):
		return true // some brokers drop a client that failed to authenticate without an answer
	}
	return false
}

// privateKafkaUser is the SASL user of the in-process Kafka of one process.
const privateKafkaUser = "imshard"

// StartPrivateKafka starts the in-process Kafka of a single process (log in
// k.DataDir, the service's topics seeded) and returns k pointed at it. Its
// loopback port is reachable by any local process, so it accepts only the
// SCRAM user whose password is drawn here, at each start, and held only in
// memory by the returned k: no other process can produce into a tenant's
// topic under a sender of its choosing.
func StartPrivateKafka(k config.Kafka) (*kfake.Cluster, config.Kafka, error) {
	k.SASL = config.SASL{Mechanism: config.SASLScramSHA256, Username: privateKafkaUser, Password: rand.Text()}
	c, err := startKafka(k, "", nil)
	if err != nil {
		return nil, k, err
	}
	k.Brokers = c.ListenAddrs()
	return c, k, nil
}

// startKafka starts the kfake stand-in with its log in k.DataDir and the
// service's topics seeded; with k.SASL set it accepts only that user. addr
// "" listens on a random loopback port; every listener on addr is passed
// through wrap (when both are set).
func startKafka(k config.Kafka, addr string, wrap func(net.Listener) net.Listener) (*kfake.Cluster, error) {
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(int32(k.Partitions), k.Topic, k.DLQTopic, k.ChangesTopic),
		kfake.DefaultNumPartitions(k.Partitions),
	}
	if k.DataDir != "" {
		if err := os.MkdirAll(k.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("kafka.data_dir: %w", err)
		}
		// kfake restores the SASL users of the previous start from the log
		// directory in place of those configured now: the credentials in
		// force are always this start's.
		if err := os.Remove(filepath.Join(k.DataDir, kfakeSASLFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("kafka.data_dir: %w", err)
		}
		opts = append(opts, kfake.DataDir(k.DataDir))
	}
	if s := k.SASL; s.Mechanism != "" {
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(s.Mechanism, s.Username, s.Password))
	}
	if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("kafka addr %q: %w", addr, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("kafka addr %q: bad port", addr)
		}
		opts = append(opts, kfake.Ports(p), kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			ln, err := net.Listen(network, net.JoinHostPort(host, port))
			if err != nil || wrap == nil {
				return ln, err
			}
			return wrap(ln), nil
		}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start in-process kafka: %w", err)
	}
	return c, nil
}

// kfakeSASLFile is where kfake keeps its SASL users in its log directory.
const kfakeSASLFile = "sasl.json"

// EnsureTopics creates the message, dead-letter and change feed topics if
// missing. The change feed has as many partitions as the message topic and
// the same keys, so a topic's messages and changes share a partition
// number.
func EnsureTopics(ctx context.Context, cl *kgo.Client, k config.Kafka) error {
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopics(ctx, int32(k.Partitions), int16(k.ReplicationFactor), nil, k.Topic, k.DLQTopic, k.ChangesTopic)
	if err != nil {
		return fmt.Errorf("kafka: create topics: %w", err)
	}
	for _, r := range resp.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafka: create topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

func initRouting(ctx context.Context, a *App) (Service, error) {
	c := &a.clients
	c.scripts = routing.NewScripts()
	c.rmetrics = routing.NewMetrics(a.Registry)
	c.rmetrics.ExportTenants(c.pools.IDs())
	c.catalog = routing.NewCatalog(c.pools, routing.CatalogTTL)
	c.alloc = routing.NewAllocator(routing.AllocatorParams{
		Redis:       c.redis,
		KeySpace:    c.keys,
		DBs:         c.pools,
		Catalog:     c.catalog,
		Scripts:     c.scripts,
		Metrics:     c.rmetrics,
		Log:         a.Log.With().Str("module", Routing).Logger(),
		AutoAdvance: a.Config.Shard.AutoAdvance,
		ReserveStep: a.Config.Send.SeqReserveStep,
	})
	c.flight = routing.NewFlight(c.redis, c.keys, c.scripts, c.pools, a.Config.Send.ProduceTimeout, c.rmetrics)
	c.routes = routing.NewRoutes(c.redis, c.keys, c.scripts)
	c.acl = acl.New(acl.Params{Redis: c.redis, KeySpace: c.keys, Scripts: c.scripts, DBs: c.pools, TTL: a.Config.Send.ACLCacheTTL, Log: a.Log.With().Str("module", "acl").Logger()})
	c.migs = routing.NewMigrations(c.pools, c.redis, c.keys, c.scripts, a.Log.With().Str("module", Routing).Logger())
	c.limits = ratelimit.New(a.tenants.limitsOf, a.Registry)
	c.limits.ExportTenants(c.pools.IDs())
	alloc, migs := c.alloc, c.migs
	// the loop keeps every process's view of migration states fresh
	return runner{
		run:  func(ctx context.Context) error { migs.Run(ctx); return nil },
		stop: func(context.Context) error { alloc.Close(); return nil },
	}, nil
}

// NewShardManager builds the shard manager from the shared clients; the
// `shard` commands use it without running the patrol.
func (a *App) NewShardManager() *shardmgr.Manager {
	c := &a.clients
	if c.shards != nil {
		return c.shards
	}
	s := a.Config.Shard
	c.shards = shardmgr.New(shardmgr.Params{
		Config: shardmgr.Config{
			MonthsAhead:    s.MonthsAhead,
			SealingDays:    s.SealingDays,
			PatrolInterval: s.PatrolInterval,
			AutoAdvance:    s.AutoAdvance,
			LockTTL:        s.LockTTL,
			ProduceTimeout: a.Config.Send.ProduceTimeout,
		},
		Tenants:    c.pools.IDs,
		DBs:        c.pools,
		Redis:      c.redis,
		KeySpace:   c.keys,
		Catalog:    c.catalog,
		Allocator:  c.alloc,
		Scripts:    c.scripts,
		Metrics:    c.rmetrics,
		Log:        a.Log.With().Str("module", ShardMgr).Logger(),
		Registerer: a.Registry,
		Retention:  a.Retention(),
		Archive:    a.NewArchiver(),
		Moving: func(ctx context.Context, tenant string) (bool, error) {
			db, err := c.pools.DB(ctx, tenant)
			if err != nil {
				return false, err
			}
			return move.Moving(ctx, db)
		},
	})
	return c.shards
}

// Retention builds the retention runner from the shared clients; the
// patrol and `imshard retention` use it.
func (a *App) Retention() *retention.Retention {
	c := &a.clients
	if c.retention != nil {
		return c.retention
	}
	c.retention = retention.New(retention.Params{
		DBs:      c.pools,
		Redis:    c.redis,
		KeySpace: c.keys,
		Scripts:  c.scripts,
		Catalog:  c.catalog,
		Months:   a.tenants.retentionOf,
		LockTTL:  a.Config.Shard.LockTTL,
		// a user erase deletes its batches of messages as delete-for-everyone
		// does one; only the job loop calls it, in a process that runs the
		// read path
		Erase: func(ctx context.Context, tenant string, m routing.Month, refs []routing.MessageRef, scan *routing.ArchiveScan, reason string,
			before func(tx *sql.Tx, messages, revisions int64) error) (int64, int64, error) {
			return a.NewChanges().EraseMessages(ctx, tenant, m, refs, scan, reason, before)
		},
		DropArchive: func(ctx context.Context, tenant string, m routing.Month) error {
			return a.NewArchiver().Remove(ctx, tenant, m)
		},
		ArchivedSentBy: func(ctx context.Context, tenant string, m routing.Month, user int64) ([]routing.ArchivedRow, error) {
			return a.NewColdReader().SentBy(ctx, tenant, m, user)
		},
		Log:        a.Log.With().Str("module", "retention").Logger(),
		Registerer: a.Registry,
	})
	return c.retention
}

func initShardMgr(ctx context.Context, a *App) (Service, error) {
	mg := a.NewShardManager()
	mg.ExportTenants(a.clients.pools.IDs())
	a.Retention().ExportTenants(a.clients.pools.IDs())
	a.NewArchiver().ExportTenants(a.clients.pools.IDs())
	a.onTenantsAdded(func(tenants []string) { mg.Reconcile(tenants...) })
	a.onTenantsAdded(a.Retention().ExportTenants)
	a.onTenantsAdded(a.NewArchiver().ExportTenants)
	ret, tenants, lease := a.Retention(), a.clients.pools.IDs, a.Config.Shard.LockTTL
	moves := move.NewWatch(move.WatchParams{Tenants: a.clients.pools.IDs, Moving: a.clients.placed.Moving, DBs: a.clients.pools,
		Log: a.Log.With().Str("module", "move").Logger(), Registerer: a.Registry})
	// the patrol, the job loop (group purges, user erases) and the move
	// watch run side by side until the context ends
	return runner{run: func(ctx context.Context) error {
		var g errgroup.Group
		g.Go(func() error { return mg.Run(ctx) })
		g.Go(func() error { return moves.Run(ctx) })
		g.Go(func() error { _ = ret.RunJobLoop(ctx, tenants, lease); return nil })
		return g.Wait()
	}}, nil
}

func initOps(ctx context.Context, a *App) (Service, error) {
	// probes and scrapes must get through while the API is saturated: no
	// connection cap here, the same timeouts
	return newHTTPServer(a.Config.Metrics.Addr, a.opsHandler(), a.Config.HTTP, nil, a)
}

func initAPI(ctx context.Context, a *App) (Service, error) {
	open := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "imshard_http_open_connections",
		Help: "Connections the API server holds open (at most http.max_conns; more wait to be accepted).",
	})
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "imshard_http_connections_refused_total",
		Help: "API connections answered 429 and closed at once because their client address held http.max_conns_per_client.",
	})
	for _, c := range []prometheus.Collector{open, refused} {
		if err := a.Registry.Register(c); err != nil {
			return nil, err
		}
	}
	return newHTTPServer(a.Config.HTTP.Addr, a.APIMux, a.Config.HTTP, &connLimits{max: a.Config.HTTP.MaxConns,
		perClient: a.Config.HTTP.MaxConnsPerClient, open: open, refused: refused}, a)
}

// httpServer listens at start (so a taken port fails start-up); when its
// Run is asked to finish it stops accepting and drains in-flight requests
// within http.shutdown_grace.
//
// What a slow or idle client may cost is bounded by the http.* timeouts:
// headers within read_header_timeout, the whole request within
// read_timeout, the handler and its answer within write_timeout, and a
// keep-alive connection closes after idle_timeout without a request; the
// API accepts at most max_conns connections at once, a hijacked (upgraded)
// connection no longer counted among them. A long-lived route (a
// WebSocket or event stream) must lift the read and write deadlines of its
// own connection before it upgrades or streams:
//
//	rc := http.NewResponseController(w)
//	_ = rc.SetReadDeadline(time.Time{})
//	_ = rc.SetWriteDeadline(time.Time{})
//
// (TestHTTPLongLivedRouteLiftsDeadlines shows it working) and keep its own
// liveness checks (pings) instead.
type httpServer struct {
	srv   *http.Server
	ln    net.Listener
	grace time.Duration
}

// connLimits are the caps of a listener's connections: max at once,
// counted in open, and perClient of one client address (0: none), whose
// refusals count in refused.
type connLimits struct {
	max, perClient int
	open           prometheus.Gauge
	refused        prometheus.Counter
}

// newHTTPServer listens on addr; limits (nil: none) cap the connections.
func newHTTPServer(addr string, h http.Handler, c config.HTTP, limits *connLimits, a *App) (Service, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if limits != nil {
		ln = newLimitListener(ln, limits.max, limits.perClient, limits.open, limits.refused)
	}
	a.Log.Info().Str("addr", ln.Addr().String()).Msg("listening")
	return &httpServer{ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
		ConnState:         releaseHijacked,
	}, grace: c.ShutdownGrace}, nil
}

func (s *httpServer) Run(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx := context.Background() // no grace: in-flight requests finish unhurried (the App bounds its wait)
	if s.grace > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(sctx, s.grace)
		defer cancel()
	}
	err := s.srv.Shutdown(sctx)
	if errors.Is(err, net.ErrClosed) {
		err = nil // the listener was closed already (a Stop without Run's end)
	}
	if err != nil {
		_ = s.srv.Close() // the grace is over: drop what is still open
	}
	<-served
	return err
}

// Stop closes the listener of a server that never ran; after Run it has
// nothing left to do.
func (s *httpServer) Stop(context.Context) error {
	if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Addr is where the server listens (useful with port 0 in tests).
func (s *httpServer) Addr() string { return s.ln.Addr().String() }
