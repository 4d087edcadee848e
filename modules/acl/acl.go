// Package acl is the one authority on memberships: it answers "may this
// user post to / read this topic" — the group behind a topic (its id and
// status), the user's membership (role, mute) and the decision of a read
// (Authorize, Allowed) — and it owns every table and cache that follows a
// membership: the groups and members (im_groups, im_group_members), the
// users' read cursors and preferences (im_user_read_cursors, readstate.go)
// and each user's cached read state in Redis with its scripts
// (cursors.go). MySQL is the truth; Redis caches a topic's group and
// members for acl_cache_ttl and every change invalidates the cache, so a
// removed or muted member loses access at once, not after the TTL. No other
// package names these tables or writes the cached read state (a test in
// test/ keeps it so), so no write of it can skip the membership decision.
package acl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// Group statuses and member roles (docs/api.md).
const (
	GroupActive    = "active"
	GroupMuted     = "muted"
	GroupDissolved = "dissolved"

	RoleMember = "member"
	RoleAdmin  = "admin"
	RoleOwner  = "owner"
)

// ErrNoGroup is returned for a topic that has no group.
var ErrNoGroup = errors.New("topic has no group")

// Membership is what the ACL knows of (topic, user).
type Membership struct {
	GroupID     int64
	GroupStatus string
	Role        string
	MutedUntil  time.Time
	Member      bool
}

// Muted reports whether the member may not post at t: muted personally, or
// the group is muted and the member is not one of its admins/owners.
func (m Membership) Muted(t time.Time) bool {
	if m.MutedUntil.After(t) {
		return true
	}
	return m.GroupStatus == GroupMuted && m.Role != RoleAdmin && m.Role != RoleOwner
}

// The refusals of a member who may not post: send a message, or edit one
// into new text. Send and the message-change path answer them alike.
var (
	ErrDissolved = httpapi.Errorf(httpapi.CodePermissionDenied, "group is dissolved")
	ErrNotMember = httpapi.Errorf(httpapi.CodePermissionDenied, "sender is not a member of the group")
	ErrMuted     = httpapi.Errorf(httpapi.CodePermissionDenied, "sender is muted")
)

// Refusals are the answers to a send, by the reason lua/fenced.lua gives
// when it refuses one from the cached membership; PostRefusal gives the
// same from a membership looked up.
var Refusals = map[string]error{
	"nogroup":   httpapi.Errorf(httpapi.CodeNotFound, "topic has no group"),
	"dissolved": ErrDissolved,
	"notmember": ErrNotMember,
	"muted":     ErrMuted,
}

// PostRefusal is why m may not post at t, nil when it may: a dissolved
// group first (nobody posts there), then a non-member, then a mute. It is
// the one rule behind a send and an edit, so new text never gets in
// through one when the other refuses it.
func (m Membership) PostRefusal(t time.Time) error {
	switch {
	case m.GroupStatus == GroupDissolved:
		return ErrDissolved
	case !m.Member:
		return ErrNotMember
	case m.Muted(t):
		return ErrMuted
	}
	return nil
}

// ErrForbidden refuses a read of a topic to a caller who is not a member.
var ErrForbidden = httpapi.Errorf(httpapi.CodePermissionDenied, "not a member of this topic")

// Allowed turns a membership lookup into the read permission.
func Allowed(m Membership, err error) error {
	if errors.Is(err, ErrNoGroup) {
		return ErrForbidden
	}
	if err != nil {
		return err
	}
	if !m.Member {
		return ErrForbidden
	}
	return nil
}

// Authorize lets members read their topic and the tenant's admins read any.
func (c *Checker) Authorize(ctx context.Context, p httpapi.Principal, topic string) error {
	if err := routing.ValidTopic(topic); err != nil {
		return err
	}
	if p.Role == httpapi.RoleAdmin {
		return nil
	}
	return Allowed(c.Lookup(ctx, p.Tenant, topic, p.UserID))
}

// Params wires a Checker.
type Params struct {
	Redis    rueidis.Client
	KeySpace routing.KeySpace // redis.key_prefix: where every key and channel is named
	Scripts  *routing.Scripts
	DBs      routing.DBs
	TTL      time.Duration // send.acl_cache_ttl
	Log      zerolog.Logger
}

// Checker looks memberships up, Redis first.
type Checker struct {
	p Params
}

// New builds a Checker.
func New(p Params) *Checker {
	if p.TTL <= 0 {
		p.TTL = 5 * time.Minute
	}
	return &Checker{p: p}
}

// GroupsTable and MembersTable are the groups and their members: fixed
// names, never built from input.
const (
	GroupsTable  = "im_groups"
	MembersTable = "im_group_members"
)

// WithGroup left-joins onto b each row's group (alias g) by the topic
// column topicCol; NoGroup is the column that tells a row without one.
func WithGroup(b sq.SelectBuilder, topicCol string) sq.SelectBuilder {
	return b.LeftJoin(GroupsTable + " AS g ON g.topic = " + topicCol)
}

// NoGroup is true for a row WithGroup found no group for.
const NoGroup = "g.topic IS NULL"

// a cached "no such row" is stored as this field value
const absent = "-"

// Lookup returns the membership of userID in topic. The group is cached in
// a HASH per topic; members in a HASH per topic (field user id), each entry
// "role|muted_until_ms" or absent.
func (c *Checker) Lookup(ctx context.Context, tenant, topic string, userID int64) (Membership, error) {
	keys, err := c.p.KeySpace.Tenant(tenant)
	if err != nil {
		return Membership{}, err
	}
	return c.Resolve(ctx, tenant, topic, userID, c.p.Redis.DoMulti(ctx, Cmds(c.p.Redis, keys, topic, userID)...))
}

// Cmds are the Redis reads of a lookup, for a caller that pipelines them
// with reads of its own; Resolve finishes the lookup from their results.
func Cmds(rdb rueidis.Client, keys routing.Keys, topic string, userID int64) []rueidis.Completed {
	return []rueidis.Completed{
		rdb.B().Get().Key(keys.Group(topic)).Build(),
		rdb.B().Hget().Key(keys.Members(topic)).Field(strconv.FormatInt(userID, 10)).Build(),
	}
}

// Resolve is the membership the results of Cmds show; on a cache miss it
// reads MySQL and fills the cache.
func (c *Checker) Resolve(ctx context.Context, tenant, topic string, userID int64, res []rueidis.RedisResult) (Membership, error) {
	group, gerr := res[0].ToString()
	member, merr := res[1].ToString()
	if gerr == nil && merr == nil {
		return decode(group, member)
	}
	keys, err := c.p.KeySpace.Tenant(tenant)
	if err != nil {
		return Membership{}, err
	}
	var version string
	var verr error
	if (gerr != nil && !rueidis.IsRedisNil(gerr)) || (merr != nil && !rueidis.IsRedisNil(merr)) {
		verr = errors.Join(gerr, merr)
	} else {
		version, verr = routing.CacheVersion(ctx, c.p.Redis, keys.ACLVersion(topic))
	}
	cacheable := verr == nil
	if verr != nil {
		c.p.Log.Warn().Err(verr).Str("tenant", tenant).Msg("acl cache unavailable; reading MySQL")
	}
	group, member, err = c.load(ctx, tenant, topic, userID)
	if err != nil {
		return Membership{}, err
	}
	if cacheable {
		// best effort: a failed or refused fill only costs the next lookup a read
		_ = c.p.Scripts.CacheFill.Exec(ctx, c.p.Redis,
			[]string{keys.ACLVersion(topic), keys.Members(topic), keys.Group(topic)},
			[]string{version, strconv.FormatInt(c.p.TTL.Milliseconds(), 10), strconv.FormatInt(userID, 10), member, group}).Error()
	}
	return decode(group, member)
}

func (c *Checker) load(ctx context.Context, tenant, topic string, userID int64) (group, member string, err error) {
	db, err := c.p.DBs.DB(ctx, tenant)
	if err != nil {
		return "", "", err
	}
	var gid int64
	var status string
	err = sq.Select("group_id", "status").From(GroupsTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&gid, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		group = absent
	case err != nil:
		return "", "", fmt.Errorf("acl: group %s: %w", topic, err)
	default:
		group = strconv.FormatInt(gid, 10) + "|" + status
	}
	var role string
	var muted sql.NullTime
	err = sq.Select("role", "muted_until").From(MembersTable).Where(sq.Eq{"topic": topic, "user_id": userID}).
		RunWith(db).QueryRowContext(ctx).Scan(&role, &muted)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		member = absent
	case err != nil:
		return "", "", fmt.Errorf("acl: member %s/%d: %w", topic, userID, err)
	default:
		ms := int64(0)
		if muted.Valid {
			ms = muted.Time.UnixMilli()
		}
		member = role + "|" + strconv.FormatInt(ms, 10)
	}
	return group, member, nil
}

func decode(group, member string) (Membership, error) {
	if group == absent {
		return Membership{}, ErrNoGroup
	}
	var m Membership
	gid, status, ok := cut(group)
	if !ok {
		return Membership{}, fmt.Errorf("acl: malformed cached group %q", group)
	}
	n, err := strconv.ParseInt(gid, 10, 64)
	if err != nil {
		return Membership{}, fmt.Errorf("acl: malformed cached group %q", group)
	}
	m.GroupID, m.GroupStatus = n, status
	if member == absent {
		return m, nil
	}
	role, muted, ok := cut(member)
	if !ok {
		return Membership{}, fmt.Errorf("acl: malformed cached member %q", member)
	}
	ms, err := strconv.ParseInt(muted, 10, 64)
	if err != nil {
		return Membership{}, fmt.Errorf("acl: malformed cached member %q", member)
	}
	m.Member, m.Role = true, role
	if ms > 0 {
		m.MutedUntil = time.UnixMilli(ms).UTC()
	}
	return m, nil
}

func cut(s string) (string, string, bool) { return strings.Cut(s, "|") }

// PutGroup creates or updates the group of topic.
func (c *Checker) PutGroup(ctx context.Context, tenant, topic string, groupID int64, name, status string) error {
	db, err := c.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	var res sql.Result
	err = routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		res, err = sq.Insert(GroupsTable).Columns("topic", "group_id", "name", "status").Values(topic, groupID, name, status).
			Suffix("ON DUPLICATE KEY UPDATE group_id = VALUES(group_id), name = VALUES(name), status = VALUES(status)").
			RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("acl: put group %s: %w", topic, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("acl: put group %s: %w", topic, err)
	}
	// n 1: a new group, which has no members yet (a member is only added
	// to a group that exists), so no cached membership can miss it. Any
	// other call bumps the epoch, whatever it changed: the retry of a
	// dissolve or of its undoing, after a first attempt that committed and
	// failed before the bump, finds the row as it wants it and cannot tell
	// itself from a rename, yet must still make the members' cached
	// memberships follow the status. Groups are changed by the service or
	// an admin, rarely; each bump costs each user one MySQL read on their
	// next badges.
	if n != 1 {
		if err := c.bumpGroupsEpoch(ctx, tenant); err != nil {
			return err
		}
	}
	return c.invalidate(ctx, tenant, topic)
}

// bumpGroupsEpoch makes every user's cached memberships (modules/inbox)
// read again: a group may have been dissolved or brought back. A failure
// is returned, as invalidate's: a dissolved group must not stay in the
// badges, nor a group brought back stay out of them.
func (c *Checker) bumpGroupsEpoch(ctx context.Context, tenant string) error {
	keys, err := c.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	if err := c.p.Redis.Do(ctx, c.p.Redis.B().Incr().Key(keys.GroupsEpoch()).Build()).Error(); err != nil {
		return fmt.Errorf("acl: bump the groups epoch: %w", err)
	}
	return nil
}

// PutMember adds or updates a member.
func (c *Checker) PutMember(ctx context.Context, tenant, topic string, userID int64, role string, mutedUntil *time.Time) error {
	db, err := c.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	var muted any
	if mutedUntil != nil {
		muted = mutedUntil.UTC()
	}
	err = routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		res, err := sq.Insert(MembersTable).Columns("topic", "user_id", "role", "muted_until").Values(topic, userID, role, muted).
			Suffix("ON DUPLICATE KEY UPDATE role = VALUES(role), muted_until = VALUES(muted_until)").
			RunWith(tx).ExecContext(ctx)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return err // an update of an existing member: not a join
		}
		// a join: the read cursor starts at the topic's last stored
		// message, so history is not unread
		last, err := routing.LastStoredSeq(ctx, tx, topic)
		if err != nil {
			return err
		}
		return touchCursor(ctx, tx, topic, userID, last)
	})
	if err != nil {
		return fmt.Errorf("acl: put member %s/%d: %w", topic, userID, err)
	}
	// the user's cached memberships (modules/inbox) may lack the topic:
	// dropped whether or not this call inserted the row, so the retry of a
	// join that committed and failed before the drop — a repeat, or a role
	// or mute change meanwhile — heals it
	if err := c.dropCursorsOf(ctx, tenant, userID); err != nil {
		return err
	}
	return c.invalidate(ctx, tenant, topic)
}

// DeleteMember removes a member.
func (c *Checker) DeleteMember(ctx context.Context, tenant, topic string, userID int64) error {
	db, err := c.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	err = routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		res, err := sq.Delete(MembersTable).Where(sq.Eq{"topic": topic, "user_id": userID}).RunWith(tx).ExecContext(ctx)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		return touchCursor(ctx, tx, topic, userID, 0) // a sync reports the leave
	})
	if err != nil {
		return fmt.Errorf("acl: delete member %s/%d: %w", topic, userID, err)
	}
	// the user's cached memberships (modules/inbox) may still name the
	// topic: dropped whether or not this call deleted the row, so the retry
	// of a leave that committed and failed before the drop heals it
	if err := c.dropCursorsOfLeaver(ctx, tenant, userID); err != nil {
		return err
	}
	return c.invalidate(ctx, tenant, topic)
}

// invalidate drops the topic's cached ACL after MySQL committed a change. A
// failure is returned: the caller must not report success while a stale
// grant could outlive the change by a whole TTL.
func (c *Checker) invalidate(ctx context.Context, tenant, topic string) error {
	keys, err := c.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	// bump the version first: a lookup that read MySQL before this change
	// can then no longer fill the cache with the old answer
	for _, r := range c.p.Redis.DoMulti(ctx,
		c.p.Redis.B().Incr().Key(keys.ACLVersion(topic)).Build(),
		c.p.Redis.B().Del().Key(keys.Group(topic), keys.Members(topic)).Build(),
	) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("acl: invalidate %s: %w", topic, err)
		}
	}
	return nil
}

// SetRetention sets the group's own retention in months (0: keep its
// history forever, whatever its tenant's retention). The group must exist.
func (c *Checker) SetRetention(ctx context.Context, tenant, topic string, months int) error {
	db, err := c.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(GroupsTable).Set("retention_months", months).Where(sq.Eq{"topic": topic}).
			RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("acl: set retention %s: %w", topic, err)
	}
	return nil
}

// GroupRetentions is every group of the tenant database db that has a
// retention of its own: topic → months.
func GroupRetentions(ctx context.Context, db *sql.DB) (map[string]int, error) {
	rows, err := sq.Select("topic", "retention_months").From(GroupsTable).Where(sq.NotEq{"retention_months": nil}).
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("acl: group retentions: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var t string
		var n int
		if err := rows.Scan(&t, &n); err != nil {
			return nil, fmt.Errorf("acl: group retentions: %w", err)
		}
		out[t] = n
	}
	return out, rows.Err()
}

// Retention is the group's own retention in months, nil when it follows
// its tenant's.
func (c *Checker) Retention(ctx context.Context, tenant, topic string) (*int, error) {
	db, err := c.p.DBs.DB(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var v sql.NullInt64
	err = sq.Select("retention_months").From(GroupsTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNoGroup
	}
	if err != nil {
		return nil, fmt.Errorf("acl: retention %s: %w", topic, err)
	}
	if !v.Valid {
		return nil, nil
	}
	n := int(v.Int64)
	return &n, nil
}
