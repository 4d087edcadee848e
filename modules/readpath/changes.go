package readpath

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// Fixed tables of message changes: the changes module writes them (through
// NextChangeSeq and RecordRevision, in its transaction), the reads (admin
// lookups, a stream's catch-up, a device sync) read them here.
const (
	revisionsTable    = "im_message_revisions"
	topicChangesTable = "im_topic_changes"
)

// Changes is a topic's changes after a change_seq, oldest first, as the
// realtime channel announces them, and the topic's last change_seq.
type Changes struct {
	Changes []message.Change
	Last    int64
	// More is set when more than the limit asked for follow.
	More bool
}

// Revision is one change of a message as recorded: the content and head as
// they were before it, who made it and why.
type Revision struct {
	ChangeSeq  int64           `json:"change_seq"`
	Action     string          `json:"action"`
	Version    int             `json:"version"`
	Content    json.RawMessage `json:"content"`
	Head       json.RawMessage `json:"head"`
	Actor      message.ID      `json:"actor"`
	Reason     *string         `json:"reason"`
	ShardMonth string          `json:"shard_month"`
	CreatedAt  message.Time    `json:"created_at"`
}

// NewRevision is a change to record: the message (topic, seq) of the month
// table Month as it was before the change (Content, Head), the version the
// change made, who made it and why (empty: no reason, recorded as NULL).
type NewRevision struct {
	Topic         string
	Month         routing.Month
	Seq           int64
	MessageID     message.ID
	Action        string
	Version       int
	Content, Head json.RawMessage
	Actor         int64
	Reason        string
	ChangeSeq     int64
	At            time.Time
	// SeqIDs: an erase's seqs of the topic (Seq the last of them,
	// MessageID 0); nil for a change of one message
	SeqIDs []int64
}

// NextChangeSeq allocates topic's next change_seq in tx: an upsert, so
// the row lock orders concurrent changes of the topic and a rolled back
// change gives its number back.
func NextChangeSeq(ctx context.Context, tx *sql.Tx, topic string) (int64, error) {
	firsts, err := NextChangeSeqs(ctx, tx, []ChangeRun{{Topic: topic, N: 1}})
	if err != nil {
		return 0, err
	}
	return firsts[0], nil
}

// ChangeRun is a run of N changes of one topic that takes consecutive
// change_seqs; a call names each topic once.
type ChangeRun struct {
	Topic string
	N     int64
}

// NextChangeSeqs allocates each run's change_seqs in tx, as NextChangeSeq
// allocates one, and answers the first of each, in runs order: one upsert
// for all of them (the topics' row locks taken in runs order, sorted by
// topic as a batch's refs are), then one read of what it left (a batch of
// changes of forty topics takes two statements, not forty). The read is
// not the upsert's LAST_INSERT_ID(expr) reported with its result: while a
// tenant moves, its mark triggers make MariaDB report 0 there
// (TestChangeSeqAndCursorUnderTheMoveTriggers).
func NextChangeSeqs(ctx context.Context, tx *sql.Tx, runs []ChangeRun) ([]int64, error) {
	q := sq.Insert(topicChangesTable).Columns("topic", "change_seq")
	topics := make([]string, len(runs))
	for i, r := range runs {
		q = q.Values(r.Topic, r.N)
		topics[i] = r.Topic
	}
	q = q.Suffix("ON DUPLICATE KEY UPDATE change_seq = change_seq + VALUES(change_seq)")
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return nil, fmt.Errorf("readpath: next change_seq: %w", err)
	}
	rows, err := sq.Select("topic", "change_seq").From(topicChangesTable).Where(sq.Eq{"topic": topics}).RunWith(tx).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("readpath: next change_seqs: %w", err)
	}
	defer rows.Close()
	last := make(map[string]int64, len(runs))
	for rows.Next() {
		var topic string
		var cs int64
		if err := rows.Scan(&topic, &cs); err != nil {
			return nil, fmt.Errorf("readpath: next change_seqs: %w", err)
		}
		last[topic] = cs
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("readpath: next change_seqs: %w", err)
	}
	firsts := make([]int64, len(runs))
	for i, r := range runs {
		cs, ok := last[r.Topic]
		if !ok {
			return nil, fmt.Errorf("readpath: next change_seqs: no row of topic %q", r.Topic)
		}
		firsts[i] = cs - r.N + 1
	}
	return firsts, nil
}

// RecordRevision writes r in tx.
func RecordRevision(ctx context.Context, tx *sql.Tx, r NewRevision) error {
	return RecordRevisions(ctx, tx, []NewRevision{r})
}

// RecordRevisions writes rs in tx, in one statement.
func RecordRevisions(ctx context.Context, tx *sql.Tx, rs []NewRevision) error {
	if len(rs) == 0 {
		return nil
	}
	q := sq.Insert(revisionsTable).
		Columns("topic", "shard_month", "seqid", "message_id", "action", "version", "content", "head", "actor", "reason", "change_seq", "seq_ids", "created_at")
	for _, r := range rs {
		var reason, seqs any
		if r.Reason != "" {
			reason = r.Reason
		}
		if r.SeqIDs != nil {
			b, err := json.Marshal(r.SeqIDs)
			if err != nil {
				return fmt.Errorf("readpath: record revision: %w", err)
			}
			seqs = string(b)
		}
		q = q.Values(r.Topic, r.Month.String(), r.Seq, int64(r.MessageID), r.Action, r.Version, message.JSONColumn(r.Content),
			message.JSONColumn(r.Head), r.Actor, reason, r.ChangeSeq, seqs, r.At)
	}
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("readpath: record revision: %w", err)
	}
	return nil
}

// ChangesAfter reads up to limit changes of topic with change_seq > after,
// oldest first, and the topic's last change_seq (0: never changed).
func ChangesAfter(ctx context.Context, db *sql.DB, topic string, after int64, limit int) (Changes, error) {
	var out Changes
	err := sq.Select("change_seq").From(topicChangesTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&out.Last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Changes{}, fmt.Errorf("readpath: topic changes: %w", err)
	}
	if out.Last <= after {
		return out, nil
	}
	rows, err := sq.Select("change_seq", "seqid", "message_id", "action", "version", "actor", "created_at", "seq_ids").
		From(revisionsTable).Where(sq.And{sq.Eq{"topic": topic}, sq.Gt{"change_seq": after}}).
		OrderBy("change_seq").Limit(uint64(limit) + 1).RunWith(db).QueryContext(ctx)
	if err != nil {
		return Changes{}, fmt.Errorf("readpath: changes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		c := message.Change{Topic: topic}
		var id, actor int64
		var seqs []byte
		if err := rows.Scan(&c.ChangeSeq, &c.Seq, &id, &c.Action, &c.Version, &actor, &c.At.Time, &seqs); err != nil {
			return Changes{}, fmt.Errorf("readpath: changes: %w", err)
		}
		if seqs != nil {
			// an erase: its revision's seqid is its last seq, its change
			// names its first
			if err := json.Unmarshal(seqs, &c.Seqs); err != nil || len(c.Seqs) == 0 {
				return Changes{}, fmt.Errorf("readpath: changes: seq_ids of %s change_seq %d: %q", topic, c.ChangeSeq, seqs)
			}
			c.Seq = c.Seqs[0]
		}
		c.MessageID, c.Actor, c.At = message.ID(id), message.ID(actor), message.NewTime(c.At.Time)
		out.Changes = append(out.Changes, c)
	}
	if len(out.Changes) > limit {
		out.Changes, out.More = out.Changes[:limit], true
	}
	return out, rows.Err()
}

// RevisionsOf reads the changes of message m, oldest first: its own
// revisions, and that of the erase that named its seq (one per topic and
// batch, message_id 0: the seq is in its seq_ids, at or below its seqid,
// the last), shown with m's version, which the erase made (nothing
// changes a deleted message after it).
func RevisionsOf(ctx context.Context, db *sql.DB, m message.Message) ([]Revision, error) {
	cols := []string{"change_seq", "action", "version", "content", "head", "actor", "reason", "COALESCE(shard_month, '')", "created_at"}
	out := []Revision{}
	for _, where := range []sq.Sqlizer{
		sq.Eq{"message_id": int64(m.MessageID)},
		sq.And{sq.Eq{"topic": m.Topic, "action": message.ActionErase}, sq.GtOrEq{"seqid": m.Seq}, sq.Expr("JSON_CONTAINS(seq_ids, ?)", strconv.FormatInt(m.Seq, 10))},
	} {
		rows, err := sq.Select(cols...).From(revisionsTable).Where(where).OrderBy("change_seq", "id").RunWith(db).QueryContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("readpath: revisions: %w", err)
		}
		for rows.Next() {
			var r Revision
			var content, head []byte
			var actor int64
			var reason sql.NullString
			if err := rows.Scan(&r.ChangeSeq, &r.Action, &r.Version, &content, &head, &actor, &reason, &r.ShardMonth, &r.CreatedAt.Time); err != nil {
				rows.Close()
				return nil, fmt.Errorf("readpath: revisions: %w", err)
			}
			r.Content, r.Head, r.Actor = rawOrNull(content), rawOrNull(head), message.ID(actor)
			if reason.Valid {
				r.Reason = &reason.String
			}
			r.CreatedAt = message.NewTime(r.CreatedAt.Time)
			if r.Action == message.ActionErase {
				r.Version = m.Version
			}
			out = append(out, r)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, fmt.Errorf("readpath: revisions: %w", err)
		}
	}
	slices.SortStableFunc(out, func(a, b Revision) int { return cmp.Compare(a.ChangeSeq, b.ChangeSeq) })
	return out, nil
}

// rawOrNull is a JSON column's value, JSON null for SQL NULL.
func rawOrNull(b []byte) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return json.RawMessage(b)
}

// topicChangesBatch bounds the topics of one ChangeTimes statement.
const topicChangesBatch = 500

// ChangeTimes reads the time of each topic's last message change (recall,
// edit, delete for everyone); a topic never changed is absent.
func ChangeTimes(ctx context.Context, db *sql.DB, topics []string) (map[string]time.Time, error) {
	out := make(map[string]time.Time, len(topics))
	for lo := 0; lo < len(topics); lo += topicChangesBatch {
		rows, err := sq.Select("topic", "updated_at").From(topicChangesTable).
			Where(sq.Eq{"topic": topics[lo:min(len(topics), lo+topicChangesBatch)]}).RunWith(db).QueryContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("readpath: topic changes: %w", err)
		}
		for rows.Next() {
			var t string
			var at time.Time
			if err := rows.Scan(&t, &at); err != nil {
				rows.Close()
				return nil, err
			}
			out[t] = at
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
