package shardmgr

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/routing"
)

// Config is the shard manager's part of the configuration (shard.*).
type Config struct {
	MonthsAhead    int
	SealingDays    int
	PatrolInterval time.Duration
	AutoAdvance    bool
	LockTTL        time.Duration
	// ProduceTimeout is send.produce_timeout: an event allocated in a month
	// reaches Kafka within it or is abandoned, so the completeness proof
	// waits for persist to pass the month's end plus this.
	ProduceTimeout time.Duration
}

// Params wires a Manager.
type Params struct {
	Config     Config
	Tenants    func() []string
	DBs        routing.DBs
	Redis      rueidis.Client
	KeySpace   routing.KeySpace // redis.key_prefix: where every key and channel is named
	Catalog    *routing.Catalog
	Allocator  *routing.Allocator
	Scripts    *routing.Scripts
	Metrics    *routing.Metrics
	Log        zerolog.Logger
	Registerer prometheus.Registerer
	// Retention, when set, runs for each tenant after its sync in the
	// patrol (removing what is past retention); nil: no retention here.
	Retention Retainer
	// Archive, when set, runs for each tenant after retention in the
	// patrol (finishing archives stopped half-way, archiving months past
	// the tenant's archive_after_months); nil: no archive here.
	Archive Retainer
	// Moving, when set, reports whether a tenant is in a move between its
	// plan and its switch (modules/move): its retention and archive wait
	// for the move, since they remove or replace month tables the move
	// copies and catches up.
	Moving func(ctx context.Context, tenant string) (bool, error)
}

// Retainer is a job the patrol runs for one tenant after its sync:
// retention (modules/retention, which takes the tenant's shard lock
// itself) or the archive (modules/archive).
type Retainer interface {
	Apply(ctx context.Context, tenant string) error
}

// Manager creates, registers, readies, activates and seals month tables.
type Manager struct {
	p     Params
	m     *metrics
	clock routing.Clock

	// kick wakes Run for the tenants in pending (Reconcile)
	kick    chan struct{}
	mu      sync.Mutex
	pending []string
}

// New builds a Manager.
func New(p Params) *Manager {
	if p.Config.LockTTL <= 0 {
		p.Config.LockTTL = 30 * time.Second
	}
	return &Manager{p: p, m: newMetrics(p.Registerer), clock: routing.NewClock(p.Redis), kick: make(chan struct{}, 1)}
}

// Options narrow or widen one sync.
type Options struct {
	MonthsAhead int           // months after the current one; <0 means shard.months_ahead
	From        routing.Month // also cover every month from here on (zero: none)
}

// Result is what one tenant's sync did.
type Result struct {
	Tenant    string
	Expected  []routing.Month
	Created   []routing.Month
	Writable  []routing.Month // promoted from prepared in this sync
	Changed   []Transition
	Active    routing.Month
	Activated bool
	Err       error
}

// Sync reconciles every tenant in turn and joins their errors; one tenant's
// failure does not stop the others.
func (mg *Manager) Sync(ctx context.Context, opts Options, tenants []string) ([]Result, error) {
	var results []Result
	var errs []error
	for _, t := range tenants {
		r := mg.SyncTenant(ctx, t, opts)
		results = append(results, r)
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t, r.Err))
		}
	}
	return results, errors.Join(errs...)
}

// SyncTenant makes every expected month table of tenant exist, registered
// and writable, marks them ready in Redis, makes the first activation (with
// auto_advance) and moves older months through sealing. One manager acts per
// tenant at a time (a Redis lock with token and expiry, kept while the sync
// runs; the sync stops if it is lost); a second one waits, then finds
// nothing left to do.
func (mg *Manager) SyncTenant(ctx context.Context, tenant string, opts Options) (res Result) {
	res.Tenant = tenant
	start := time.Now()
	defer func() {
		mg.m.syncDuration.Observe(time.Since(start).Seconds())
		if res.Err == nil {
			mg.m.lastSuccess.WithLabelValues(tenant).SetToCurrentTime()
		}
	}()
	keys, err := mg.p.KeySpace.Tenant(tenant)
	if err != nil {
		res.Err = err
		return res
	}
	lock, err := routing.AcquireLock(ctx, mg.p.Redis, mg.p.Scripts, keys.ShardLock(), mg.p.Config.LockTTL, 2*mg.p.Config.LockTTL)
	if err != nil {
		res.Err = err
		return res
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	defer mg.p.Catalog.Invalidate(tenant)
	// DDL may outlast the lock's TTL: keep it, and stop if it is lost
	held, stopKeeping := lock.Keep(ctx)
	defer stopKeeping()
	defer func() {
		if cause := context.Cause(held); errors.Is(cause, routing.ErrLockLost) {
			res.Err = errors.Join(cause, res.Err)
		}
	}()
	ctx = held

	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		res.Err = err
		return res
	}
	nowT, err := mg.clock.Now(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	now := routing.MonthOf(nowT)
	monthsAhead := opts.MonthsAhead
	if monthsAhead < 0 {
		monthsAhead = mg.p.Config.MonthsAhead
	}
	res.Expected = ExpectedMonths(now, monthsAhead, opts.From)

	if err := mg.ensureTables(ctx, tenant, db, res.Expected, &res); err != nil {
		res.Err = err
		// no return: months that did get ready may still be marked, but a
		// failed month is never marked ready, so no switch reaches it
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		res.Err = errors.Join(res.Err, err)
		return res
	}
	var ready []routing.Month
	newestDue := routing.Month{}
	ahead := 0
	for _, s := range shards {
		if s.Status == routing.StatusWritable {
			ready = append(ready, s.Month)
			if !s.Month.After(now) {
				newestDue = s.Month
			} else {
				ahead++
			}
		}
	}
	mg.m.readyAhead.WithLabelValues(tenant).Set(float64(ahead))
	if err := mg.p.Allocator.MarkReady(ctx, tenant, ready...); err != nil {
		res.Err = errors.Join(res.Err, err)
		return res
	}

	active, err := mg.p.Allocator.ActiveMonth(ctx, tenant)
	if err != nil {
		res.Err = errors.Join(res.Err, err)
		return res
	}
	if active.IsZero() {
		// Redis may have lost it: MySQL knows the recorded month.
		if m, err := mg.p.Allocator.RecoverActive(ctx, tenant); err == nil {
			active = m
		} else if !errors.Is(err, routing.ErrNoActiveMonth) {
			res.Err = errors.Join(res.Err, err)
			return res
		}
	}
	if mg.p.Config.AutoAdvance && !newestDue.IsZero() && newestDue.After(active) {
		if err := mg.p.Allocator.Activate(ctx, tenant, newestDue, "ensure"); err != nil {
			res.Err = errors.Join(res.Err, err)
			return res
		}
		active, res.Activated = newestDue, true
	}
	res.Active = active
	if active.IsZero() {
		mg.m.activeLag.WithLabelValues(tenant).Set(-1)
	} else {
		mg.p.Metrics.ActiveMonth.WithLabelValues(tenant).Set(float64(active.Int()))
		mg.m.activeLag.WithLabelValues(tenant).Set(float64(now.Sub(active)))
	}

	grace := time.Duration(mg.p.Config.SealingDays) * 24 * time.Hour
	mig, err := routing.LoadMigration(ctx, db)
	if err != nil {
		res.Err = errors.Join(res.Err, err)
		return res
	}
	waiting := map[string]int{}
	for _, tr := range HoldForMigration(Lifecycle(shards, active, nowT, grace), mig) {
		from := routing.StatusWritable
		if tr.To == routing.StatusSealed {
			from = routing.StatusSealing
			proof := mg.prove(ctx, db, keys, shardOf(shards, tr.Month))
			if !proof.Complete() {
				waiting[proof.Reason]++
				mg.p.Log.Info().Str("tenant", tenant).Str("month", tr.Month.String()).Str("reason", proof.Reason).
					Str("detail", proof.Detail).Msg("month past its sealing grace stays unsealed until it is proven complete")
				continue
			}
		}
		ok, err := routing.SetStatus(ctx, db, tr.Month, tr.To, from)
		if err != nil {
			res.Err = errors.Join(res.Err, err)
			continue
		}
		if ok && tr.To == routing.StatusSealed {
			// sealed: no row arrives any more, so its counts hold from now on
			if t, err := routing.TableFor(tr.Month); err == nil {
				if err := routing.RecordShardStats(ctx, db, t); err != nil {
					res.Err = errors.Join(res.Err, err)
				}
			}
		}
		if ok {
			res.Changed = append(res.Changed, tr)
			mg.m.transitions.WithLabelValues(string(tr.To)).Inc()
			mg.p.Log.Info().Str("tenant", tenant).Str("month", tr.Month.String()).Str("status", string(tr.To)).Msg("month status changed")
		}
	}
	// months sealed before their counts were kept, or whose count failed
	for _, s := range shards {
		if s.Status == routing.StatusSealed && !s.StatsAt.Valid && !slices.ContainsFunc(res.Changed, func(t Transition) bool { return t.Month == s.Month }) {
			if err := routing.RecordShardStats(ctx, db, s.Table); err != nil {
				res.Err = errors.Join(res.Err, err)
			}
		}
	}
	for _, r := range routing.WaitReasons {
		mg.m.sealWaiting.WithLabelValues(tenant, r).Set(float64(waiting[r]))
	}
	return res
}

// prove runs the completeness proof of s; a proof that cannot be read
// counts as not complete (the month waits, the reason says why).
func (mg *Manager) prove(ctx context.Context, db *sql.DB, keys routing.Keys, s routing.Shard) routing.CompletenessProof {
	p, err := routing.ProveComplete(ctx, db, mg.p.Redis, keys, s, mg.p.Config.ProduceTimeout)
	if err != nil {
		return routing.CompletenessProof{Month: s.Month, Reason: routing.WaitUnknown, Detail: err.Error(), Checked: time.Now()}
	}
	return p
}

func shardOf(shards []routing.Shard, m routing.Month) routing.Shard {
	for _, s := range shards {
		if s.Month == m {
			return s
		}
	}
	return routing.Shard{Month: m}
}

// ensureTables creates and registers the missing expected tables and makes
// prepared months writable once their table is confirmed.
func (mg *Manager) ensureTables(ctx context.Context, tenant string, db *sql.DB, expected []routing.Month, res *Result) error {
	existing, err := existingTables(ctx, db)
	if err != nil {
		return err
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return err
	}
	registered := map[routing.Month]routing.Status{}
	for _, s := range shards {
		registered[s.Month] = s.Status
		if !existing[s.Month] && s.Status.AcceptsWrites() {
			mg.p.Metrics.ShardMissing.WithLabelValues(tenant).Inc()
			mg.p.Log.Error().Str("tenant", tenant).Str("table", s.Table.Name()).Msg("catalog registers a month table that does not exist; recreating it")
		}
	}
	var errs []error
	for _, m := range expected {
		t, err := routing.TableFor(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !existing[m] {
			// DDL runs on its own statement, never inside a business transaction.
			if err := routing.FencedDDL(ctx, db, t.CreateDDL()); err != nil {
				mg.m.ddlFailures.WithLabelValues(tenant).Inc()
				mg.p.Metrics.ShardMissing.WithLabelValues(tenant).Inc()
				mg.p.Log.Error().Err(err).Str("tenant", tenant).Str("table", t.Name()).Msg("month table DDL failed; the month stays unready")
				errs = append(errs, fmt.Errorf("create %s: %w", t.Name(), err))
				continue
			}
			res.Created = append(res.Created, m)
			mg.m.created.WithLabelValues(tenant).Inc()
			mg.p.Log.Info().Str("tenant", tenant).Str("table", t.Name()).Msg("month table created")
		}
		if _, ok := registered[m]; !ok {
			if err := routing.RegisterShard(ctx, db, t); err != nil {
				mg.m.ddlFailures.WithLabelValues(tenant).Inc()
				errs = append(errs, err)
				continue
			}
			registered[m] = routing.StatusPrepared
		}
		if registered[m] == routing.StatusPrepared {
			ok, err := routing.SetStatus(ctx, db, m, routing.StatusWritable, routing.StatusPrepared)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if ok {
				res.Writable = append(res.Writable, m)
			}
		}
	}
	return errors.Join(errs...)
}

// existingTables lists the month tables physically present in db.
func existingTables(ctx context.Context, db *sql.DB) (map[routing.Month]bool, error) {
	rows, err := sq.Select("TABLE_NAME").From("information_schema.TABLES").
		Where("TABLE_SCHEMA = DATABASE()").
		Where(sq.Like{"TABLE_NAME": `im\_group\_messages\_%`}).
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("list month tables: %w", err)
	}
	defer rows.Close()
	out := map[routing.Month]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		if t, err := routing.ParseTable(name); err == nil {
			out[t.Month()] = true
		}
	}
	return out, rows.Err()
}

// Run patrols every tenant at start, then every patrol interval — every
// minute near a month boundary — and syncs the tenants Reconcile names as
// soon as it names them, until ctx ends.
func (mg *Manager) Run(ctx context.Context) error {
	patrol := time.NewTimer(0)
	defer patrol.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-mg.kick:
			if _, err := mg.Sync(ctx, Options{MonthsAhead: -1}, mg.takePending()); err != nil && ctx.Err() == nil {
				mg.p.Log.Error().Err(err).Msg("shard sync of changed tenants failed; retrying at the next patrol")
			}
		case <-patrol.C:
			tenants := mg.p.Tenants()
			if _, err := mg.Sync(ctx, Options{MonthsAhead: -1}, tenants); err != nil && ctx.Err() == nil {
				mg.p.Log.Error().Err(err).Msg("shard patrol failed for some tenants; retrying at the next patrol")
			}
			mg.retain(ctx, tenants)
			wait := mg.p.Config.PatrolInterval
			if now, err := mg.clock.Now(ctx); err != nil || nearBoundary(now, time.Hour) {
				wait = min(wait, time.Minute)
			}
			patrol.Reset(wait)
		}
	}
}

// retain runs retention, then the archive, for each tenant after the
// patrol's sync; a failed tenant is logged (and counted by the job's
// metrics), the others go on. A tenant in a move (or whose move state
// cannot be read) is left for a later patrol.
func (mg *Manager) retain(ctx context.Context, tenants []string) {
	tenants = mg.notMoving(ctx, tenants)
	for _, job := range []struct {
		name string
		r    Retainer
	}{{"retention", mg.p.Retention}, {"archive", mg.p.Archive}} {
		if job.r == nil {
			continue
		}
		for _, t := range tenants {
			if ctx.Err() != nil {
				return
			}
			if err := job.r.Apply(ctx, t); err != nil && ctx.Err() == nil {
				mg.p.Log.Error().Err(err).Str("tenant", t).Msg(job.name + " run failed; retrying at the next patrol")
			}
		}
	}
}

// notMoving is tenants less those in a move (Params.Moving), each logged.
func (mg *Manager) notMoving(ctx context.Context, tenants []string) []string {
	if mg.p.Moving == nil {
		return tenants
	}
	out := make([]string, 0, len(tenants))
	for _, t := range tenants {
		moving, err := mg.p.Moving(ctx, t)
		switch {
		case err != nil:
			mg.p.Log.Error().Err(err).Str("tenant", t).Msg("cannot tell whether the tenant is moving; its retention and archive wait for the next patrol")
		case moving:
			mg.p.Log.Info().Str("tenant", t).Msg("the tenant is moving; its retention and archive wait until the move has switched or was cancelled")
		default:
			out = append(out, t)
		}
	}
	return out
}

// Reconcile has Run sync tenants now rather than at its next patrol: a
// tenant a reload added, or moved to another database, takes sends only
// once its month tables exist and a month is active. It never waits; the
// tenants of several calls before Run gets to them are synced once.
func (mg *Manager) Reconcile(tenants ...string) {
	mg.mu.Lock()
	for _, t := range tenants {
		if !slices.Contains(mg.pending, t) {
			mg.pending = append(mg.pending, t)
		}
	}
	mg.mu.Unlock()
	select {
	case mg.kick <- struct{}{}:
	default: // a wake-up is pending already; it takes these too
	}
}

// takePending empties the tenants Reconcile named, keeping those still
// configured (a later reload may have removed one again).
func (mg *Manager) takePending() []string {
	mg.mu.Lock()
	pending := mg.pending
	mg.pending = nil
	mg.mu.Unlock()
	configured := mg.p.Tenants()
	return slices.DeleteFunc(pending, func(t string) bool { return !slices.Contains(configured, t) })
}

// Activate makes month the tenant's active month (`imshard shard activate`).
func (mg *Manager) Activate(ctx context.Context, tenant string, month routing.Month) error {
	return mg.p.Allocator.Activate(ctx, tenant, month, "activate")
}

// ErrActiveMonth refuses to seal the month that takes writes now.
var ErrActiveMonth = errors.New("the active month cannot be sealed")

// Seal closes a month to writes; late events for it go to the compensation
// queue until it is unsealed.
func (mg *Manager) Seal(ctx context.Context, tenant string, month routing.Month) error {
	active, err := mg.p.Allocator.ActiveMonth(ctx, tenant)
	if err != nil {
		return err
	}
	if month == active {
		return fmt.Errorf("%w: %s", ErrActiveMonth, month)
	}
	if err := mg.setStatus(ctx, tenant, month, routing.StatusSealed, routing.StatusWritable, routing.StatusSealing); err != nil {
		return err
	}
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	t, err := routing.TableFor(month)
	if err != nil {
		return err
	}
	return routing.RecordShardStats(ctx, db, t)
}

// Unseal reopens a sealed month for late writes; its sealing grace restarts.
func (mg *Manager) Unseal(ctx context.Context, tenant string, month routing.Month) error {
	return mg.setStatus(ctx, tenant, month, routing.StatusSealing, routing.StatusSealed)
}

func (mg *Manager) setStatus(ctx context.Context, tenant string, month routing.Month, to routing.Status, from ...routing.Status) error {
	if _, _, err := mg.p.Catalog.Table(ctx, tenant, month); err != nil {
		return err
	}
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	ok, err := routing.SetStatus(ctx, db, month, to, from...)
	mg.p.Catalog.Invalidate(tenant)
	if err != nil {
		return err
	}
	if !ok {
		cur, _ := mg.status(ctx, db, month)
		if cur == to {
			return nil
		}
		return fmt.Errorf("month %s is %s; %s needs one of %v", month, cur, to, from)
	}
	mg.p.Log.Info().Str("tenant", tenant).Str("month", month.String()).Str("status", string(to)).Msg("month status set by operator")
	return nil
}

func (mg *Manager) status(ctx context.Context, db *sql.DB, month routing.Month) (routing.Status, error) {
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return "", err
	}
	for _, s := range shards {
		if s.Month == month {
			return s.Status, nil
		}
	}
	return "", routing.ErrShardNotRegistered
}

// Info is one line of `imshard shard list`.
type Info struct {
	routing.Shard
	Exists bool
	Active bool
	Rows   int64
	MinAt  sql.NullTime
	MaxAt  sql.NullTime
	// SealWait says why a sealing month is not sealed yet when its grace
	// has passed (the completeness proof's first failing check).
	SealWait string
}

// List reports the catalog of tenant with row counts and time ranges: a
// sealed month's as counted at seal, an open month's from the route
// mirror — no month table is counted.
func (mg *Manager) List(ctx context.Context, tenant string) ([]Info, error) {
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return nil, err
	}
	if err := routing.FillCounts(ctx, db, shards); err != nil {
		return nil, err
	}
	existing, err := existingTables(ctx, db)
	if err != nil {
		return nil, err
	}
	active, err := mg.p.Allocator.ActiveMonth(ctx, tenant)
	if err != nil {
		return nil, err
	}
	keys, err := mg.p.KeySpace.Tenant(tenant)
	if err != nil {
		return nil, err
	}
	now, err := mg.clock.Now(ctx)
	if err != nil {
		return nil, err
	}
	grace := time.Duration(mg.p.Config.SealingDays) * 24 * time.Hour
	out := make([]Info, 0, len(shards))
	for _, s := range shards {
		in := Info{Shard: s, Exists: existing[s.Month], Active: s.Month == active,
			Rows: s.RowCount, MinAt: s.MinCreatedAt, MaxAt: s.MaxCreatedAt}
		if s.Status == routing.StatusSealing && s.DeactivatedAt.Valid && !now.Before(s.DeactivatedAt.Time.Add(grace)) {
			if p := mg.prove(ctx, db, keys, s); !p.Complete() {
				in.SealWait = p.Reason + ": " + p.Detail
			}
		}
		out = append(out, in)
	}
	return out, nil
}
