package query

import (
	"context"
	"database/sql"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
)

var errAdminOnly = httpapi.Errorf(httpapi.CodePermissionDenied, "admin role required")

func requireAdmin(p httpapi.Principal) error {
	if p.Role != httpapi.RoleAdmin {
		return errAdminOnly
	}
	return nil
}

// Located is a message found by its id, with the month table holding it
// and (for the admin lookup) every change made to it, oldest first.
type Located struct {
	Message    message.Message     `json:"message"`
	ShardMonth string              `json:"shard_month"`
	Revisions  []readpath.Revision `json:"revisions"`
}

// idBounds are a month table's smallest and largest message_id.
type idBounds struct {
	lo, hi int64
	empty  bool
}

// FindMonth picks the months to try for id, most likely first, given a
// bounds lookup by index into months (oldest first). Snowflake ids grow
// with time and a month table holds the messages sent while it was active,
// so the tables' id ranges follow the month order; a binary search over
// them finds the month whose range reaches id in O(log n) lookups, and its
// neighbours follow (ids from nodes with skewed clocks interleave at a
// month edge). An empty month borrows the range of the nearest older
// non-empty one, which keeps the search monotone.
func FindMonth(n int, bounds func(i int) (idBounds, error), id int64) ([]int, error) {
	eff := func(i int) (idBounds, error) {
		for j := i; j >= 0; j-- {
			b, err := bounds(j)
			if err != nil || !b.empty {
				return b, err
			}
		}
		return idBounds{empty: true}, nil
	}
	lo, hi := 0, n-1
	for lo < hi {
		mid := (lo + hi) / 2
		b, err := eff(mid)
		if err != nil {
			return nil, err
		}
		if !b.empty && b.hi >= id {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if n == 0 {
		return nil, nil
	}
	out := []int{lo}
	for _, j := range []int{lo - 1, lo + 1} {
		if j >= 0 && j < n {
			out = append(out, j)
		}
	}
	return out, nil
}

// AdminMessage locates any message of the tenant by its snowflake id
// (reports, favourites, file references), tombstones included, with its
// revisions.
func (s *Service) AdminMessage(ctx context.Context, p httpapi.Principal, id int64) (Located, error) {
	if err := requireAdmin(p); err != nil {
		return Located{}, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return Located{}, err
	}
	loc, err := s.locate(ctx, db, p.Tenant, id)
	if err != nil {
		return Located{}, err
	}
	loc.Revisions, err = readpath.RevisionsOf(ctx, db, loc.Message)
	return loc, err
}

// MessageByID is a message of a topic the caller may read, found by its
// snowflake id in whatever month holds it (reply previews, favourites,
// file references), tombstones included. A message the caller may not
// read — another topic's, or one the caller hid — is not found: the answer
// never tells that an id exists elsewhere. One below its topic's retention
// floor answers 404 expired, as an exact read does.
func (s *Service) MessageByID(ctx context.Context, p httpapi.Principal, id int64) (message.Message, error) {
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return message.Message{}, err
	}
	loc, err := s.locate(ctx, db, p.Tenant, id)
	if err != nil {
		return message.Message{}, err
	}
	m := loc.Message
	if err := s.r.Authorize(ctx, p, m.Topic); err != nil {
		if httpapi.HasCode(err, httpapi.CodePermissionDenied) {
			return message.Message{}, readpath.ErrNotFound
		}
		return message.Message{}, err
	}
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return message.Message{}, err
	}
	// below the retention floor: removed (or, in an archived month, hidden
	// until the month goes), and said so
	if err := s.r.CheckExpired(ctx, db, keys, m.Topic, m.Seq); err != nil {
		return message.Message{}, err
	}
	hv, err := s.r.HiddenOf(ctx, db, keys, m.Topic, p.UserID)
	if err != nil {
		return message.Message{}, err
	}
	hidden := hv.Ranges
	if !hv.Known {
		if hidden, err = s.st.HiddenRanges(ctx, db, m.Topic, p.UserID, m.Seq, 0); err != nil {
			return message.Message{}, err
		}
	}
	if hidden.Hides(m.Seq) {
		return message.Message{}, readpath.ErrNotFound
	}
	return m, nil
}

// locate finds the message id in the tenant's month tables (FindMonth)
// and, while the tenant migrates, first in the legacy table (its primary
// key: one lookup), which answers for every legacy row until finish.
func (s *Service) locate(ctx context.Context, db *sql.DB, tenant string, id int64) (Located, error) {
	dual, err := s.p.Migrations.DualRead(ctx, tenant)
	if err != nil {
		return Located{}, err
	}
	if dual {
		loc, ok, err := s.locateLegacy(ctx, db, id)
		if err != nil || ok {
			return loc, err
		}
	}
	set, err := s.p.Catalog.Months(ctx, tenant)
	if err != nil {
		return Located{}, err
	}
	months := routing.SortedMonths(set)
	tables, err := s.p.Router.Tables(ctx, tenant, months)
	if err != nil {
		return Located{}, err
	}
	memo := map[int]idBounds{}
	bounds := func(i int) (idBounds, error) {
		if b, ok := memo[i]; ok {
			return b, nil
		}
		lo, hi, ok, err := s.r.IDRangeIn(ctx, db, tenant, tables[i])
		if err != nil {
			return idBounds{}, err
		}
		b := idBounds{lo: lo, hi: hi, empty: !ok}
		memo[i] = b
		return b, nil
	}
	order, err := FindMonth(len(tables), bounds, id)
	if err != nil {
		return Located{}, err
	}
	for _, i := range order {
		m, ok, err := s.r.ByIDIn(ctx, db, tenant, tables[i], id)
		if err != nil {
			return Located{}, err
		}
		if ok {
			return Located{Message: m, ShardMonth: tables[i].Month().String()}, nil
		}
	}
	return Located{}, readpath.ErrNotFound
}

// locateLegacy reads message id from the legacy table; its shard_month is
// the month the backfill copies it into (its created_at month before the
// cutover recorded the months).
func (s *Service) locateLegacy(ctx context.Context, db *sql.DB, id int64) (Located, bool, error) {
	ms, err := s.st.Messages(ctx, db, readpath.SelectByID(routing.LegacyQuoted(), id))
	if err != nil || len(ms) == 0 {
		return Located{}, false, err
	}
	m := ms[0]
	month, err := routing.LegacyMonth(ctx, db, m.Topic, m.Seq)
	if err != nil {
		return Located{}, false, err
	}
	if month.IsZero() {
		month = routing.MonthOf(m.CreatedAt.Time)
	}
	return Located{Message: m, ShardMonth: month.String()}, true, nil
}

// ShardInfo is one catalog row as the admin API shows it.
type ShardInfo struct {
	Month         string     `json:"month"`
	Table         string     `json:"table"`
	Status        string     `json:"status"`
	Active        bool       `json:"active"`
	RowCount      int64      `json:"row_count"`
	MinCreatedAt  *time.Time `json:"min_created_at"`
	MaxCreatedAt  *time.Time `json:"max_created_at"`
	ActivatedAt   *time.Time `json:"activated_at"`
	DeactivatedAt *time.Time `json:"deactivated_at"`
}

// Shards is the catalog and the active month.
type Shards struct {
	ActiveMonth    string      `json:"active_month"`
	RoutesComplete string      `json:"routes_complete"`
	Shards         []ShardInfo `json:"shards"`
}

func timePtr(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	u := t.Time.UTC()
	return &u
}

// Shards lists the tenant's catalog (admin).
func (s *Service) Shards(ctx context.Context, p httpapi.Principal) (Shards, error) {
	if err := requireAdmin(p); err != nil {
		return Shards{}, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return Shards{}, err
	}
	list, err := routing.ListShards(ctx, db)
	if err != nil {
		return Shards{}, err
	}
	// counted at seal; an open month's from the route mirror
	if err := routing.FillCounts(ctx, db, list); err != nil {
		return Shards{}, err
	}
	active, complete, err := s.bounds(ctx, p.Tenant)
	if err != nil {
		return Shards{}, err
	}
	out := Shards{ActiveMonth: active.String(), RoutesComplete: complete.String(), Shards: make([]ShardInfo, 0, len(list))}
	for _, sh := range list {
		out.Shards = append(out.Shards, ShardInfo{
			Month: sh.Month.String(), Table: sh.Table.Name(), Status: string(sh.Status), Active: sh.Month == active,
			RowCount: sh.RowCount, MinCreatedAt: timePtr(sh.MinCreatedAt), MaxCreatedAt: timePtr(sh.MaxCreatedAt),
			ActivatedAt: timePtr(sh.ActivatedAt), DeactivatedAt: timePtr(sh.DeactivatedAt),
		})
	}
	return out, nil
}

func (s *Service) bounds(ctx context.Context, tenant string) (active, complete routing.Month, err error) {
	keys, err := s.p.KeySpace.Tenant(tenant)
	if err != nil {
		return active, complete, err
	}
	v, err := s.p.Redis.Do(ctx, s.p.Redis.B().Get().Key(keys.ActiveMonth()).Build()).ToString()
	if err == nil {
		active, _ = routing.ParseMonth(v)
	}
	complete, err = routing.RoutesComplete(ctx, s.p.Redis, keys)
	return active, complete, err
}

// TopicRoute shows the topic's Redis route, its mirror rows and the actual
// ranges in the month tables side by side, with their differences (admin).
func (s *Service) TopicRoute(ctx context.Context, p httpapi.Principal, topic string) (routecheck.TopicState, error) {
	if err := requireAdmin(p); err != nil {
		return routecheck.TopicState{}, err
	}
	if err := routing.ValidTopic(topic); err != nil {
		return routecheck.TopicState{}, err
	}
	return s.p.RouteCheck.Topic(ctx, p.Tenant, topic)
}

// Migration is the token's tenant's migration from the legacy single
// table (GET /v1/admin/migrations).
type Migration struct {
	Tenant         string          `json:"tenant"`
	State          string          `json:"state"`
	LegacyRows     int64           `json:"legacy_rows"`
	RowsCopied     int64           `json:"rows_copied"`
	RowsInserted   int64           `json:"rows_inserted"`
	RowsPresent    int64           `json:"rows_present"`
	RowsSkewed     int64           `json:"rows_skewed"`
	Batches        int64           `json:"batches"`
	BatchFailures  int64           `json:"batch_failures"`
	LastError      string          `json:"last_error"`
	PlannedAt      *time.Time      `json:"planned_at"`
	CutoverTime    *time.Time      `json:"cutover_time"`
	BackfilledAt   *time.Time      `json:"backfilled_at"`
	VerifiedAt     *time.Time      `json:"verified_at"`
	FinishedAt     *time.Time      `json:"finished_at"`
	Verifications  int             `json:"verifications"`
	Differences    []MigrationDiff `json:"differences"`
	DifferenceRows int             `json:"difference_count"`
}

// MigrationDiff is one topic month the verification found different.
type MigrationDiff struct {
	Topic      string `json:"topic"`
	Month      string `json:"month"`
	MinSeq     int64  `json:"min_seq"`
	MaxSeq     int64  `json:"max_seq"`
	LegacyRows int64  `json:"legacy_rows"`
	MonthRows  int64  `json:"month_rows"`
}

// Migrations shows the migration of the token's own tenant (admin): the
// tenant comes from the credential, never from the request.
func (s *Service) Migrations(ctx context.Context, p httpapi.Principal) (Migration, error) {
	if err := requireAdmin(p); err != nil {
		return Migration{}, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return Migration{}, err
	}
	m, err := routing.LoadMigration(ctx, db)
	if err != nil {
		return Migration{}, err
	}
	out := Migration{Tenant: p.Tenant, State: m.State.String(), LegacyRows: m.LegacyRows, RowsCopied: m.RowsRead,
		RowsInserted: m.RowsInserted, RowsPresent: m.RowsPresent, RowsSkewed: m.RowsSkewed, Batches: m.Batches,
		BatchFailures: m.BatchFailures, LastError: m.LastError, CutoverTime: timePtr(m.CutoverAt),
		BackfilledAt: timePtr(m.BackfilledAt), VerifiedAt: timePtr(m.VerifiedAt), FinishedAt: timePtr(m.FinishedAt),
		Verifications: m.VerifyRuns, DifferenceRows: m.VerifyDiffs, Differences: []MigrationDiff{}}
	if m.State == routing.MigrationNone {
		return out, nil
	}
	out.PlannedAt = timePtr(sql.NullTime{Time: m.PlannedAt, Valid: true})
	diffs, err := routing.LoadMigrationDiffs(ctx, db, 100)
	if err != nil {
		return Migration{}, err
	}
	for _, d := range diffs {
		out.Differences = append(out.Differences, MigrationDiff{Topic: d.Topic, Month: d.Month.String(), MinSeq: d.MinSeq,
			MaxSeq: d.MaxSeq, LegacyRows: d.LegacyRows, MonthRows: d.MonthRows})
	}
	return out, nil
}
