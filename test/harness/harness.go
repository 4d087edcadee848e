// Package harness starts the real imshard App in-process for end-to-end
// tests: a fresh tenant (own database, own Redis key space), real MariaDB and
// Redis, a kfake Kafka, free ports, and month tables prepared so that tests
// switch months deterministically — never by waiting for the calendar.
package harness

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/test/testenv"
)

// HistoryMonths is how many months before the current one the harness
// prepares; without AutoAdvance the oldest of them starts active, so a test
// has HistoryMonths switches available before reaching the current month.
const HistoryMonths = 3

// Options shape one Env.
type Options struct {
	Roles       []string             // default: all
	AutoAdvance bool                 // shard.auto_advance; default false: the harness activates the oldest month
	Mutate      func(*config.Config) // last word on the config
	Brokers     []string             // default: a fresh kfake cluster
	Tenant      string               // default: a fresh testenv.NewTenant
	Log         *zerolog.Logger      // default: errors only, to the test log
}

// Env is one running App serving one tenant.
type Env struct {
	T       testing.TB
	Tenant  string
	Secret  []byte
	Config  *config.Config
	App     *app.App
	BaseURL string // the API ("" when no HTTP role runs)
	OpsURL  string // /metrics, /healthz, /readyz
	DB      *sql.DB
	Redis   rueidis.Client
	Start   routing.Month // the month the harness activated first (zero with AutoAdvance)

	cancel context.CancelFunc
	done   chan error
}

// Start builds and runs an App for a fresh tenant; it is stopped on cleanup.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	tenant := opts.Tenant
	if tenant == "" {
		tenant = testenv.NewTenant(t)
	}
	cfg := Config(t, tenant, opts)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)
	if opts.Log != nil {
		log = *opts.Log
	}
	roles := opts.Roles
	if len(roles) == 0 {
		roles = []string{app.All}
	}
	a := app.New(cfg, log)
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx, roles); err != nil {
		cancel()
		t.Fatalf("harness: start %v: %v", roles, err)
	}
	e := &Env{T: t, Tenant: tenant, Secret: []byte(cfg.Tenants[0].JWTSecret), Config: cfg, App: a,
		Redis: a.Redis(), cancel: cancel, done: make(chan error, 1)}
	if addr := a.APIAddr(); addr != "" {
		e.BaseURL = "http://" + addr
	}
	e.OpsURL = "http://" + a.OpsAddr()
	go func() { e.done <- a.Run(ctx) }()
	t.Cleanup(e.Stop)

	db, err := a.Pools().DB(ctx, tenant)
	if err != nil {
		t.Fatalf("harness: tenant db: %v", err)
	}
	e.DB = db
	now := e.Now()
	mg := a.NewShardManager()
	res := mg.SyncTenant(ctx, tenant, shardmgr.Options{MonthsAhead: -1, From: now.Add(-HistoryMonths)})
	if res.Err != nil {
		t.Fatalf("harness: shard ensure: %v", res.Err)
	}
	if !opts.AutoAdvance {
		e.Start = now.Add(-HistoryMonths)
		// a second App for the same tenant finds the month already moving
		if cur, err := a.Allocator().ActiveMonth(ctx, tenant); err != nil {
			t.Fatalf("harness: active month: %v", err)
		} else if cur.IsZero() {
			e.Activate(e.Start)
		}
	}
	return e
}

// Config is the configuration Start uses: local services, free ports, one
// tenant, fast timings.
func Config(t testing.TB, tenant string, opts Options) *config.Config {
	def := config.Default()
	cfg := &def
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.HTTP.ShutdownDelay = 0 // no load balancer to drain from
	cfg.HTTP.ShutdownGrace = 10 * time.Second
	cfg.Metrics.Addr = "127.0.0.1:0"
	cfg.MySQL.DSNTemplate = testenv.DSNTemplate()
	cfg.Redis.Addrs = []string{testenv.RedisAddr()}
	cfg.Kafka.Brokers = opts.Brokers
	if len(cfg.Kafka.Brokers) == 0 {
		cfg.Kafka.Brokers = testenv.Kafka(t)
	}
	cfg.Kafka.Partitions = 4
	cfg.Kafka.DataDir = ""
	cfg.Tenants = []config.Tenant{{ID: tenant, JWTSecret: "secret-" + tenant}}
	cfg.Shard.AutoAdvance = opts.AutoAdvance
	cfg.Shard.PatrolInterval = time.Hour
	cfg.Persist.BatchLinger = 5 * time.Millisecond
	// a test sends, reads and connects at machine speed: no limit throttles
	// it unless it is about limits (and sets them in Mutate)
	cfg.Limits = config.Limits{}
	cfg.Stream.MaxConnectionsPerUser = 0
	if opts.Mutate != nil {
		opts.Mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("harness: config: %v", err)
	}
	return cfg
}

// Stop shuts the App down (idempotent) and fails the test if it did not
// stop cleanly.
func (e *Env) Stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.cancel = nil
	select {
	case err := <-e.done:
		if err != nil {
			e.T.Errorf("harness: app stopped with error: %v", err)
		}
	case <-time.After(30 * time.Second):
		e.T.Errorf("harness: app did not stop within 30s")
	}
}

// Reload applies the configuration the App runs with, changed by mutate,
// as a SIGHUP would (app.App.Reload), and returns once it is in effect;
// Token signs with the tenant's jwt_secret as reloaded from then on.
func (e *Env) Reload(mutate func(*config.Config)) {
	e.T.Helper()
	next := *e.Config
	next.Tenants = slices.Clone(e.Config.Tenants)
	mutate(&next)
	if err := next.Validate(); err != nil {
		e.T.Fatalf("harness: reload: %v", err)
	}
	e.App.Reload(&next)
	e.Config = &next
	for _, t := range next.Tenants {
		if t.ID == e.Tenant {
			e.Secret = []byte(t.JWTSecret)
		}
	}
}

// Now is the Redis-time month.
func (e *Env) Now() routing.Month {
	e.T.Helper()
	m, err := routing.NewClock(e.Redis).Month(context.Background())
	if err != nil {
		e.T.Fatalf("harness: redis time: %v", err)
	}
	return m
}

// Keys is the tenant's Redis key builder, in the App's key space
// (redis.key_prefix).
func (e *Env) Keys() routing.Keys {
	e.T.Helper()
	k, err := e.App.KeySpace().Tenant(e.Tenant)
	if err != nil {
		e.T.Fatalf("harness: keys: %v", err)
	}
	return k
}

// RaiseFloors raises topics' retention floors as the retention does:
// the record, then readers' copy in Redis.
func (e *Env) RaiseFloors(floors ...routing.Floor) error {
	return routing.Floors{Redis: e.Redis, Scripts: routing.NewScripts()}.Raise(context.Background(), e.DB, e.Keys(), floors)
}

// Activate makes m the tenant's active month (`imshard shard activate`).
func (e *Env) Activate(m routing.Month) {
	e.T.Helper()
	if err := e.App.NewShardManager().Activate(context.Background(), e.Tenant, m); err != nil {
		e.T.Fatalf("harness: activate %s: %v", m, err)
	}
}

// Token signs a JWT of this tenant for userID with role ("" = plain user).
func (e *Env) Token(userID int64, role string) string {
	e.T.Helper()
	tok, err := httpapi.Sign(e.Secret, e.Tenant, userID, role, time.Hour)
	if err != nil {
		e.T.Fatalf("harness: sign: %v", err)
	}
	return tok
}

// Do sends one API request (body marshalled as JSON unless it is []byte or
// nil) and returns the status and body. The exchange must be one that
// docs/openapi.yaml describes (OpenAPI.Check); a departure fails the test.
func (e *Env) Do(method, path, token string, body any) (int, []byte) {
	e.T.Helper()
	code, out, _ := e.DoHeader(method, path, token, body)
	return code, out
}

// DoHeader is Do that also returns the answer's header fields.
func (e *Env) DoHeader(method, path, token string, body any) (int, []byte, http.Header) {
	e.T.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			e.T.Fatalf("harness: marshal: %v", err)
		}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.BaseURL+path, rd)
	if err != nil {
		e.T.Fatalf("harness: request: %v", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.T.Fatalf("harness: %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		e.T.Fatalf("harness: read body: %v", err)
	}
	CheckExchange(e.T, req, raw, resp, out)
	return resp.StatusCode, out, resp.Header
}
