// Package tenantdb hands out one MySQL pool per tenant: opened lazily on
// first use (1,000 configured tenants are not 1,000 pools at start), bounded
// in size, with the tenant's database created if missing and the schema
// applied once per process. Tenant isolation starts here: a handle is only
// ever looked up by the tenant id of an authenticated credential.
package tenantdb

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

	imsql "github.com/imshard/imshard/sql"
)

// ErrUnknownTenant is returned for a tenant id not in the configuration.
var ErrUnknownTenant = errors.New("unknown tenant")

// ErrNotProvisioned is returned by read-only pools for a tenant whose
// database or schema does not exist yet, or is older than this build's.
var ErrNotProvisioned = errors.New("not provisioned (the shard manager, or `imshard shard ensure`, creates it)")

// IsDeadlock reports whether err is the server's deadlock (ER_LOCK_DEADLOCK,
// 1213): it rolled the transaction back, which may simply run again.
func IsDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// Tenant is what the pools need to know of a configured tenant.
type Tenant struct {
	ID  string
	DSN string // fully resolved (template applied)
}

// Params configures the pools.
type Params struct {
	// TLS, when set, encrypts every tenant's connections and verifies the
	// server's certificate (its ServerName defaults to the DSN's host).
	TLS             *tls.Config
	MaxOpenConns    int
	MaxIdleConns    int
	ConnMaxIdleTime time.Duration
	MaxOpenTenants  int // pools open at once; least recently used idle ones close beyond it (0 = no bound)
	// ReadOnly opens a tenant's database as it is, for the commands that
	// only look: a missing database or schema is ErrNotProvisioned, never
	// created or migrated.
	ReadOnly   bool
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Placement is where a tenant's database is: a placement record's DSN and
// epoch, or the configured DSN at epoch 0.
type Placement struct {
	DSN   string
	Epoch int64
}

// EpochVar is the session variable every connection of a tenant pool
// carries: the epoch of the placement the pool was opened for. The write
// transactions compare it with the database's fence row
// (routing.CheckPlacement), so the epoch a write is checked against always
// belongs to the very connection that writes — no code path can pair a
// handle with another placement's epoch.
const EpochVar = "@imshard_epoch"

// Pools is the set of tenant pools of this process.
type Pools struct {
	p Params

	mu      sync.Mutex
	tenants map[string]Tenant
	placed  map[string]Placement // placement records: they override tenants' DSNs
	open    map[string]*entry    // pools ready to use
	// probes are readiness's own handles, one connection each, one per
	// server (address and user) under the open pools: a pool that requests
	// have filled (every connection busy, callers queued) says nothing about
	// the server, and must not turn /readyz 503
	probes map[string]*sql.DB

	// opening coalesces the opens of one tenant (and DSN): every caller
	// waits for the same attempt, which runs with a context of its own
	opening singleflight.Group

	opened prometheus.Gauge
}

type entry struct {
	db       *sql.DB
	at       Placement
	lastUsed time.Time // guarded by Pools.mu
}

// openTimeout bounds one attempt to open a tenant's pool: create the
// database, connect, apply the schema (which may wait schemaLockWait for
// another process applying it).
const openTimeout = 2 * schemaLockWait * time.Second

// evictIdle is how long a pool must have gone unasked before the bound may
// close it: callers fetch the handle per request or per batch, so none still
// holds a handle it got that long ago.
const evictIdle = time.Minute

// New prepares the pools; nothing is opened until a tenant is used.
func New(p Params, tenants []Tenant) *Pools {
	// 0 keeps every connection the pool may open: a pool that closes
	// connections under load pays a TCP and auth handshake, and a prepare of
	// every statement, for each one it opens again
	if p.MaxIdleConns <= 0 || p.MaxIdleConns > p.MaxOpenConns {
		p.MaxIdleConns = p.MaxOpenConns
	}
	ps := &Pools{p: p, open: map[string]*entry{}, probes: map[string]*sql.DB{}}
	ps.SetTenants(tenants)
	ps.opened = promauto.With(p.Registerer).NewGauge(prometheus.GaugeOpts{
		Name: "imshard_mysql_tenant_pools_open",
		Help: "Tenant MySQL pools opened by this process.",
	})
	return ps
}

// SetTenants replaces the configured tenants (SIGHUP reload). Pools of
// tenants that were removed are closed; pools whose DSN changed reopen on
// next use.
func (ps *Pools) SetTenants(tenants []Tenant) {
	next := make(map[string]Tenant, len(tenants))
	for _, t := range tenants {
		next[t.ID] = t
	}
	ps.mu.Lock()
	ps.tenants = next
	stale := ps.staleLocked()
	ps.mu.Unlock()
	for _, e := range stale {
		_ = e.db.Close()
		ps.opened.Dec()
	}
}

// movedPoolGrace is how long the pool of a placement a tenant left stays
// open: a read that fetched the handle just before the switch still
// finishes on the old server, which keeps its copy until the move's
// finish; a write on it is refused by the fence.
const movedPoolGrace = time.Minute

// SetPlacements replaces the placement records (every tenant's newest
// epoch; a tenant absent from placed is placed by its configured DSN at
// epoch 0). A pool whose placement changed is replaced on next use; the
// old one closes after movedPoolGrace. It reports the tenants whose
// placement changed.
func (ps *Pools) SetPlacements(placed map[string]Placement) []string {
	ps.mu.Lock()
	var changed []string
	for id, t := range ps.tenants {
		if ps.placementLocked(t) != placementIn(placed, t) {
			changed = append(changed, id)
		}
	}
	ps.placed = placed
	stale := ps.staleLocked()
	ps.mu.Unlock()
	for _, e := range stale {
		time.AfterFunc(movedPoolGrace, func() {
			_ = e.db.Close()
			ps.opened.Dec()
		})
	}
	sort.Strings(changed)
	return changed
}

// Placement is where tenant's database is now, as this process follows it.
func (ps *Pools) Placement(tenant string) (Placement, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	t, ok := ps.tenants[tenant]
	if !ok {
		return Placement{}, fmt.Errorf("%w: %q", ErrUnknownTenant, tenant)
	}
	return ps.placementLocked(t), nil
}

func (ps *Pools) placementLocked(t Tenant) Placement { return placementIn(ps.placed, t) }

func placementIn(placed map[string]Placement, t Tenant) Placement {
	if p, ok := placed[t.ID]; ok {
		return p
	}
	return Placement{DSN: t.DSN}
}

// staleLocked takes out of the open pools those of tenants no longer
// configured or placed elsewhere (another DSN or epoch).
func (ps *Pools) staleLocked() []*entry {
	var stale []*entry
	for id, e := range ps.open {
		if t, ok := ps.tenants[id]; !ok || ps.placementLocked(t) != e.at {
			stale = append(stale, e)
			delete(ps.open, id)
		}
	}
	return stale
}

// IDs lists the configured tenant ids, sorted.
func (ps *Pools) IDs() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ids := make([]string, 0, len(ps.tenants))
	for id := range ps.tenants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Has reports whether tenant is configured.
func (ps *Pools) Has(tenant string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.tenants[tenant]
	return ok
}

// DB returns the tenant's pool, opening it (and creating the database and
// schema) on first use. Concurrent first uses share one open, which runs
// with its own context and deadline: a caller that gives up (its context
// ends) gets its context's error and leaves the open running for the
// others. A failed open is retried on the next call.
func (ps *Pools) DB(ctx context.Context, tenant string) (*sql.DB, error) {
	ps.mu.Lock()
	t, ok := ps.tenants[tenant]
	if !ok {
		ps.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrUnknownTenant, tenant)
	}
	if e, ok := ps.open[tenant]; ok {
		e.lastUsed = time.Now()
		ps.mu.Unlock()
		return e.db, nil
	}
	at := ps.placementLocked(t)
	ps.mu.Unlock()
	key := fmt.Sprintf("%s\x00%s\x00%d", tenant, at.DSN, at.Epoch)
	res := ps.opening.DoChan(key, func() (any, error) { return ps.openAndAdd(t.ID, at) })
	select {
	case r := <-res:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*sql.DB), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// openAndAdd opens the tenant's pool and adds it to the open ones, closing
// the least recently used beyond the bound.
func (ps *Pools) openAndAdd(id string, at Placement) (*sql.DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	t := Tenant{ID: id, DSN: at.DSN}
	db, err := ps.openTenant(ctx, t, at.Epoch)
	if err != nil {
		return nil, err
	}
	ps.mu.Lock()
	if cur, ok := ps.tenants[t.ID]; !ok || ps.placementLocked(cur) != at {
		ps.mu.Unlock()
		_ = db.Close()
		return nil, fmt.Errorf("tenant %s: its configuration or placement changed while its pool opened; try again", t.ID)
	}
	if e, ok := ps.open[t.ID]; ok {
		// an earlier open finished between our caller's look and this one
		e.lastUsed = time.Now()
		ps.mu.Unlock()
		_ = db.Close()
		return e.db, nil
	}
	ps.open[t.ID] = &entry{db: db, at: at, lastUsed: time.Now()}
	evicted := ps.evictLocked(t.ID)
	ps.mu.Unlock()
	ps.opened.Inc()
	ps.p.Log.Info().Str("tenant", t.ID).Int64("epoch", at.Epoch).Msg("tenant pool opened")
	for _, old := range evicted {
		_ = old.db.Close()
		ps.opened.Dec()
	}
	return db, nil
}

// evictLocked picks the least recently used open pools, idle for at least
// evictIdle, to close while more than MaxOpenTenants are open.
func (ps *Pools) evictLocked(keep string) []*entry {
	if ps.p.MaxOpenTenants <= 0 || len(ps.open) <= ps.p.MaxOpenTenants {
		return nil
	}
	type cand struct {
		id string
		e  *entry
	}
	var cands []cand
	for id, e := range ps.open {
		if id != keep && time.Since(e.lastUsed) >= evictIdle {
			cands = append(cands, cand{id, e})
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].e.lastUsed.Before(cands[j].e.lastUsed) })
	var out []*entry
	for _, c := range cands {
		if len(ps.open) <= ps.p.MaxOpenTenants {
			break
		}
		delete(ps.open, c.id)
		out = append(out, c.e)
	}
	return out
}

// tenantConfig parses a tenant's DSN and applies the session settings and
// the TLS configuration imshard connects with.
func (ps *Pools) tenantConfig(t Tenant) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(t.DSN)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: dsn: %w", t.ID, err)
	}
	if cfg.DBName == "" {
		return nil, fmt.Errorf("tenant %s: dsn names no database", t.ID)
	}
	normalize(cfg)
	if ps.p.TLS != nil {
		cfg.TLS = ps.p.TLS.Clone()
	}
	return cfg, nil
}

// Reach connects once to the server of tenant, without selecting its
// database, and returns what went wrong: a certificate or a password the
// server refuses shows here, before any pool is opened.
func (ps *Pools) Reach(ctx context.Context, tenant string) error {
	ps.mu.Lock()
	t, ok := ps.tenants[tenant]
	if ok {
		t.DSN = ps.placementLocked(t).DSN
	}
	ps.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownTenant, tenant)
	}
	cfg, err := ps.tenantConfig(t)
	if err != nil {
		return err
	}
	db, err := server(cfg)
	if err != nil {
		return fmt.Errorf("tenant %s: open server: %w", tenant, err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("tenant %s: %w", tenant, err)
	}
	return nil
}

func (ps *Pools) openTenant(ctx context.Context, t Tenant, epoch int64) (*sql.DB, error) {
	cfg, err := ps.tenantConfig(t)
	if err != nil {
		return nil, err
	}
	cfg.Params[EpochVar] = strconv.FormatInt(epoch, 10)
	if !ps.p.ReadOnly {
		if err := ps.createDatabase(ctx, t.ID, cfg); err != nil {
			return nil, err
		}
	}
	db, err := open(cfg)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: open: %w", t.ID, err)
	}
	db.SetMaxOpenConns(ps.p.MaxOpenConns)
	db.SetMaxIdleConns(ps.p.MaxIdleConns)
	db.SetConnMaxIdleTime(ps.p.ConnMaxIdleTime)
	db.SetConnMaxLifetime(time.Hour)
	if ps.p.ReadOnly {
		if err := checkSchema(ctx, db, cfg.DBName); err != nil {
			_ = db.Close()
			return nil, err // callers name the tenant of what is missing
		}
		return db, nil
	}
	if err := Migrate(ctx, db); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("tenant %s: %w", t.ID, err)
	}
	return db, nil
}

// normalize forces the session settings imshard relies on: UTC times parsed
// into time.Time, and strict SQL so a bad value fails instead of truncating.
// It also turns on the driver's client-side interpolation where that is safe
// (interpolates): a statement with parameters is then one round trip instead
// of a prepare, an execute and a close, about half of a write transaction's
// round trips (an erase batch's ~30 statements).
func normalize(cfg *mysql.Config) {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, ok := cfg.Params["time_zone"]; !ok {
		cfg.Params["time_zone"] = "'+00:00'"
	}
	if _, ok := cfg.Params["sql_mode"]; !ok {
		cfg.Params["sql_mode"] = "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"
	}
	cfg.InterpolateParams = interpolates(cfg)
	if cfg.InterpolateParams && cfg.MaxAllowedPacket == mysql.NewConfig().MaxAllowedPacket {
		// the server's own limit, read once per connection: a statement whose
		// escaped values pass it is sent prepared instead (the driver falls
		// back by itself), where the driver's default of 64 MiB would let it
		// go out and be refused by a server allowing less
		cfg.MaxAllowedPacket = 0
	}
}

// safeCharsets are the connection character sets in which no byte of a
// multi-byte character can be a backslash or a quote, so escaping a value
// byte by byte cannot be undone by the server's reading of it. The driver
// connects with utf8mb4 unless the DSN names another.
var safeCharsets = map[string]bool{"utf8mb4": true, "utf8mb3": true, "utf8": true, "latin1": true, "ascii": true, "binary": true}

// interpolates reports whether values may be written into the statement's
// text on cfg's connections (they are escaped by backslashes) rather than
// sent as parameters of a prepared statement. Not when the operator's DSN
// sets NO_BACKSLASH_ESCAPES (the driver would switch to quote doubling by the
// server's status flag, but imshard keeps to the one escaping it tests), or a
// character set or collation outside safeCharsets (GBK, Big5, SJIS: a
// backslash can be the second byte of a character there); both keep prepared
// statements, as before.
func interpolates(cfg *mysql.Config) bool {
	for k, v := range cfg.Params {
		switch strings.ToLower(k) {
		case "sql_mode":
			if strings.Contains(strings.ToUpper(v), "NO_BACKSLASH_ESCAPES") {
				return false
			}
		case "character_set_client", "character_set_connection":
			return false
		}
	}
	if c := cfg.Collation; c != "" && !safeCharsets[strings.ToLower(strings.SplitN(c, "_", 2)[0])] {
		return false
	}
	// the charset list is not exported: read it back from the DSN's text
	dsn := cfg.FormatDSN()
	if i := strings.LastIndexByte(dsn, '?'); i >= 0 {
		q, err := url.ParseQuery(dsn[i+1:])
		if err != nil {
			return false
		}
		for _, cs := range strings.Split(q.Get("charset"), ",") {
			if cs != "" && !safeCharsets[strings.ToLower(cs)] {
				return false
			}
		}
	}
	return true
}

// open opens a pool from the parsed configuration itself rather than its DSN
// text, which cannot carry a TLS configuration.
func open(cfg *mysql.Config) (*sql.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

// server opens a handle on cfg's server without selecting a database.
func server(cfg *mysql.Config) (*sql.DB, error) {
	admin := cfg.Clone()
	admin.DBName = ""
	return open(admin)
}

// createDatabase makes the tenant database if the account may; an account
// without CREATE rights on an existing database is fine.
func (ps *Pools) createDatabase(ctx context.Context, tenant string, cfg *mysql.Config) error {
	name := cfg.DBName
	if strings.ContainsAny(name, "`\x00") || len(name) > 64 {
		return fmt.Errorf("tenant %s: database name %q is not a plain identifier", tenant, name)
	}
	db, err := server(cfg)
	if err != nil {
		return fmt.Errorf("tenant %s: open server: %w", tenant, err)
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, strings.Replace(imsql.CreateDatabase(), imsql.DatabasePlaceholder, "`"+name+"`", 1))
	if err == nil {
		return nil
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1227) {
		ps.p.Log.Warn().Str("tenant", tenant).Err(err).Msg("no right to create the tenant database; using it as it is")
		return nil
	}
	return fmt.Errorf("tenant %s: create database: %w", tenant, err)
}

// Ping checks the servers under the opened pools (readiness): each must
// answer. It asks through the probes, never through a tenant's pool, so a
// pool whose connections are all taken by requests does not make a
// reachable server look down; several tenants on one server cost one ping.
func (ps *Pools) Ping(ctx context.Context) error {
	ps.mu.Lock()
	tenants := map[string][]string{} // probe key → tenant ids
	probes := map[string]*sql.DB{}
	var errs []error
	for id, e := range ps.open {
		cfg, err := ps.tenantConfig(Tenant{ID: id, DSN: e.at.DSN})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		key := cfg.Net + "|" + cfg.Addr + "|" + cfg.User
		tenants[key] = append(tenants[key], id)
		if probes[key] != nil {
			continue
		}
		if probes[key] = ps.probes[key]; probes[key] == nil {
			if probes[key], err = server(cfg); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: open server: %w", id, err))
				delete(tenants, key)
				continue
			}
			probes[key].SetMaxOpenConns(1)
			probes[key].SetConnMaxLifetime(time.Hour)
		}
	}
	stale := ps.probes
	for key := range probes {
		delete(stale, key)
	}
	ps.probes = probes
	ps.mu.Unlock()
	for _, db := range stale {
		_ = db.Close()
	}
	for key, db := range probes {
		if err := db.PingContext(ctx); err != nil {
			ids := tenants[key]
			sort.Strings(ids)
			errs = append(errs, fmt.Errorf("tenant %s: %w", strings.Join(ids, ","), err))
		}
	}
	return errors.Join(errs...)
}

// Close closes every opened pool.
func (ps *Pools) Close() error {
	ps.mu.Lock()
	var dbs []*sql.DB
	for _, e := range ps.open {
		dbs = append(dbs, e.db)
	}
	ps.open = map[string]*entry{}
	probes := ps.probes
	ps.probes = map[string]*sql.DB{}
	ps.mu.Unlock()
	var errs []error
	for _, db := range dbs {
		errs = append(errs, db.Close())
		ps.opened.Dec()
	}
	for _, db := range probes {
		errs = append(errs, db.Close())
	}
	return errors.Join(errs...)
}
