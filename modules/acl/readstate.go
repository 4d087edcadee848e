package acl

// The read state's MySQL side: each user's read cursor and own preferences
// per topic (im_user_read_cursors) and the reads that join them with the
// user's memberships. The cursor table has one writer, this file: a join
// sets the member's cursor, a join or a leave marks the row changed (what a
// device sync compares with), a hide marks it changed, a move raises it, a
// preferences change sets its columns.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// CursorsTable is the read state (im_user_read_cursors): a fixed name,
// never built from input.
const CursorsTable = "im_user_read_cursors"

// Stmts runs a statement as a cached prepared statement (the read path's
// statement cache, modules/readpath): the read state's hot statements are
// of fixed shape and prepared once per tenant database.
type Stmts interface {
	Run(ctx context.Context, db *sql.DB, query string, args []any) (*sql.Rows, error)
	Exec(ctx context.Context, db *sql.DB, tx *sql.Tx, query string, args []any) (sql.Result, error)
}

// Prefs are a user's own settings of a topic.
type Prefs struct {
	Pinned     bool
	NotifyMute sql.NullTime // notify_muted_until
}

// ReadState is a user's cursor row of a topic (zero when there is none).
type ReadState struct {
	ReadSeq int64
	Prefs
}

// MemberTopic is one topic of a user's memberships as MySQL holds it: the
// group's status and the user's read state; JoinedAt and ChangedAt (the
// newest of membership, group and cursor) only when asked for.
type MemberTopic struct {
	Topic       string
	GroupStatus string
	ReadState
	JoinedAt  time.Time
	ChangedAt time.Time
}

// PrefsChange is a preferences change; a nil field stays as it is.
type PrefsChange struct {
	Pinned         *bool
	NotifyMute     *time.Time
	ClearNotifyMut bool // notify_muted_until: null
}

// Changed is a cursor row changed after a time (a leave touches it).
type Changed struct {
	Topic string
	At    time.Time
}

// touchCursor raises the user's read cursor of topic to at least seq and
// marks the row changed.
func touchCursor(ctx context.Context, tx *sql.Tx, topic string, userID, seq int64) error {
	_, err := sq.Insert(CursorsTable).Columns("user_id", "topic", "read_seq").Values(userID, topic, seq).
		Suffix("ON DUPLICATE KEY UPDATE read_seq = GREATEST(read_seq, VALUES(read_seq)), updated_at = CURRENT_TIMESTAMP(3)").
		RunWith(tx).ExecContext(ctx)
	return err
}

// TouchReadState marks the caller's read state of topic changed (a hide),
// so a device sync reports the topic.
func TouchReadState(ctx context.Context, db *sql.DB, user int64, topic string) error {
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Insert(CursorsTable).Columns("user_id", "topic").Values(user, topic).
			Suffix("ON DUPLICATE KEY UPDATE updated_at = CURRENT_TIMESTAMP(3)").RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("acl: touch the read state %s/%d: %w", topic, user, err)
	}
	return nil
}

// MembersOf reads every topic user is a member of (one index range of
// im_group_members joined with the group and the cursor); dissolved
// groups are kept, flagged by status, for sync. It is a cached prepared
// statement of fixed shape, whatever the number of topics. Without times,
// JoinedAt and ChangedAt are left zero (JoinTimes reads the join times a
// caller needs): the range then stays within the members' (user_id) index,
// not a row lookup per membership.
func MembersOf(ctx context.Context, st Stmts, db *sql.DB, user int64, times bool) ([]MemberTopic, error) {
	cols := []string{"m.topic", "g.status", "COALESCE(c.read_seq, 0)", "COALESCE(c.pinned, 0)", "c.notify_muted_until"}
	if times {
		cols = append(cols, "m.created_at", "GREATEST(m.updated_at, g.updated_at, COALESCE(c.updated_at, m.updated_at))")
	}
	query, args, err := sq.Select(cols...).
		From(MembersTable + " AS m").
		Join(GroupsTable + " AS g ON g.topic = m.topic").
		LeftJoin(CursorsTable + " AS c ON c.user_id = m.user_id AND c.topic = m.topic").
		Where(sq.Eq{"m.user_id": user}).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := st.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("acl: topics of %d: %w", user, err)
	}
	defer rows.Close()
	var out []MemberTopic
	for rows.Next() {
		var u MemberTopic
		dest := []any{&u.Topic, &u.GroupStatus, &u.ReadSeq, &u.Pinned, &u.NotifyMute}
		if times {
			dest = append(dest, &u.JoinedAt, &u.ChangedAt)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("acl: topics of %d: %w", user, err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// MemberMirrors reads the route mirrors of every topic user is a member of
// (one statement of fixed shape, through the members' (user_id) index).
func MemberMirrors(ctx context.Context, st Stmts, db *sql.DB, user int64) (map[string]routing.TopicMirror, error) {
	query, args, err := routing.MirrorOf(MembersTable+" AS m", "m.topic", sq.Eq{"m.user_id": user}).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := st.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("acl: mirrors of %d: %w", user, err)
	}
	mirrors := map[string]routing.TopicMirror{}
	return mirrors, routing.ScanMirror(rows, mirrors)
}

// JoinTimes is when user joined each of topics they are a member of (one
// statement naming them; none for no topic).
func JoinTimes(ctx context.Context, db *sql.DB, user int64, topics []string) (map[string]time.Time, error) {
	out := make(map[string]time.Time, len(topics))
	if len(topics) == 0 {
		return out, nil
	}
	rows, err := sq.Select("topic", "created_at").From(MembersTable).
		Where(sq.Eq{"user_id": user, "topic": topics}).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("acl: join times of %d: %w", user, err)
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var at time.Time
		if err := rows.Scan(&t, &at); err != nil {
			return nil, fmt.Errorf("acl: join times of %d: %w", user, err)
		}
		out[t] = at
	}
	return out, rows.Err()
}

// memberships reads the topics user is a member of that are not
// dissolved, with their read states (one index range of im_group_members
// joined with the group and the cursor): what the user's cached entry
// holds (FillCursors).
func memberships(ctx context.Context, st Stmts, db *sql.DB, user int64) ([]MemberTopic, error) {
	query, args, err := sq.Select("m.topic", "COALESCE(c.read_seq, 0)", "COALESCE(c.pinned, 0)", "c.notify_muted_until").From(MembersTable + " AS m").
		Join(GroupsTable + " AS g ON g.topic = m.topic").
		LeftJoin(CursorsTable + " AS c ON c.user_id = m.user_id AND c.topic = m.topic").
		Where(sq.Eq{"m.user_id": user}).Where(sq.NotEq{"g.status": GroupDissolved}).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := st.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("acl: memberships of %d: %w", user, err)
	}
	defer rows.Close()
	var out []MemberTopic
	for rows.Next() {
		var u MemberTopic
		if err := rows.Scan(&u.Topic, &u.ReadSeq, &u.Pinned, &u.NotifyMute); err != nil {
			return nil, fmt.Errorf("acl: memberships of %d: %w", user, err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// MarkRead moves user's cursor of topic up to seq (never down) in one
// statement and returns the cursor it holds afterwards: the
// LAST_INSERT_ID(expr) form leaves the row's value in the session, read
// back in the same transaction (routing.LastInsertID).
// It is a cached prepared statement, run in a fenced transaction: running
// it twice is the same as once. The caller decided the membership
// (MoveCursor).
func MarkRead(ctx context.Context, st Stmts, db *sql.DB, user int64, topic string, seq int64) (int64, error) {
	query, args, err := sq.Insert(CursorsTable).Columns("user_id", "topic", "read_seq").Values(user, topic, seq).
		Suffix("ON DUPLICATE KEY UPDATE read_seq = LAST_INSERT_ID(GREATEST(read_seq, VALUES(read_seq)))").ToSql()
	if err != nil {
		return 0, err
	}
	held, err := routing.FencedValue(ctx, db, func(tx *sql.Tx) (int64, error) {
		res, err := st.Exec(ctx, db, tx, query, args)
		if err != nil {
			return 0, err
		}
		if n, err := res.RowsAffected(); err == nil && n == 1 {
			return seq, nil // inserted
		}
		return routing.LastInsertID(ctx, tx)
	})
	if err != nil {
		return 0, fmt.Errorf("acl: read cursor %s/%d: %w", topic, user, err)
	}
	return held, nil
}

// PutPrefs sets user's preferences of topic; a nil field of pr leaves one
// as it is.
func PutPrefs(ctx context.Context, db *sql.DB, user int64, topic string, pr PrefsChange) error {
	b := sq.Insert(CursorsTable)
	cols, vals, upd := []string{"user_id", "topic"}, []any{user, topic}, ""
	if pr.Pinned != nil {
		cols, vals = append(cols, "pinned"), append(vals, *pr.Pinned)
		upd = "pinned = VALUES(pinned)"
	}
	if pr.NotifyMute != nil || pr.ClearNotifyMut {
		var v any
		if pr.NotifyMute != nil {
			v = pr.NotifyMute.UTC()
		}
		cols, vals = append(cols, "notify_muted_until"), append(vals, v)
		if upd != "" {
			upd += ", "
		}
		upd += "notify_muted_until = VALUES(notify_muted_until)"
	}
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := b.Columns(cols...).Values(vals...).Suffix("ON DUPLICATE KEY UPDATE " + upd).RunWith(tx).ExecContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("acl: preferences %s/%d: %w", topic, user, err)
	}
	return nil
}

// ReadStateOf is user's cursor row of topic (zero if none).
func ReadStateOf(ctx context.Context, db *sql.DB, user int64, topic string) (ReadState, error) {
	var r ReadState
	err := sq.Select("read_seq", "pinned", "notify_muted_until").From(CursorsTable).
		Where(sq.Eq{"user_id": user, "topic": topic}).RunWith(db).QueryRowContext(ctx).Scan(&r.ReadSeq, &r.Pinned, &r.NotifyMute)
	if errors.Is(err, sql.ErrNoRows) {
		return ReadState{}, nil
	}
	if err != nil {
		return ReadState{}, fmt.Errorf("acl: read state %s/%d: %w", topic, user, err)
	}
	return r, nil
}

// ChangedSince lists user's cursor rows changed after since; a sync keeps
// those of topics the user is no longer a member of.
func ChangedSince(ctx context.Context, db *sql.DB, user int64, since time.Time) ([]Changed, error) {
	rows, err := sq.Select("topic", "updated_at").From(CursorsTable).
		Where(sq.Eq{"user_id": user}).Where(sq.Gt{"updated_at": since.UTC()}).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("acl: cursors of %d: %w", user, err)
	}
	defer rows.Close()
	var out []Changed
	for rows.Next() {
		var l Changed
		if err := rows.Scan(&l.Topic, &l.At); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// DropTopicCursors removes up to limit read cursors (and preferences) of
// topic, for a group purge; it reports how many went.
func DropTopicCursors(ctx context.Context, tx *sql.Tx, topic string, limit uint64) (int64, error) {
	res, err := sq.Delete(CursorsTable).Where(sq.Eq{"topic": topic}).Limit(limit).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("acl: drop cursors of %s: %w", topic, err)
	}
	return res.RowsAffected()
}

// DropUserCursors removes up to limit of user's read cursors (and
// preferences) in every topic, for a user erase; it reports how many went.
func DropUserCursors(ctx context.Context, tx *sql.Tx, user int64, limit uint64) (int64, error) {
	res, err := sq.Delete(CursorsTable).Where(sq.Eq{"user_id": user}).Limit(limit).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("acl: drop cursors of user %d: %w", user, err)
	}
	return res.RowsAffected()
}
