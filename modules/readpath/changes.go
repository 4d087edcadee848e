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
	return NextChangeSeqs(ctx, tx, topic, 1)
}

// NextChangeSeqs allocates n consecutive change_seqs of topic in tx, as
// NextChangeSeq allocates one, and returns the first: a batch of changes of
// the topic takes its numbers in one statement and one row lock.
func NextChangeSeqs(ctx context.Context, tx *sql.Tx, topic string, n int64) (int64, error) {
	res, err := sq.Insert(topicChangesTable).Columns("topic", "change_seq").Values(topic, sq.Expr("LAST_INSERT_ID(?)", n)).
		Suffix("ON DUPLICATE KEY UPDATE change_seq = LAST_INSERT_ID(change_seq + ?)", n).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("readpath: next change_seq: %w", err)
	}
	last, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("readpath: next change_seq: %w", err)
	}
	return last - n + 1, nil
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
