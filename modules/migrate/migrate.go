// Package migrate moves a live tenant from the legacy single table
// (im_group_messages) into month tables (docs/migration.md). The CLI
// (`imshard migrate …`) records the operator's intent through the
// functions here — plan, cutover, pause, resume, verify, finish, abort —
// and the migrate module (Run) does the long work: the backfill, the
// route rebuild and the verification, under a per-tenant lock, resuming
// from the last committed batch after any restart.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/routing"
)

// Config is the migrate section (migrate.*).
type Config struct {
	BatchSize     int // legacy rows per batch (each its own transaction)
	RowsPerSecond int // throttle; 0 = unthrottled
}

// Params wires a Migrator.
type Params struct {
	Config    Config
	LockTTL   time.Duration // the per-tenant lock's expiry (shard.lock_ttl)
	Poll      time.Duration // how often the module looks for work (default 1s)
	Tenants   func() []string
	DBs       routing.DBs
	Redis     rueidis.Client
	KeySpace  routing.KeySpace // redis.key_prefix: where every key and channel is named
	Scripts   *routing.Scripts
	Catalog   *routing.Catalog
	Allocator *routing.Allocator
	// EnsureMonths creates and registers every month table from from on
	// (the shard manager's sync) and returns the months whose tables it
	// created.
	EnsureMonths func(ctx context.Context, tenant string, from routing.Month) ([]routing.Month, error)
	// FixRoute recomputes a topic's route mirror and Redis route from its
	// month tables (the route checker's fix).
	FixRoute func(ctx context.Context, tenant, topic string) error
	// RebuildRoutes refills the Redis routes of topics from the mirror.
	RebuildRoutes func(ctx context.Context, tenant string, topics []string) error
	Log           zerolog.Logger
	Registerer    prometheus.Registerer
}

// Migrator runs migrations.
type Migrator struct {
	p Params
	m *metrics
}

// New builds a Migrator.
func New(p Params) *Migrator {
	if p.Config.BatchSize <= 0 {
		p.Config.BatchSize = 2000
	}
	if p.LockTTL <= 0 {
		p.LockTTL = 30 * time.Second
	}
	if p.Poll <= 0 {
		p.Poll = time.Second
	}
	return &Migrator{p: p, m: newMetrics(p.Registerer)}
}

// settle is how long a state change takes to reach every process's copy
// (refreshed every routing.MigrationRefresh): what reads the copy alone —
// the dual read, the catalog — waits that long after a change. Writes do
// not: the commands converge the write gate in Redis (gate), which every
// allocation and change reads.
const settle = 2 * routing.MigrationRefresh

// ErrRefused is a command the migration's state or data does not allow;
// nothing was changed.
var ErrRefused = errors.New("refused")

func refusef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRefused}, args...)...)
}

// column indexes of routing.LegacyColumns the verification reads
const (
	colMessageID = 0
	colTopic     = 1
	colSeq       = 3
	colCreatedAt = 23
)

func columnNames() []string { return routing.LegacyColumnNames() }

// CheckLegacySchema compares the legacy table's columns with the ones a
// migration copies; a difference is an error listing them.
func CheckLegacySchema(ctx context.Context, db *sql.DB) error {
	ok, err := routing.LegacyExists(ctx, db)
	if err != nil {
		return err
	}
	if !ok {
		return refusef("the tenant database has no table %s", routing.LegacyTable)
	}
	rows, err := sq.Select("COLUMN_NAME", "DATA_TYPE").From("information_schema.COLUMNS").
		Where(sq.Expr("TABLE_SCHEMA = DATABASE()")).Where(sq.Eq{"TABLE_NAME": routing.LegacyTable}).
		OrderBy("ORDINAL_POSITION").RunWith(db).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("migrate: read the legacy schema: %w", err)
	}
	have := map[string]string{}
	var order []string
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			_ = rows.Close()
			return err
		}
		have[strings.ToLower(name)] = strings.ToLower(typ)
		order = append(order, strings.ToLower(name))
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	var missing, wrong, extra []string
	want := map[string]bool{}
	for _, c := range routing.LegacyColumns {
		want[c.Name] = true
		typ, ok := have[c.Name]
		switch {
		case !ok:
			missing = append(missing, c.Name+" "+c.Type)
		case typ != c.Type && !(c.Type == "json" && typ == "longtext"):
			wrong = append(wrong, fmt.Sprintf("%s is %s, want %s", c.Name, typ, c.Type))
		}
	}
	for _, name := range order {
		if !want[name] {
			extra = append(extra, name)
		}
	}
	if len(missing)+len(wrong)+len(extra) == 0 {
		return nil
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "missing columns: "+strings.Join(missing, ", "))
	}
	if len(wrong) > 0 {
		parts = append(parts, "wrong types: "+strings.Join(wrong, "; "))
	}
	if len(extra) > 0 {
		parts = append(parts, "unexpected columns: "+strings.Join(extra, ", "))
	}
	return refusef("%s differs from the schema a migration copies (%s); expected columns: %s",
		routing.LegacyTable, strings.Join(parts, "; "), strings.Join(columnNames(), ", "))
}

// MonthCount is one month of the legacy table in a plan.
type MonthCount struct {
	Month routing.Month
	Rows  int64
}

// PlanReport is what plan found and did.
type PlanReport struct {
	Months        []MonthCount // legacy rows per created_at month, oldest first
	Rows          int64
	Topics        int
	MissingGroups []string // topics without a group in imshard's ACL (reads need one; start refuses)
	BadTopics     []string // topic names imshard does not accept (start refuses)
	From, To      routing.Month
}

// maxListed bounds the topics a report lists.
const maxListed = 100

// Plan records the tenant's migration plan (state planned: dual reads
// begin, sends and changes are refused), pre-creates the month tables of
// every legacy month through the next one, and reports the legacy table's
// rows per month and the topics that lack a group. It returns once the
// write gate refuses the tenant's sends and changes in every process.
func (mg *Migrator) Plan(ctx context.Context, tenant string) (PlanReport, error) {
	var rep PlanReport
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return rep, err
	}
	cur, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return rep, err
	}
	if cur.State != routing.MigrationNone && cur.State != routing.MigrationPlanned {
		return rep, refusef("plan needs no migration or a planned one; the tenant's is %s", cur.State)
	}
	if err := CheckLegacySchema(ctx, db); err != nil {
		return rep, err
	}
	rows, err := sq.Select("DATE_FORMAT(created_at, '%Y%m')", "COUNT(*)", "MIN(message_id)", "MAX(message_id)").
		From(routing.LegacyQuoted()).GroupBy("1").OrderBy("1").RunWith(db).QueryContext(ctx)
	if err != nil {
		return rep, fmt.Errorf("migrate: legacy months: %w", err)
	}
	var plan routing.MigrationPlan
	for rows.Next() {
		var ms string
		var n, lo, hi int64
		if err := rows.Scan(&ms, &n, &lo, &hi); err != nil {
			_ = rows.Close()
			return rep, err
		}
		m, err := routing.ParseMonth(ms)
		if err != nil {
			_ = rows.Close()
			return rep, refusef("legacy rows created in %s: %v", ms, err)
		}
		rep.Months = append(rep.Months, MonthCount{m, n})
		rep.Rows += n
		if plan.LegacyMinID == 0 || lo < plan.LegacyMinID {
			plan.LegacyMinID = lo
		}
		plan.LegacyMaxID = max(plan.LegacyMaxID, hi)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return rep, fmt.Errorf("migrate: legacy months: %w", err)
	}
	if rep.Rows == 0 {
		return rep, refusef("%s is empty: nothing to migrate", routing.LegacyTable)
	}
	rep.From, rep.To = rep.Months[0].Month, rep.Months[len(rep.Months)-1].Month
	if rep.Topics, rep.MissingGroups, rep.BadTopics, err = legacyTopics(ctx, db); err != nil {
		return rep, err
	}
	created, err := mg.p.EnsureMonths(ctx, tenant, rep.From)
	if err != nil {
		return rep, fmt.Errorf("migrate: create the month tables from %s: %w", rep.From, err)
	}
	plan.LegacyRows, plan.MinMonth, plan.MaxMonth = rep.Rows, rep.From, rep.To
	if err := routing.PlanMigration(ctx, db, plan); err != nil {
		return rep, err
	}
	if err := mg.gate(ctx, tenant, db); err != nil {
		return rep, err
	}
	if err := routing.RecordPlanMonths(ctx, db, created); err != nil {
		return rep, err
	}
	mg.m.observe(tenant, routing.MigrationPlanned)
	return rep, nil
}

// gate converges the tenant's write gate in Redis with the state just
// recorded in MySQL (routing.ConvergeMigrationGate): once it returns, no
// process allocates a seq or changes a message the state refuses, however
// old its own copy of the state. A command that fails here has recorded
// its step; run again, it converges the gate (until then a process that
// meets the old gate converges it itself before it lets a write through).
func (mg *Migrator) gate(ctx context.Context, tenant string, db *sql.DB) error {
	if _, err := routing.ConvergeMigrationGate(ctx, mg.p.Redis, mg.p.Scripts.Fenced, mg.p.KeySpace, db, tenant); err != nil {
		return fmt.Errorf("migrate: the state is recorded but the write gate is not set: run the command again: %w", err)
	}
	return nil
}

// legacyTopics counts the legacy table's topics and lists (up to maxListed
// each) those without a group and those with a name imshard refuses.
func legacyTopics(ctx context.Context, db *sql.DB) (n int, missing, bad []string, err error) {
	rows, err := acl.WithGroup(sq.Select("l.topic", acl.NoGroup).
		FromSelect(sq.Select("DISTINCT topic COLLATE utf8mb4_bin AS topic").From(routing.LegacyQuoted()), "l"), "l.topic").
		OrderBy("l.topic").RunWith(db).QueryContext(ctx)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("migrate: legacy topics: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var noGroup bool
		if err := rows.Scan(&topic, &noGroup); err != nil {
			return 0, nil, nil, err
		}
		n++
		if routing.ValidTopic(topic) != nil {
			if len(bad) < maxListed {
				bad = append(bad, topic)
			}
			continue
		}
		if noGroup && len(missing) < maxListed {
			missing = append(missing, topic)
		}
	}
	return n, missing, bad, rows.Err()
}

// StartReport is what a cutover did.
type StartReport struct {
	Topics    int
	Splits    int
	CutoverAt time.Time
}

// Start is the cutover (the operator confirmed the legacy writers are
// stopped): it records every topic's cutover_seq and month splits, raises
// each topic's durable seq reservation to its cutover_seq and drops its
// Redis counter (the next send re-seeds above it), then opens the tenant's
// writes (state backfilling) — the migrate module starts the backfill.
// Interrupted, it is run again: every step repeats harmlessly.
func (mg *Migrator) Start(ctx context.Context, tenant string, say func(string, ...any)) (StartReport, error) {
	var rep StartReport
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return rep, err
	}
	cur, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return rep, err
	}
	switch cur.State {
	case routing.MigrationPlanned:
		if err := CheckLegacySchema(ctx, db); err != nil {
			return rep, err
		}
		_, missing, bad, err := legacyTopics(ctx, db)
		if err != nil {
			return rep, err
		}
		if len(bad) > 0 {
			return rep, refusef("legacy topics with names imshard does not accept (^[A-Za-z0-9_-]{1,64}$): %s", strings.Join(bad, ", "))
		}
		if len(missing) > 0 {
			return rep, refusef("%d+ legacy topics have no group in imshard yet (load them through PUT /v1/topics/{topic} and its members first): %s",
				len(missing), strings.Join(missing, ", "))
		}
		if cur, err = routing.StepMigration(ctx, db, routing.StepCutover, routing.MigrationChange{}); err != nil {
			return rep, err
		}
		say("cutover recorded at %s", cur.CutoverAt.Time.UTC().Format(time.RFC3339Nano))
	case routing.MigrationCutover:
		say("resuming the cutover recorded at %s", cur.CutoverAt.Time.UTC().Format(time.RFC3339Nano))
	case routing.MigrationNone:
		return rep, refusef("start needs a plan: run `imshard migrate plan --tenant=%s` first", tenant)
	default:
		return rep, refusef("start needs state planned; the tenant's is %s", cur.State)
	}
	rep.CutoverAt = cur.CutoverAt.Time
	// shut before the counters move, also if the plan died before it
	// shut the gate
	if err := mg.gate(ctx, tenant, db); err != nil {
		return rep, err
	}
	mg.m.observe(tenant, routing.MigrationCutover)
	if err := routing.RecordCutoverTopics(ctx, db); err != nil {
		return rep, err
	}
	topics, err := routing.MigrationTopics(ctx, db)
	if err != nil {
		return rep, err
	}
	rep.Topics = len(topics)
	say("recorded the cutover_seq of %d topics", rep.Topics)
	if rep.Splits, err = routing.RecordSplits(ctx, db); err != nil {
		return rep, err
	}
	say("recorded %d topic month ranges", rep.Splits)
	issued := make(map[string]int64, len(topics))
	names := make([]string, 0, len(topics))
	for _, t := range topics {
		issued[t.Topic] = t.CutoverSeq
		names = append(names, t.Topic)
	}
	if _, err := mg.p.Allocator.RaiseReservations(ctx, tenant, issued, 0); err != nil {
		return rep, err
	}
	if err := mg.p.Allocator.ResetCounters(ctx, tenant, names); err != nil {
		return rep, err
	}
	say("raised the seq reservations above the cutover seqs; counters re-seed on the next send")
	var maxID, rowsN int64
	if err := sq.Select("COALESCE(MAX(message_id), 0)", "COUNT(*)").From(routing.LegacyQuoted()).RunWith(db).
		QueryRowContext(ctx).Scan(&maxID, &rowsN); err != nil {
		return rep, fmt.Errorf("migrate: legacy bounds: %w", err)
	}
	if _, err := routing.StepMigration(ctx, db, routing.StepOpen, routing.MigrationChange{
		Legacy: &routing.LegacyBounds{MaxID: maxID, Rows: rowsN},
	}); err != nil {
		return rep, err
	}
	if err := mg.gate(ctx, tenant, db); err != nil {
		return rep, err
	}
	mg.m.observe(tenant, routing.MigrationBackfilling)
	say("writes open: imshard takes the tenant's sends; the migrate module backfills %d rows", rowsN)
	return rep, nil
}

// Pause stops the backfill after its current batch.
func (mg *Migrator) Pause(ctx context.Context, tenant string) (routing.Migration, error) {
	return mg.step(ctx, tenant, routing.StepPause)
}

// Resume lets the backfill go on from its last committed batch.
func (mg *Migrator) Resume(ctx context.Context, tenant string) (routing.Migration, error) {
	return mg.step(ctx, tenant, routing.StepResume)
}

// Verify asks the module to run the verification again.
func (mg *Migrator) Verify(ctx context.Context, tenant string) (routing.Migration, error) {
	return mg.step(ctx, tenant, routing.StepVerify)
}

// Abort drops a plan: the tenant is served as before it. The month tables
// the plan created for months before the active one are dropped if they
// are still empty (never a table with a row; the active and next months
// stay, as the shard manager keeps them anyway). Refused once the cutover
// began.
func (mg *Migrator) Abort(ctx context.Context, tenant string) (AbortReport, error) {
	var rep AbortReport
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return rep, err
	}
	created, err := routing.PlanMonths(ctx, db)
	if err != nil {
		return rep, err
	}
	if rep.Migration, err = mg.step(ctx, tenant, routing.StepAbort); err != nil {
		return rep, err
	}
	active, err := routing.NewClock(mg.p.Redis).Month(ctx)
	if err != nil {
		return rep, err
	}
	was := map[routing.Month]routing.Status{}
	for _, m := range created {
		if !m.Before(active) {
			continue
		}
		st, err := routing.UnregisterEmptyMonth(ctx, db, m)
		if err != nil {
			return rep, err
		}
		if st != "" {
			was[m] = st
		}
	}
	mg.p.Catalog.Invalidate(tenant)
	// every process reads the state without the plan, and every catalog
	// cache forgets the unregistered months, before a table goes
	if err := sleep(ctx, max(settle, routing.CatalogTTL+routing.MigrationRefresh)); err != nil {
		return rep, err
	}
	for _, m := range created {
		st, ok := was[m]
		if !ok {
			rep.Kept = append(rep.Kept, m)
			continue
		}
		dropped, err := routing.DropUnregisteredMonth(ctx, db, m, st)
		if err != nil {
			return rep, err
		}
		if dropped {
			rep.Dropped = append(rep.Dropped, m)
		} else {
			rep.Kept = append(rep.Kept, m)
		}
	}
	mg.p.Catalog.Invalidate(tenant)
	return rep, nil
}

// AbortReport is what abort did: the migration row as it was, and the
// month tables the plan created that it dropped (empty, before the active
// month) and kept.
type AbortReport struct {
	Migration     routing.Migration
	Dropped, Kept []routing.Month
}

func (mg *Migrator) step(ctx context.Context, tenant string, step routing.MigrationStep) (routing.Migration, error) {
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return routing.Migration{}, err
	}
	m, err := routing.StepMigration(ctx, db, step, routing.MigrationChange{})
	if errors.Is(err, routing.ErrMigrationState) {
		return m, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if err != nil {
		return m, err
	}
	mg.m.observe(tenant, m.State)
	return m, mg.gate(ctx, tenant, db)
}

// Finish ends the migration once verification passed: reads stop using
// the legacy table, which is renamed to im_group_messages_legacy (kept,
// read-only). It refuses while differences remain or before the
// verification passed; run again after a failed rename, it renames.
func (mg *Migrator) Finish(ctx context.Context, tenant string) (routing.Migration, error) {
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return routing.Migration{}, err
	}
	m, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return m, err
	}
	switch m.State {
	case routing.MigrationDone:
		diffs, err := routing.LoadMigrationDiffs(ctx, db, 1)
		if err != nil {
			return m, err
		}
		if len(diffs) > 0 || m.VerifyDiffs > 0 {
			return m, refusef("verification found %d differences; finish needs none", max(m.VerifyDiffs, len(diffs)))
		}
		if m, err = mg.step(ctx, tenant, routing.StepFinish); err != nil {
			return m, err
		}
		// no process may still read the legacy table under its old name
		if err := sleep(ctx, settle); err != nil {
			return m, err
		}
	case routing.MigrationFinished:
	case routing.MigrationVerifying:
		if m.VerifyDiffs > 0 {
			return m, refusef("verification found %d differences (imshard migrate status --tenant=%s lists them); finish needs none", m.VerifyDiffs, tenant)
		}
		return m, refusef("verification has not passed yet (state verifying)")
	default:
		return m, refusef("finish needs a verified migration (state done); the tenant's is %s", m.State)
	}
	exists, err := routing.LegacyExists(ctx, db)
	if err != nil || !exists {
		return m, err
	}
	return m, routing.RenameLegacy(ctx, db)
}

// Status is a tenant's migration with the differences last found.
type Status struct {
	Tenant    string
	Migration routing.Migration
	Diffs     []routing.MigrationDiff // the first maxListed
	Locked    bool                    // a migrate module holds the tenant's lock
}

// Status reads the tenant's migration.
func (mg *Migrator) Status(ctx context.Context, tenant string) (Status, error) {
	st := Status{Tenant: tenant}
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return st, err
	}
	if st.Migration, err = routing.LoadMigration(ctx, db); err != nil {
		return st, err
	}
	if st.Migration.State == routing.MigrationNone {
		return st, nil
	}
	if st.Diffs, err = routing.LoadMigrationDiffs(ctx, db, maxListed); err != nil {
		return st, err
	}
	keys, err := mg.p.KeySpace.Tenant(tenant)
	if err != nil {
		return st, err
	}
	n, err := mg.p.Redis.Do(ctx, mg.p.Redis.B().Exists().Key(keys.MigrateLock()).Build()).AsInt64()
	if err != nil {
		return st, err
	}
	st.Locked = n > 0
	return st, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// WithThrottle is a Migrator like mg that copies at most rowsPerSecond
// rows per second (0: unthrottled); `imshard bench migrate` uses it.
func (mg *Migrator) WithThrottle(rowsPerSecond int) *Migrator {
	c := *mg
	c.p.Config.RowsPerSecond = rowsPerSecond
	return &c
}

// RunUntilDone works on the tenant's migration until it is done (or a
// verification left differences) or ctx ends: the module's loop for one
// tenant, in the caller's process.
func (mg *Migrator) RunUntilDone(ctx context.Context, tenant string) error {
	db, err := mg.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	for {
		if err := mg.Tick(ctx, tenant); err != nil {
			return err
		}
		m, err := routing.LoadMigration(ctx, db)
		if err != nil {
			return err
		}
		if m.State == routing.MigrationDone || m.State == routing.MigrationVerifying && !m.VerifyPending {
			return nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}
