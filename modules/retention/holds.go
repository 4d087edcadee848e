package retention

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// The legal-hold tables (sql/migrations/0020_legal_holds.sql); only this
// package reads or writes them.
const (
	holdsTable   = "im_legal_holds"
	targetsTable = "im_legal_hold_targets"
)

// Kinds of a hold's target.
const (
	kindTopic = "topic"
	kindUser  = "user"
)

// holdBatch bounds the targets of one statement.
const holdBatch = 500

// maxReason bounds a hold's reason (the column's width).
const maxReason = 1024

var holdID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Hold is a legal hold: while it stands, nothing of the topics it names
// and nothing the users it names sent is removed by retention, a group
// purge or a user erase.
type Hold struct {
	ID        string       `json:"id"`
	Tenant    string       `json:"tenant"`
	Topics    []string     `json:"topics"`
	Users     []message.ID `json:"users"`
	Reason    string       `json:"reason"`
	CreatedAt message.Time `json:"created_at"`
	UpdatedAt message.Time `json:"updated_at"`
}

// HoldRequest is the body of PUT /v1/admin/holds/{id}.
type HoldRequest struct {
	Tenant string       `json:"tenant"`
	Topics []string     `json:"topics"`
	Users  []message.ID `json:"users"`
	Reason string       `json:"reason"`
}

func invalid(field, msg string) error {
	return httpapi.Errorf(httpapi.CodeInvalidArgument, msg).WithDetails(map[string]any{"field": field})
}

// ValidHoldID checks a hold's id: 1 to 64 of A-Z a-z 0-9 . _ -.
func ValidHoldID(id string) error {
	if !holdID.MatchString(id) {
		return invalid("id", "hold id must match ^[A-Za-z0-9._-]{1,64}$")
	}
	return nil
}

// Check validates a hold request of tenant's caller: the body names the
// caller's tenant, at least one topic or user, each valid, and a reason.
// Repeated targets are kept once.
func (q *HoldRequest) Check(tenant string) error {
	if q.Tenant != tenant {
		return invalid("tenant", "tenant must be the token's tenant")
	}
	if len(q.Topics)+len(q.Users) == 0 {
		return invalid("topics", "a hold names at least one topic or user")
	}
	for _, t := range q.Topics {
		if routing.ValidTopic(t) != nil {
			return invalid("topics", "invalid topic "+strconv.Quote(t)+": want ^[A-Za-z0-9_-]{1,64}$")
		}
	}
	for _, u := range q.Users {
		if u <= 0 {
			return invalid("users", "user ids must be positive")
		}
	}
	if strings.TrimSpace(q.Reason) == "" || len(q.Reason) > maxReason {
		return invalid("reason", "reason must be 1 to 1024 bytes, not only blanks")
	}
	slices.Sort(q.Topics)
	q.Topics = slices.Compact(q.Topics)
	slices.Sort(q.Users)
	q.Users = slices.Compact(q.Users)
	return nil
}

// ErrNoHold: no hold has the id.
var ErrNoHold = httpapi.Errorf(httpapi.CodeNotFound, "no such hold")

// PutHold creates hold id or replaces its targets and reason, in one
// transaction: a retention step, purge or erase that starts after it
// returns sees the hold as stored.
func (r *Retention) PutHold(ctx context.Context, tenant, id string, q HoldRequest) (Hold, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Hold{}, err
	}
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		if _, err := sq.Insert(holdsTable).Columns("hold_id", "reason").Values(id, q.Reason).
			Suffix("ON DUPLICATE KEY UPDATE reason = VALUES(reason), updated_at = CURRENT_TIMESTAMP(3)").
			RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("holds: put %s: %w", id, err)
		}
		if _, err := sq.Delete(targetsTable).Where(sq.Eq{"hold_id": id}).RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("holds: clear targets of %s: %w", id, err)
		}
		targets := make([][2]string, 0, len(q.Topics)+len(q.Users))
		for _, t := range q.Topics {
			targets = append(targets, [2]string{kindTopic, t})
		}
		for _, u := range q.Users {
			targets = append(targets, [2]string{kindUser, strconv.FormatInt(int64(u), 10)})
		}
		for len(targets) > 0 {
			part := targets[:min(len(targets), holdBatch)]
			targets = targets[len(part):]
			ins := sq.Insert(targetsTable).Columns("hold_id", "kind", "target")
			for _, t := range part {
				ins = ins.Values(id, t[0], t[1])
			}
			if _, err := ins.RunWith(tx).ExecContext(ctx); err != nil {
				return fmt.Errorf("holds: targets of %s: %w", id, err)
			}
		}
		return nil
	}); err != nil {
		return Hold{}, err
	}
	holds, err := loadHolds(ctx, db, tenant, sq.Eq{"h.hold_id": id})
	if err != nil {
		return Hold{}, err
	}
	if len(holds) != 1 {
		return Hold{}, fmt.Errorf("holds: %s not found after put", id)
	}
	r.p.Log.Info().Str("tenant", tenant).Str("hold", id).Int("topics", len(q.Topics)).Int("users", len(q.Users)).Msg("legal hold stored")
	return holds[0], nil
}

// DeleteHold lifts hold id (ErrNoHold when there is none).
func (r *Retention) DeleteHold(ctx context.Context, tenant, id string) error {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		res, err := sq.Delete(holdsTable).Where(sq.Eq{"hold_id": id}).RunWith(tx).ExecContext(ctx)
		if err != nil {
			return fmt.Errorf("holds: delete %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("holds: delete %s: %w", id, err)
		}
		if n == 0 {
			return ErrNoHold
		}
		if _, err := sq.Delete(targetsTable).Where(sq.Eq{"hold_id": id}).RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("holds: delete targets of %s: %w", id, err)
		}
		return nil
	}); err != nil {
		return err
	}
	r.p.Log.Info().Str("tenant", tenant).Str("hold", id).Msg("legal hold lifted")
	return nil
}

// Holds lists the tenant's holds by id.
func (r *Retention) Holds(ctx context.Context, tenant string) ([]Hold, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return loadHolds(ctx, db, tenant, nil)
}

// loadHolds reads the holds matching where (nil: all), targets included.
func loadHolds(ctx context.Context, db *sql.DB, tenant string, where sq.Sqlizer) ([]Hold, error) {
	q := sq.Select("h.hold_id", "h.reason", "h.created_at", "h.updated_at", "t.kind", "t.target").
		From(holdsTable+" h").LeftJoin(targetsTable+" t ON t.hold_id = h.hold_id").OrderBy("h.hold_id", "t.kind", "t.target")
	if where != nil {
		q = q.Where(where)
	}
	rows, err := q.RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("holds: list: %w", err)
	}
	defer rows.Close()
	out := []Hold{}
	for rows.Next() {
		var id, reason string
		var created, updated time.Time
		var kind, target sql.NullString
		if err := rows.Scan(&id, &reason, &created, &updated, &kind, &target); err != nil {
			return nil, fmt.Errorf("holds: scan: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].ID != id {
			out = append(out, Hold{ID: id, Tenant: tenant, Topics: []string{}, Users: []message.ID{}, Reason: reason,
				CreatedAt: message.NewTime(created), UpdatedAt: message.NewTime(updated)})
		}
		h := &out[len(out)-1]
		switch kind.String {
		case kindTopic:
			h.Topics = append(h.Topics, target.String)
		case kindUser:
			u, err := strconv.ParseInt(target.String, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("holds: %s holds user %q: %w", id, target.String, err)
			}
			h.Users = append(h.Users, message.ID(u))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("holds: list: %w", err)
	}
	for i := range out {
		slices.Sort(out[i].Users) // stored as text: "10" sorts before "9"
	}
	return out, nil
}

// heldUsers maps every held user to why: "hold H: reason" (several holds
// joined with "; ").
func heldUsers(ctx context.Context, db *sql.DB) (map[int64]string, error) {
	out := map[int64]string{}
	err := eachTarget(ctx, db, sq.Eq{"t.kind": kindUser}, func(_, target, why string) error {
		u, err := strconv.ParseInt(target, 10, 64)
		if err != nil {
			return fmt.Errorf("holds: held user %q: %w", target, err)
		}
		out[u] = joinWhy(out[u], why)
		return nil
	})
	return out, err
}

// heldTopics maps each of topics that a hold names to why.
func heldTopics(ctx context.Context, db *sql.DB, topics []string) (map[string]string, error) {
	out := map[string]string{}
	for len(topics) > 0 {
		part := topics[:min(len(topics), holdBatch)]
		topics = topics[len(part):]
		if err := eachTarget(ctx, db, sq.Eq{"t.kind": kindTopic, "t.target": part}, func(_, target, why string) error {
			out[target] = joinWhy(out[target], why)
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// eraseHolds is what holds keep of an erase's batch, in one read (one
// statement for up to holdBatch topics): why user is held ("" when not)
// and why each of topics that a hold names is.
func eraseHolds(ctx context.Context, db *sql.DB, user int64, topics []string) (string, map[string]string, error) {
	userWhy, held := "", map[string]string{}
	first := true
	for first || len(topics) > 0 {
		part := topics[:min(len(topics), holdBatch)]
		topics = topics[len(part):]
		where := sq.Or{}
		if first {
			where = append(where, sq.Eq{"t.kind": kindUser, "t.target": strconv.FormatInt(user, 10)})
		}
		if len(part) > 0 {
			where = append(where, sq.Eq{"t.kind": kindTopic, "t.target": part})
		}
		first = false
		if err := eachTarget(ctx, db, where, func(kind, target, why string) error {
			if kind == kindUser {
				userWhy = joinWhy(userWhy, why)
			} else {
				held[target] = joinWhy(held[target], why)
			}
			return nil
		}); err != nil {
			return "", nil, err
		}
	}
	return userWhy, held, nil
}

// eachTarget calls fn with each target matching where, its kind and why it
// is held.
func eachTarget(ctx context.Context, db *sql.DB, where sq.Sqlizer, fn func(kind, target, why string) error) error {
	rows, err := sq.Select("t.kind", "t.target", "h.hold_id", "h.reason").From(targetsTable+" t").
		Join(holdsTable+" h ON h.hold_id = t.hold_id").Where(where).OrderBy("t.target", "h.hold_id").
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("holds: targets: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, target, id, reason string
		if err := rows.Scan(&kind, &target, &id, &reason); err != nil {
			return fmt.Errorf("holds: scan target: %w", err)
		}
		if err := fn(kind, target, "hold "+id+": "+reason); err != nil {
			return err
		}
	}
	return rows.Err()
}

func joinWhy(have, why string) string {
	if have == "" {
		return why
	}
	return have + "; " + why
}

// heldInMonth is heldIn of tenant's month m; an archived month's messages
// of held users are read from its archive (its table may be gone), each
// user's once (the archive has no sender index: every row group is read).
func (r *Retention) heldInMonth(ctx context.Context, db *sql.DB, tenant string, m routing.Month, archived bool, topics []string, users map[int64]string) (map[string]string, error) {
	if !archived {
		return heldIn(ctx, db, m, topics, users)
	}
	held, err := heldTopics(ctx, db, topics)
	if err != nil || len(users) == 0 {
		return held, err
	}
	ids := slices.Sorted(maps.Keys(users))
	for _, u := range ids {
		refs, err := r.p.ArchivedSentBy(ctx, tenant, m, u)
		if err != nil {
			return nil, fmt.Errorf("holds: held user %d in the archive of %s: %w", u, m, err)
		}
		seen := map[string]bool{}
		for _, ref := range refs {
			if seen[ref.Topic] || !slices.Contains(topics, ref.Topic) {
				continue
			}
			seen[ref.Topic] = true
			held[ref.Topic] = joinWhy(held[ref.Topic], "user "+strconv.FormatInt(u, 10)+" under "+users[u])
		}
	}
	return held, nil
}

// heldIn is why each of the month's topics is held (absent: not held): a
// hold naming the topic, or one naming a user who sent a message of it in
// the month (users: heldUsers; the month table is read only when some
// user is held). Only topics of the month are ever reported.
func heldIn(ctx context.Context, db *sql.DB, m routing.Month, topics []string, users map[int64]string) (map[string]string, error) {
	held, err := heldTopics(ctx, db, topics)
	if err != nil || len(users) == 0 {
		return held, err
	}
	t, err := routing.TableFor(m)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, 0, len(users))
	for u := range users {
		ids = append(ids, u)
	}
	slices.Sort(ids)
	for len(ids) > 0 {
		part := ids[:min(len(ids), holdBatch)]
		ids = ids[len(part):]
		q := sq.Select("DISTINCT topic", "from_user").From(t.Quoted()).Where(sq.Eq{"from_user": part})
		if len(topics) <= holdBatch {
			// a few topics: read through (topic, from_user, seqid)
			// instead of scanning the month
			q = q.Where(sq.Eq{"topic": topics})
		}
		rows, err := q.OrderBy("topic", "from_user").RunWith(db).QueryContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("holds: held users in %s: %w", t.Name(), err)
		}
		for rows.Next() {
			var topic string
			var u int64
			if err := rows.Scan(&topic, &u); err != nil {
				rows.Close()
				return nil, fmt.Errorf("holds: scan held users in %s: %w", t.Name(), err)
			}
			held[topic] = joinWhy(held[topic], "user "+strconv.FormatInt(u, 10)+" under "+users[u])
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("holds: held users in %s: %w", t.Name(), err)
		}
	}
	return held, nil
}
