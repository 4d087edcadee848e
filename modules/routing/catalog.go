package routing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	"golang.org/x/sync/singleflight"
)

// Status is a month table's lifecycle state:
// prepared → writable → sealing → sealed (→ archived).
type Status string

const (
	StatusPrepared Status = "prepared"
	StatusWritable Status = "writable"
	StatusSealing  Status = "sealing"
	StatusSealed   Status = "sealed"
	StatusArchived Status = "archived"
	// StatusExpiring: past retention, its removal begun (a retention run
	// stopped half-way finishes it); no read or write reaches it.
	StatusExpiring Status = "expiring"
)

// AcceptsWrites reports whether persist may insert into a month in s: the
// writable month(s) and months still inside their sealing grace.
func (s Status) AcceptsWrites() bool { return s == StatusWritable || s == StatusSealing }

// Catalog table and columns.
const (
	catalogTable     = "im_group_message_shards"
	activationsTable = "im_group_message_activations"
)

// Errors of the catalog check; persist and query map them to retries, 503s
// or alerts — never to a query against an unregistered table.
var (
	ErrShardNotRegistered = errors.New("month table not registered in the catalog")
	ErrNoActiveMonth      = errors.New("no active month")
)

// DBs hands out a tenant's database handle (tenantdb.Pools implements it).
type DBs interface {
	DB(ctx context.Context, tenant string) (*sql.DB, error)
}

// Shard is one row of the catalog.
type Shard struct {
	Month         Month
	Table         Table
	Status        Status
	RowCount      int64
	MinCreatedAt  sql.NullTime
	MaxCreatedAt  sql.NullTime
	StatsAt       sql.NullTime // when RowCount and the created_at bounds were counted (at seal)
	ActivatedAt   sql.NullTime
	DeactivatedAt sql.NullTime
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Catalog reads and writes the shard catalog of every tenant. Lookups for
// the hot paths (persist's write check, query's table check) go through a
// short-lived per-tenant snapshot, so an unregistered month costs no query
// against the unknown table. A month the snapshot lacks is looked up again
// only once the snapshot is older than a fifth of the ttl (a month is
// registered well before anything writes to it), and concurrent refreshes
// of one tenant share one read of MySQL.
type Catalog struct {
	dbs DBs
	ttl time.Duration

	mu    sync.Mutex
	cache map[string]catalogSnapshot
	gen   map[string]uint64 // per tenant, bumped by Invalidate

	loads singleflight.Group
}

type catalogSnapshot struct {
	at     time.Time
	status map[Month]Status
}

// catalogReadTimeout bounds one shared catalog read: it runs for every
// caller waiting on it, so not with any one caller's deadline.
const catalogReadTimeout = 10 * time.Second

// CatalogTTL is how long a process's catalog cache answers before it
// reads MySQL again: a month taken out of the catalog is forgotten by every
// reader within it.
const CatalogTTL = 5 * time.Second

// NewCatalog caches lookups for ttl (0 disables the cache).
func NewCatalog(dbs DBs, ttl time.Duration) *Catalog {
	return &Catalog{dbs: dbs, ttl: ttl, cache: map[string]catalogSnapshot{}, gen: map[string]uint64{}}
}

// List returns the tenant's catalog, oldest month first, straight from MySQL.
func (c *Catalog) List(ctx context.Context, tenant string) ([]Shard, error) {
	db, err := c.dbs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return ListShards(ctx, db)
}

// ListShards reads a catalog from db.
func ListShards(ctx context.Context, db sq.BaseRunner) ([]Shard, error) {
	rows, err := sq.Select("shard_month", "table_name", "status", "row_count", "min_created_at",
		"max_created_at", "stats_at", "activated_at", "deactivated_at", "created_at", "updated_at").
		From(catalogTable).OrderBy("shard_month").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("catalog: list: %w", err)
	}
	defer rows.Close()
	var out []Shard
	for rows.Next() {
		var s Shard
		var month, name, status string
		if err := rows.Scan(&month, &name, &status, &s.RowCount, &s.MinCreatedAt, &s.MaxCreatedAt,
			&s.StatsAt, &s.ActivatedAt, &s.DeactivatedAt, &s.CreatedAt, &s.UpdatedAt); err != nil {
			return nil, fmt.Errorf("catalog: scan: %w", err)
		}
		m, err := ParseMonth(month)
		if err != nil {
			return nil, fmt.Errorf("catalog: row %q: %w", month, err)
		}
		t, err := ParseTable(name)
		if err != nil || t.Month() != m {
			return nil, fmt.Errorf("catalog: row %s names table %q: %w", month, name, ErrInvalidTable)
		}
		s.Month, s.Table, s.Status = m, t, Status(status)
		out = append(out, s)
	}
	return out, rows.Err()
}

// Table returns the month table of m for tenant if the catalog registers it,
// with its status. It is the check every dynamic table access passes first.
func (c *Catalog) Table(ctx context.Context, tenant string, m Month) (Table, Status, error) {
	t, err := TableFor(m)
	if err != nil {
		return Table{}, "", err
	}
	snap, ok := c.snapshot(tenant, c.ttl)
	if _, known := snap.status[m]; !ok || (!known && time.Since(snap.at) > c.ttl/5) {
		var err error
		if snap, err = c.refresh(ctx, tenant, snap.at); err != nil {
			return Table{}, "", err
		}
	}
	st, ok := snap.status[m]
	if !ok {
		return Table{}, "", fmt.Errorf("%w: %s", ErrShardNotRegistered, t.Name())
	}
	return t, st, nil
}

// Months returns the registered months of tenant with their statuses, from
// the cache when fresh.
func (c *Catalog) Months(ctx context.Context, tenant string) (map[Month]Status, error) {
	if snap, ok := c.snapshot(tenant, c.ttl); ok {
		return snap.status, nil
	}
	snap, err := c.refresh(ctx, tenant, time.Time{})
	if err != nil {
		return nil, err
	}
	return snap.status, nil
}

// SortedMonths is Months as an ordered slice, oldest first.
func SortedMonths(set map[Month]Status) []Month {
	out := make([]Month, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// Invalidate drops the tenant's cached catalog (after DDL or a status
// change); a read already under way when it is called is not used.
func (c *Catalog) Invalidate(tenant string) {
	c.mu.Lock()
	delete(c.cache, tenant)
	c.gen[tenant]++
	c.mu.Unlock()
}

// snapshot is the tenant's cached catalog if it is younger than maxAge.
func (c *Catalog) snapshot(tenant string, maxAge time.Duration) (catalogSnapshot, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	snap, ok := c.cache[tenant]
	if !ok || time.Since(snap.at) > maxAge {
		return catalogSnapshot{}, false
	}
	return snap, true
}

// refresh reads the tenant's catalog from MySQL, one read at a time per
// tenant: callers arriving while one runs wait for it (each for at most
// its own context), and a caller that found the cache stale (seen: the age
// of what it found, zero for nothing) but comes just after another's read
// finished takes that read's fresh snapshot instead of reading again.
func (c *Catalog) refresh(ctx context.Context, tenant string, seen time.Time) (catalogSnapshot, error) {
	c.mu.Lock()
	gen := c.gen[tenant]
	c.mu.Unlock()
	res := c.loads.DoChan(tenant+"\x00"+strconv.FormatUint(gen, 10), func() (any, error) {
		c.mu.Lock()
		cur, ok := c.cache[tenant]
		fresh := ok && c.gen[tenant] == gen && cur.at.After(seen) && time.Since(cur.at) <= c.ttl
		c.mu.Unlock()
		if fresh {
			return cur, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), catalogReadTimeout)
		defer cancel()
		shards, err := c.List(rctx, tenant)
		if err != nil {
			return catalogSnapshot{}, err
		}
		snap := catalogSnapshot{at: time.Now(), status: make(map[Month]Status, len(shards))}
		for _, s := range shards {
			snap.status[s.Month] = s.Status
		}
		c.mu.Lock()
		if c.gen[tenant] == gen {
			c.cache[tenant] = snap
		}
		c.mu.Unlock()
		return snap, nil
	})
	select {
	case r := <-res:
		if r.Err != nil {
			return catalogSnapshot{}, r.Err
		}
		return r.Val.(catalogSnapshot), nil
	case <-ctx.Done():
		return catalogSnapshot{}, ctx.Err()
	}
}

// RegisterShard records t in the catalog as prepared, keeping an existing row.
func RegisterShard(ctx context.Context, db TxBeginner, t Table) error {
	m := t.Month()
	err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Insert(catalogTable).
			Columns("shard_month", "table_name", "shard_start", "shard_end", "status").
			Values(m.String(), t.Name(), m.Start(), m.End(), string(StatusPrepared)).
			Suffix("ON DUPLICATE KEY UPDATE shard_month = shard_month").
			RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("catalog: register %s: %w", t.Name(), err)
	}
	return nil
}

// UnregisterShard removes month m from the catalog (an aborted migration
// plan's empty month, before its table is dropped).
func UnregisterShard(ctx context.Context, db TxBeginner, m Month) error {
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Delete(catalogTable).Where(sq.Eq{"shard_month": m.String()}).RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("catalog: unregister %s: %w", m, err)
	}
	return nil
}

// SetStatus moves month m to status to if it is currently in one of from.
// It reports whether a row changed.
func SetStatus(ctx context.Context, db TxBeginner, m Month, to Status, from ...Status) (bool, error) {
	q := sq.Update(catalogTable).Set("status", string(to)).Where(sq.Eq{"shard_month": m.String()})
	if len(from) > 0 {
		fs := make([]string, len(from))
		for i, f := range from {
			fs[i] = string(f)
		}
		q = q.Where(sq.Eq{"status": fs})
	}
	if to == StatusSealing {
		// The sealing grace counts from when the month stopped being active
		// (stamped at the switch); an unseal restarts it.
		if slices.Contains(from, StatusSealed) {
			// reopened for late rows: its counts are the mirror's again
			q = q.Set("deactivated_at", sq.Expr("UTC_TIMESTAMP(3)")).Set("stats_at", nil)
		} else {
			q = q.Set("deactivated_at", sq.Expr("COALESCE(deactivated_at, UTC_TIMESTAMP(3))"))
		}
	}
	n, err := FencedRows(ctx, db, q)
	if err != nil {
		return false, fmt.Errorf("catalog: set %s %s: %w", m, to, err)
	}
	return n > 0, nil
}

// SetArchived moves month m between sealed and archived (archived true:
// sealed → archived; false: back) in tx, a fenced transaction holding the
// month's catalog row (LockForArchive). It reports whether a row changed.
func SetArchived(ctx context.Context, tx *sql.Tx, m Month, archived bool) (bool, error) {
	from, to := StatusSealed, StatusArchived
	if !archived {
		from, to = to, from
	}
	q := sq.Update(catalogTable).Set("status", string(to))
	if !archived {
		// starts the window in which changes wait for every catalog cache
		// to see the month read from its table again (LockForChange)
		q = q.Set("unarchived_at", sq.Expr("UTC_TIMESTAMP(3)"))
	}
	res, err := q.Where(sq.Eq{"shard_month": m.String(), "status": string(from)}).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return false, fmt.Errorf("catalog: set %s %s: %w", m, to, err)
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// RecordActivation writes the activation of m to MySQL — always before Redis
// is told (invariant 3, docs/invariants.md) — and stamps the catalog: m becomes active,
// every older active month stops being active (its sealing grace starts).
func RecordActivation(ctx context.Context, db *sql.DB, m Month, source string) error {
	return Fenced(ctx, db, func(tx *sql.Tx) error { return recordActivation(ctx, tx, m, source) })
}

func recordActivation(ctx context.Context, tx *sql.Tx, m Month, source string) error {
	if _, err := sq.Insert(activationsTable).Columns("shard_month", "source").Values(m.String(), source).
		Options("IGNORE").RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("catalog: record activation %s: %w", m, err)
	}
	if _, err := sq.Update(catalogTable).Set("activated_at", sq.Expr("UTC_TIMESTAMP(3)")).
		Where(sq.Eq{"shard_month": m.String(), "activated_at": nil}).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("catalog: stamp activation %s: %w", m, err)
	}
	if _, err := sq.Update(catalogTable).Set("deactivated_at", sq.Expr("UTC_TIMESTAMP(3)")).
		Where(sq.Lt{"shard_month": m.String()}).
		Where(sq.NotEq{"activated_at": nil}).Where(sq.Eq{"deactivated_at": nil}).
		RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("catalog: stamp deactivation before %s: %w", m, err)
	}
	return nil
}

// RecordedActive is the newest activation recorded in MySQL (zero if none).
func RecordedActive(ctx context.Context, db sq.BaseRunner) (Month, error) {
	var s sql.NullString
	err := sq.Select("MAX(shard_month)").From(activationsTable).RunWith(db).QueryRowContext(ctx).Scan(&s)
	if err != nil {
		return Month{}, fmt.Errorf("catalog: recorded active month: %w", err)
	}
	if !s.Valid {
		return Month{}, nil
	}
	return ParseMonth(s.String)
}

// RecordShardStats counts the rows of month table t and their created_at
// span into its catalog row, once, when the month is sealed: from then on
// the catalog answers how big a month is without counting it again. The
// count (a scan of the whole table) runs before the fenced transaction,
// which only writes the result: a fenced transaction holds the fence row
// shared until it ends, and a move's switch waits for it, so a scan inside
// would hold the switch for as long as it takes. The month is sealed, so
// what is counted is what the table holds; a trim by retention records the
// stats again after it.
func RecordShardStats(ctx context.Context, db *sql.DB, t Table) error {
	var n int64
	var lo, hi sql.NullTime
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), MIN(created_at), MAX(created_at) FROM "+t.Quoted()).Scan(&n, &lo, &hi); err != nil {
		return fmt.Errorf("catalog: count %s: %w", t.Name(), err)
	}
	err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(catalogTable).Set("row_count", n).Set("min_created_at", lo).Set("max_created_at", hi).
			Set("stats_at", sq.Expr("UTC_TIMESTAMP(3)")).Where(sq.Eq{"shard_month": t.Month().String()}).RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("catalog: count %s: %w", t.Name(), err)
	}
	return nil
}

// FillCounts completes shards whose counts were not recorded at seal (a
// month still taking rows, or sealed before counts were kept) with the
// route mirror's totals for their months: one grouped read of the mirror's
// month index, never a count of a month table.
func FillCounts(ctx context.Context, db sq.BaseRunner, shards []Shard) error {
	var open []Month
	for _, s := range shards {
		if !s.StatsAt.Valid {
			open = append(open, s.Month)
		}
	}
	if len(open) == 0 {
		return nil
	}
	totals, err := MirrorMonthTotals(ctx, db, open)
	if err != nil {
		return err
	}
	for i := range shards {
		if shards[i].StatsAt.Valid {
			continue
		}
		t := totals[shards[i].Month]
		shards[i].RowCount = t.Count
		shards[i].MinCreatedAt, shards[i].MaxCreatedAt = t.MinCreatedAt, t.MaxCreatedAt
	}
	return nil
}
