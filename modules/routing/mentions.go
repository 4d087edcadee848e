package routing

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	sq "github.com/Masterminds/squirrel"
)

// mentionsTable is the per-topic mention index (sql/migrations/
// 0007_topic_mentions.sql): one row per (topic, mentioned user, seq) of a
// stored message that is neither recalled nor deleted for everyone, user
// MentionEveryone for a mention of everyone. It is written once per
// message, like the message row, never per member.
const mentionsTable = "im_topic_mentions"

// MentionEveryone is the user_id of a mention of everyone.
const MentionEveryone int64 = 0

// Mention is one entry of the index.
type Mention struct {
	Topic string
	User  int64 // MentionEveryone: the whole group
	Seq   int64
}

// MentionsOf is the index entries of one message.
func MentionsOf(topic string, seq int64, users []int64, everyone bool) []Mention {
	var out []Mention
	if everyone {
		out = append(out, Mention{Topic: topic, User: MentionEveryone, Seq: seq})
	}
	for _, u := range users {
		if u > 0 {
			out = append(out, Mention{Topic: topic, User: u, Seq: seq})
		}
	}
	return out
}

// AddMentions writes entries in the caller's transaction (the one storing
// their messages); an entry already there is left as it is, so a replay
// adds nothing.
func AddMentions(ctx context.Context, tx *sql.Tx, ms []Mention) error {
	if len(ms) == 0 {
		return nil
	}
	q := sq.Insert(mentionsTable).Columns("topic", "user_id", "seq")
	for _, m := range ms {
		q = q.Values(m.Topic, m.User, m.Seq)
	}
	if _, err := q.Suffix("ON DUPLICATE KEY UPDATE seq = seq").RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mentions: add: %w", err)
	}
	return nil
}

// DropMentions removes the entries of one message (a recall or a delete
// for everyone, in its transaction): it no longer counts for anyone.
func DropMentions(ctx context.Context, tx *sql.Tx, ms []Mention) error {
	if len(ms) == 0 {
		return nil
	}
	or := make(sq.Or, len(ms))
	for i, m := range ms {
		or[i] = sq.Eq{"topic": m.Topic, "user_id": m.User, "seq": m.Seq}
	}
	if _, err := sq.Delete(mentionsTable).Where(or).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("mentions: drop: %w", err)
	}
	return nil
}

// mentionsBySeq is the index's (topic, seq) key.
const mentionsBySeq = "idx_topic_seq"

// DropMentionsAt removes every entry of the messages refs (sorted,
// SortRefs), whoever they mention, in one statement by the index's
// (topic, seq) key (sql/migrations/0027_mentions_by_seq.sql), a few ranges
// of it (RefsSpanCond): a user erase's batch, which drops its messages'
// entries without reading the message rows for their mentioned users. A
// message that was recalled or deleted has none left, so the entries that
// go are those of the messages still normal.
func DropMentionsAt(ctx context.Context, tx *sql.Tx, refs []MessageRef) error {
	if len(refs) == 0 {
		return nil
	}
	cond, args, err := RefsSpanCond(refs, "x.topic", "x.seq").ToSql()
	if err != nil {
		return err
	}
	// the index named: left to choose, the optimizer weighs the primary
	// key's topic prefix too, range by range, which took longer than the
	// delete (docs/performance.md, "Retention")
	if _, err := tx.ExecContext(ctx, "DELETE x FROM "+mentionsTable+" AS x FORCE INDEX ("+mentionsBySeq+") WHERE "+cond, args...); err != nil {
		return fmt.Errorf("mentions: drop %d messages' entries: %w", len(refs), err)
	}
	return nil
}

// MentionsAboveQuery is the statement reading a user's entries of the index
// (alias x) — theirs and everyone's — above a cursor in each of branches
// topics, leaving out the ranges the user hid (notHidden: that condition
// on x.topic and x.seq, with one placeholder, the user): two ranges of the
// primary key (topic, user_id, seq) per topic. Its placeholders: the user,
// then a topic and its cursor per branch, then the user again. Recalled and
// deleted messages have no entries (the change drops them) and neither do
// gaps. A message that mentions the user and everyone has two entries and
// is read once: DISTINCT.
func MentionsAboveQuery(branches int, notHidden string) string {
	return "SELECT DISTINCT x.topic, x.seq FROM " + mentionsTable + " AS x WHERE x.user_id IN (?, 0) AND (" +
		strings.Repeat("(x.topic = ? AND x.seq > ?) OR ", branches-1) + "(x.topic = ? AND x.seq > ?)) " +
		"AND " + notHidden
}

// legacyMentioned unnests the ids a legacy row aliased alias mentions, one
// row each as j.user_id: written as numbers or as strings, anything else
// NULL.
func legacyMentioned(alias string) string {
	return "JSON_TABLE(" + alias + ".mentioned_user_ids, '$[*]' COLUMNS (user_id BIGINT PATH '$' NULL ON ERROR)) AS j"
}

// LegacyMentioning is a condition on a legacy row aliased alias (a name
// from the code, never from a request): it mentions the user bound to its
// one placeholder, or everyone — the entries CopyLegacyMentions makes of
// it, read from the row itself while the index does not hold them yet.
// Whether the row counts at all (its status, the caller's hiding) is the
// caller's condition, as for the index.
func LegacyMentioning(alias string) string {
	return "(" + alias + ".mention_all <> 0 OR EXISTS (SELECT 1 FROM " +
		legacyMentioned(alias) + " WHERE j.user_id = ?))"
}

// CopyLegacyMentions indexes, in the backfill's transaction, the mentions
// of the legacy rows where (over the legacy table as l, joined to the
// splits as s) selects that are neither recalled nor deleted: one
// INSERT … SELECT on the server, the mentioned ids unnested by JSON_TABLE
// (ids written as numbers or as strings), mention_all as MentionEveryone.
func CopyLegacyMentions(ctx context.Context, tx *sql.Tx, where sq.Sqlizer) error {
	from := LegacyQuoted() + " AS l"
	ids := sq.Select("l.topic", "j.user_id", "l.seqid").
		From(from + " CROSS JOIN " + legacyMentioned("l")).
		Join(SplitsJoin).Where(where).Where("l.status = 'normal'").Where("j.user_id > 0")
	all := sq.Select("l.topic", fmt.Sprint(MentionEveryone), "l.seqid").From(from).
		Join(SplitsJoin).Where(where).Where("l.status = 'normal'").Where("l.mention_all <> 0")
	_, err := sq.Insert(mentionsTable).Columns("topic", "user_id", "seq").Select(ids.Suffix("UNION ALL").SuffixExpr(all)).
		Suffix("ON DUPLICATE KEY UPDATE seq = " + mentionsTable + ".seq").RunWith(tx).ExecContext(ctx)
	if err != nil {
		return fmt.Errorf("mentions: copy legacy: %w", err)
	}
	return nil
}

// DropMentionsBelow removes the entries of each floor's topic for seqs
// below its floor (past retention), at most limit per statement, many
// topics in one; it reports how many went.
func DropMentionsBelow(ctx context.Context, tx *sql.Tx, floors []Floor, limit uint64) (int64, error) {
	if len(floors) == 0 {
		return 0, nil
	}
	below := make(sq.Or, len(floors))
	for i, f := range floors {
		below[i] = sq.And{sq.Eq{"topic": f.Topic}, sq.Lt{"seq": f.Seq}}
	}
	res, err := sq.Delete(mentionsTable).Where(below).Limit(limit).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("mentions: drop below the floors of %d topics: %w", len(floors), err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}
