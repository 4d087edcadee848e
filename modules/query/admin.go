package query

import (
	"context"
	"database/sql"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

var errAdminOnly = httpapi.Errorf(httpapi.CodePermissionDenied, "admin role required")

func requireAdmin(p httpapi.Principal) error {
	if p.Role != httpapi.RoleAdmin {
		return errAdminOnly
	}
	return nil
}

// Located is a message found by its id, with the month table holding it.
type Located struct {
	Message    message.Message `json:"message"`
	ShardMonth string          `json:"shard_month"`
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
// (reports, favourites, file references), tombstones included.
func (s *Service) AdminMessage(ctx context.Context, p httpapi.Principal, id int64) (Located, error) {
	if err := requireAdmin(p); err != nil {
		return Located{}, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return Located{}, err
	}
	set, err := s.p.Catalog.Months(ctx, p.Tenant)
	if err != nil {
		return Located{}, err
	}
	months := routing.SortedMonths(set)
	tables, err := s.p.Router.Tables(ctx, p.Tenant, months)
	if err != nil {
		return Located{}, err
	}
	memo := map[int]idBounds{}
	bounds := func(i int) (idBounds, error) {
		if b, ok := memo[i]; ok {
			return b, nil
		}
		var lo, hi sql.NullInt64
		if err := sq.Select("MIN(message_id)", "MAX(message_id)").From(tables[i].Quoted()).
			RunWith(db).QueryRowContext(ctx).Scan(&lo, &hi); err != nil {
			return idBounds{}, err
		}
		b := idBounds{lo: lo.Int64, hi: hi.Int64, empty: !lo.Valid}
		memo[i] = b
		return b, nil
	}
	order, err := FindMonth(len(tables), bounds, id)
	if err != nil {
		return Located{}, err
	}
	for _, i := range order {
		ms, err := s.st.messages(ctx, db, sq.Select(columns...).From(tables[i].Quoted()+" AS m").
			Where(sq.Eq{"m.message_id": id}))
		if err != nil {
			return Located{}, err
		}
		if len(ms) > 0 {
			return Located{Message: ms[0], ShardMonth: tables[i].Month().String()}, nil
		}
	}
	return Located{}, errNotFound
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
	list, err := s.p.Catalog.List(ctx, p.Tenant)
	if err != nil {
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
	keys, err := routing.KeysFor(tenant)
	if err != nil {
		return active, complete, err
	}
	v, err := s.p.Redis.Do(ctx, s.p.Redis.B().Get().Key(keys.ActiveMonth()).Build()).ToString()
	if err == nil {
		active, _ = routing.ParseMonth(v)
	}
	complete, err = routing.RoutesComplete(ctx, s.p.Redis, tenant)
	return active, complete, err
}

// TopicRoute shows the topic's Redis route, its mirror rows and the actual
// ranges in the month tables side by side, with their differences (admin).
func (s *Service) TopicRoute(ctx context.Context, p httpapi.Principal, topic string) (TopicState, error) {
	if err := requireAdmin(p); err != nil {
		return TopicState{}, err
	}
	if err := routing.ValidTopic(topic); err != nil {
		return TopicState{}, err
	}
	rc := &RouteCheck{Redis: s.p.Redis, Routes: s.p.Routes, Catalog: s.p.Catalog, DBs: s.p.DBs}
	return rc.Topic(ctx, p.Tenant, topic)
}
