// Package feed is the change feed's outbox: every change of a stored
// message (a recall, an edit, a delete for everyone, and whatever later
// kind of change a job makes) is written here as a change event, in the
// same MySQL transaction as its revision, and the relay role produces the
// events to kafka.changes_topic (docs/events.md, "The change event").
//
// The package owns the outbox table (im_change_outbox): Record writes a
// row inside the caller's transaction; Pending, Delete and the relay lock
// are the relay's side. It is a library, not a role: the changes module
// and any job that changes messages call Record, the relay module reads.
//
// Why an outbox beside the revisions rather than the revisions themselves:
// a revision keeps the content as it was *before* its change (the history
// the revisions route shows), while a consumer needs the message as it is
// *after* it; and the revisions are kept for as long as their month, while
// an outbox row is deleted as soon as the broker acknowledged its event.
package feed

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/message"
)

// EventVersion is the "v" of the change event contract.
const EventVersion = 1

// outboxTable is the outbox (sql/migrations/0011_change_feed.sql).
const outboxTable = "im_change_outbox"

// Event is one change event, the record value on kafka.changes_topic
// (docs/events.md). (Tenant, Topic, ChangeSeq) names it: a redelivery
// repeats all three.
type Event struct {
	V         int    `json:"v"`
	Tenant    string `json:"tenant"`
	Topic     string `json:"topic"`
	ChangeSeq int64  `json:"change_seq"`
	// Action is message.ActionRecall, ActionEdit or ActionDelete; a job
	// that changes messages may add its own.
	Action     string       `json:"action"`
	SeqID      int64        `json:"seq_id"`
	MessageID  message.ID   `json:"message_id"`
	ShardMonth string       `json:"shard_month"`
	Version    int          `json:"version"`
	Actor      message.ID   `json:"actor"`
	Reason     string       `json:"reason,omitempty"`
	At         message.Time `json:"at"`
	// Message is the message as it is after the change, as the API shows
	// it; nil when the change removed it or changed several (an erase).
	Message *message.Message `json:"message,omitempty"`
	// SeqIDs: the seqs an erase (message.ActionErase) made tombstones,
	// ascending, SeqID the first; absent on every other action.
	SeqIDs []int64 `json:"seq_ids,omitempty"`
}

// Key is the record key, as the message events': tenant/topic keeps a
// topic's changes in one partition, in change_seq order.
func (e *Event) Key() []byte { return []byte(e.Tenant + "/" + e.Topic) }

// Record writes ev to the outbox in tx — the transaction that made the
// change, allocated ev.ChangeSeq (readpath.NextChangeSeq) and recorded its
// revision — so the event exists exactly when the change committed. The
// topic's change_seq row lock, held until the commit, is what makes the
// relay's per-topic order hold: a topic's next change cannot write its row
// before this one committed. Any job that changes stored messages (a
// purge, an erasure) calls it the same way, one event per change_seq it
// allocates, with its own Action and with Message nil where the message is
// gone.
func Record(ctx context.Context, tx *sql.Tx, ev Event) error {
	return RecordAll(ctx, tx, []Event{ev})
}

// RecordAll writes evs to the outbox in tx, in one statement, as Record
// writes one: a batch of changes (a user erase, one event per topic)
// records its events in the order of their rows' ids, so each topic's
// events are in change_seq order as long as evs lists them so.
func RecordAll(ctx context.Context, tx *sql.Tx, evs []Event) error {
	if len(evs) == 0 {
		return nil
	}
	q := sq.Insert(outboxTable).Columns("topic", "change_seq", "event")
	for i := range evs {
		ev := &evs[i]
		ev.V = EventVersion
		b, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("feed: encode change %s/%d: %w", ev.Topic, ev.ChangeSeq, err)
		}
		q = q.Values(ev.Topic, ev.ChangeSeq, b)
	}
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("feed: record changes %s/%d (%d): %w", evs[0].Topic, evs[0].ChangeSeq, len(evs), err)
	}
	return nil
}
