package acl

// The statements `imshard bench` runs on the membership tables: its
// fixtures, written in bulk, and the raw SQL its read-state paths are
// measured against. They live here so that no other package names the
// tables.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/imshard/imshard/modules/routing"
)

// Group is a group of a benchmark fixture.
type Group struct {
	Topic  string
	ID     int64
	Status string
}

// Member is a membership of a benchmark fixture.
type Member struct {
	Topic string
	User  int64
}

// Cursor is a read cursor of a benchmark fixture.
type Cursor struct {
	User    int64
	Topic   string
	ReadSeq int64
}

// insertRows writes n rows of cols into table in one multi-row INSERT,
// row(i) giving the values of the i-th.
func insertRows(ctx context.Context, db *sql.DB, table string, cols []string, n int, row func(i int) []any) error {
	if n == 0 {
		return nil
	}
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	vals := make([]string, n)
	args := make([]any, 0, n*len(cols))
	for i := range n {
		vals[i] = one
		args = append(args, row(i)...)
	}
	q := "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES " + strings.Join(vals, ", ")
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}); err != nil {
		return fmt.Errorf("acl: insert %d rows into %s: %w", n, table, err)
	}
	return nil
}

// InsertGroups writes gs in one statement.
func InsertGroups(ctx context.Context, db *sql.DB, gs []Group) error {
	return insertRows(ctx, db, GroupsTable, []string{"topic", "group_id", "status"}, len(gs), func(i int) []any {
		return []any{gs[i].Topic, gs[i].ID, gs[i].Status}
	})
}

// InsertMembers writes ms (role member, not muted) in one statement.
func InsertMembers(ctx context.Context, db *sql.DB, ms []Member) error {
	return insertRows(ctx, db, MembersTable, []string{"topic", "user_id"}, len(ms), func(i int) []any {
		return []any{ms[i].Topic, ms[i].User}
	})
}

// InsertCursors writes cs in one statement.
func InsertCursors(ctx context.Context, db *sql.DB, cs []Cursor) error {
	return insertRows(ctx, db, CursorsTable, []string{"user_id", "topic", "read_seq"}, len(cs), func(i int) []any {
		return []any{cs[i].User, cs[i].Topic, cs[i].ReadSeq}
	})
}

// GroupEveryTopic gives every topic of the table quoted that has no group
// one (group id 1, named after the topic), so that reads of its topics are
// allowed.
func GroupEveryTopic(ctx context.Context, db *sql.DB, quoted string) error {
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT IGNORE INTO "+GroupsTable+" (topic, group_id, name) SELECT DISTINCT topic, 1, topic FROM "+quoted)
		return err
	}); err != nil {
		return fmt.Errorf("acl: group the topics of %s: %w", quoted, err)
	}
	return nil
}

// TopicsOf lists the topics user is a member of.
func TopicsOf(ctx context.Context, db *sql.DB, user int64) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SELECT topic FROM "+MembersTable+" WHERE user_id = ?", user)
	if err != nil {
		return nil, fmt.Errorf("acl: topics of %d: %w", user, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// RawUnread is one statement that answers GET /v1/me/unread for a user
// whose topics' messages all lie in the month table quoted: counts above
// the cursor and the user's own newest message, hidden ranges (notHidden,
// a condition on the message row m with one ? for the user) and deleted
// messages excluded. Its arguments: the user as a string, then twice as a
// number.
func RawUnread(quoted, notHidden string) string {
	return "SELECT c.topic, COUNT(*), SUM(m.mention_all OR JSON_CONTAINS(COALESCE(m.mentioned_user_ids, '[]'), JSON_QUOTE(CAST(? AS CHAR)))) " +
		"FROM " + MembersTable + " AS g JOIN " + GroupsTable + " AS gr ON gr.topic = g.topic AND gr.status <> 'dissolved' " +
		"JOIN " + CursorsTable + " AS c ON c.user_id = g.user_id AND c.topic = g.topic " +
		"JOIN " + quoted + " AS m ON m.topic = c.topic AND m.seqid > c.read_seq AND m.status = 'normal' " +
		"AND m.seqid > COALESCE((SELECT MAX(o.seqid) FROM " + quoted + " AS o WHERE o.topic = c.topic AND o.from_user = g.user_id), 0) " +
		"AND " + notHidden + " WHERE g.user_id = ? GROUP BY c.topic LIMIT 1000"
}

// RawList is one statement that answers the first topic-list page of a
// user whose topics' messages all lie in the month table quoted: activity
// order, last seq and last message, unread per topic. Its argument: the
// user.
func RawList(quoted string) string {
	return "SELECT c.topic, c.pinned, MAX(m.created_at) AS act, MAX(m.seqid), " +
		"(SELECT l.content FROM " + quoted + " AS l WHERE l.topic = c.topic AND l.status <> 'deleted' ORDER BY l.seqid DESC LIMIT 1), " +
		"SUM(m.seqid > c.read_seq AND m.status = 'normal' AND m.from_user <> g.user_id) " +
		"FROM " + MembersTable + " AS g JOIN " + GroupsTable + " AS gr ON gr.topic = g.topic AND gr.status <> 'dissolved' " +
		"JOIN " + CursorsTable + " AS c ON c.user_id = g.user_id AND c.topic = g.topic " +
		"JOIN " + quoted + " AS m ON m.topic = c.topic WHERE g.user_id = ? " +
		"GROUP BY c.topic, c.pinned ORDER BY c.pinned DESC, act DESC, c.topic LIMIT 50"
}
