package readpath

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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
}

// NextChangeSeq allocates topic's next change_seq in tx: an upsert through
// LAST_INSERT_ID, so the row lock orders concurrent changes of the topic
// and a rolled back change gives its number back.
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
// topic as a batch's refs are), then, for more than one topic, one read of
// what it left (a batch of changes of forty topics takes two statements,
// not forty).
func NextChangeSeqs(ctx context.Context, tx *sql.Tx, runs []ChangeRun) ([]int64, error) {
	q := sq.Insert(topicChangesTable).Columns("topic", "change_seq")
	if len(runs) == 1 {
		q = q.Values(runs[0].Topic, sq.Expr("LAST_INSERT_ID(?)", runs[0].N)).
			Suffix("ON DUPLICATE KEY UPDATE change_seq = LAST_INSERT_ID(change_seq + ?)", runs[0].N)
	} else {
		for _, r := range runs {
			q = q.Values(r.Topic, r.N)
		}
		q = q.Suffix("ON DUPLICATE KEY UPDATE change_seq = change_seq + VALUES(change_seq)")
	}
	res, err := q.RunWith(tx).ExecContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("readpath: next change_seq: %w", err)
	}
	last := make(map[string]int64, len(runs))
	if len(runs) == 1 {
		if last[runs[0].Topic], err = res.LastInsertId(); err != nil {
			return nil, fmt.Errorf("readpath: next change_seq: %w", err)
		}
	} else {
		topics := make([]string, len(runs))
		for i, r := range runs {
			topics[i] = r.Topic
		}
		rows, err := sq.Select("topic", "change_seq").From(topicChangesTable).Where(sq.Eq{"topic": topics}).RunWith(tx).QueryContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("readpath: next change_seqs: %w", err)
		}
		defer rows.Close()
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
		Columns("topic", "shard_month", "seqid", "message_id", "action", "version", "content", "head", "actor", "reason", "change_seq", "created_at")
	for _, r := range rs {
		var reason any
		if r.Reason != "" {
			reason = r.Reason
		}
		q = q.Values(r.Topic, r.Month.String(), r.Seq, int64(r.MessageID), r.Action, r.Version, message.JSONColumn(r.Content),
			message.JSONColumn(r.Head), r.Actor, reason, r.ChangeSeq, r.At)
	}
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("readpath: record revision: %w", err)
	}
	return nil
}

// RecordErasedRevisions writes the revisions of an erase of the messages
// refs (sorted, each changed by the erase) of month table t in tx, as
// RecordRevisions would write them from rs: one per message with its
// version after the change, no content or head, action, actor and reason
// alike, and the change_seqs of each topic's run numbered in seq order
// from firsts[topic]. One INSERT … SELECT from the month table: the
// rows' ids and versions never leave MySQL, and the statement carries the
// refs instead of every column of a thousand rows.
func RecordErasedRevisions(ctx context.Context, tx *sql.Tx, t routing.Table, refs []routing.MessageRef, firsts map[string]int64,
	action string, actor int64, reason string, at time.Time) error {
	if len(refs) == 0 {
		return nil
	}
	var why any
	if reason != "" {
		why = reason
	}
	first := sq.Case("m.topic")
	for topic, seq := range firsts {
		first = first.When(sq.Expr("?", topic), sq.Expr("?", seq))
	}
	sel := sq.Select().Column("m.topic").Column("?", t.Month().String()).Columns("m.seqid", "m.message_id").Column("?", action).
		Columns("m.version", "NULL", "NULL").Column("?", actor).Column("?", why).
		Column(sq.Expr("(?) + ROW_NUMBER() OVER (PARTITION BY m.topic ORDER BY m.seqid) - 1", first)).Column("?", at).
		From(t.Quoted() + " AS m").Where(routing.RefsCond(refs, "m.topic", "m.seqid"))
	q := sq.Insert(revisionsTable).
		Columns("topic", "shard_month", "seqid", "message_id", "action", "version", "content", "head", "actor", "reason", "change_seq", "created_at").
		Select(sel)
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("readpath: record erased revisions: %w", err)
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
	rows, err := sq.Select("change_seq", "seqid", "message_id", "action", "version", "actor", "created_at").
		From(revisionsTable).Where(sq.And{sq.Eq{"topic": topic}, sq.Gt{"change_seq": after}}).
		OrderBy("change_seq").Limit(uint64(limit) + 1).RunWith(db).QueryContext(ctx)
	if err != nil {
		return Changes{}, fmt.Errorf("readpath: changes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		c := message.Change{Topic: topic}
		var id, actor int64
		if err := rows.Scan(&c.ChangeSeq, &c.Seq, &id, &c.Action, &c.Version, &actor, &c.At.Time); err != nil {
			return Changes{}, fmt.Errorf("readpath: changes: %w", err)
		}
		c.MessageID, c.Actor, c.At = message.ID(id), message.ID(actor), message.NewTime(c.At.Time)
		out.Changes = append(out.Changes, c)
	}
	if len(out.Changes) > limit {
		out.Changes, out.More = out.Changes[:limit], true
	}
	return out, rows.Err()
}

// RevisionsOf reads the changes of message id, oldest first.
func RevisionsOf(ctx context.Context, db *sql.DB, id message.ID) ([]Revision, error) {
	rows, err := sq.Select("change_seq", "action", "version", "content", "head", "actor", "reason", "COALESCE(shard_month, '')", "created_at").
		From(revisionsTable).Where(sq.Eq{"message_id": int64(id)}).OrderBy("change_seq", "id").
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("readpath: revisions: %w", err)
	}
	defer rows.Close()
	out := []Revision{}
	for rows.Next() {
		var r Revision
		var content, head []byte
		var actor int64
		var reason sql.NullString
		if err := rows.Scan(&r.ChangeSeq, &r.Action, &r.Version, &content, &head, &actor, &reason, &r.ShardMonth, &r.CreatedAt.Time); err != nil {
			return nil, fmt.Errorf("readpath: revisions: %w", err)
		}
		r.Content, r.Head, r.Actor = rawOrNull(content), rawOrNull(head), message.ID(actor)
		if reason.Valid {
			r.Reason = &reason.String
		}
		r.CreatedAt = message.NewTime(r.CreatedAt.Time)
		out = append(out, r)
	}
	return out, rows.Err()
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
