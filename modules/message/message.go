// Package message holds the two shapes a group message takes outside the
// database: the Kafka event (send → persist, docs/events.md) and the
// API message (every HTTP response, the hot cache, the realtime stream).
// Send, persist and query share them through this package, not each other.
package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"time"
)

// EventVersion is the "v" of the Kafka event contract.
const EventVersion = 1

// ID is a 64-bit id that travels as a JSON string (JavaScript clients lose
// precision above 2^53) and is accepted as a string or a number.
type ID int64

// MarshalJSON writes the id as a decimal string.
func (id ID) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(id), 10) + `"`), nil
}

// UnmarshalJSON accepts "123" or 123.
func (id *ID) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return typeError(b, reflect.TypeFor[ID]())
	}
	*id = ID(n)
	return nil
}

// IDs is a list of ids with the same JSON rules.
type IDs []ID

// Event is the Kafka record value. shard_month is frozen at allocation and
// never recomputed by retries, compensation or replays (invariant 2, docs/invariants.md).
type Event struct {
	V                int             `json:"v"`
	EventID          string          `json:"event_id"`
	Tenant           string          `json:"tenant"`
	Topic            string          `json:"topic"`
	GroupID          ID              `json:"group_id"`
	SeqID            int64           `json:"seq_id"`
	ShardMonth       string          `json:"shard_month"`
	MessageID        ID              `json:"message_id"`
	FromUser         ID              `json:"from_user"`
	ClientMsgID      string          `json:"client_msg_id"`
	MsgType          string          `json:"msg_type"`
	Content          json.RawMessage `json:"content"`
	Head             json.RawMessage `json:"head,omitempty"`
	MentionedUserIDs IDs             `json:"mentioned_user_ids,omitempty"`
	MentionAll       bool            `json:"mention_all"`
	ReplySeqID       *int64          `json:"reply_seqid,omitempty"`
	RootSeqID        *int64          `json:"root_seqid,omitempty"`
	CreatedAt        Time            `json:"created_at"`
}

// Key is the Kafka record key: tenant/topic keeps one topic's events in one
// partition, in order.
func (e *Event) Key() []byte { return []byte(e.Tenant + "/" + e.Topic) }

// Status of a message as the API shows it.
const (
	StatusNormal   = "normal"
	StatusRecalled = "recalled"
	StatusDeleted  = "deleted"
)

// Message is a message in every API response (docs/api.md).
// Recalled and deleted messages carry no content, head or mentions.
type Message struct {
	Topic            string          `json:"topic"`
	Seq              int64           `json:"seq"`
	MessageID        ID              `json:"message_id"`
	GroupID          ID              `json:"group_id"`
	FromUser         ID              `json:"from_user"`
	ClientMsgID      string          `json:"client_msg_id"`
	MsgType          string          `json:"msg_type"`
	Status           string          `json:"status"`
	Content          json.RawMessage `json:"content"`
	Head             json.RawMessage `json:"head"`
	MentionedUserIDs IDs             `json:"mentioned_user_ids"`
	MentionAll       bool            `json:"mention_all"`
	ReplySeqID       *int64          `json:"reply_seqid"`
	RootSeqID        *int64          `json:"root_seqid"`
	Version          int             `json:"version"`
	CreatedAt        Time            `json:"created_at"`
	UpdatedAt        Time            `json:"updated_at"`
	// Encoded, when set, is the message's complete rendering, and only
	// Status and the fields Peeked holds are filled above: a hot-cache
	// member passed through to the page as it is (Peek).
	// AppendJSON and MarshalJSON write it.
	Encoded []byte `json:"-"`
}

// MarshalJSON renders m as AppendJSON does (so a message with Encoded set
// renders whole wherever it goes).
func (m Message) MarshalJSON() ([]byte, error) { return m.AppendJSON(nil) }

// FromEvent is the message an event becomes once stored (version 1).
func FromEvent(e *Event) Message {
	m := Message{
		Topic: e.Topic, Seq: e.SeqID, MessageID: e.MessageID, GroupID: e.GroupID, FromUser: e.FromUser,
		ClientMsgID: e.ClientMsgID, MsgType: e.MsgType, Status: StatusNormal, Content: e.Content, Head: e.Head,
		MentionedUserIDs: e.MentionedUserIDs, MentionAll: e.MentionAll, ReplySeqID: e.ReplySeqID,
		RootSeqID: e.RootSeqID, Version: 1, CreatedAt: e.CreatedAt, UpdatedAt: e.CreatedAt,
	}
	return m.Normalized()
}

// Normalized renders JSON-null fields as the contract wants them and strips
// the body of tombstones (recalled/deleted carry no content).
func (m Message) Normalized() Message {
	if m.Encoded != nil {
		return m // Peek passes only normalized members
	}
	if m.Status != StatusNormal && m.Status != "" {
		m.Content, m.Head, m.MentionedUserIDs = nil, nil, nil
	}
	if m.Content == nil {
		m.Content = json.RawMessage("null")
	}
	if m.Head == nil {
		m.Head = json.RawMessage("null")
	}
	if m.MentionedUserIDs == nil {
		m.MentionedUserIDs = IDs{}
	}
	return m
}

// Time is a UTC instant in RFC 3339 with milliseconds, as the API and the
// event contract write it; MySQL keeps DATETIME(3), so nothing finer exists.
type Time struct{ time.Time }

// TimeFormat is the wire format of Time.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// NewTime truncates t to milliseconds in UTC.
func NewTime(t time.Time) Time { return Time{t.UTC().Truncate(time.Millisecond)} }

// MarshalJSON writes RFC 3339 with milliseconds, UTC ("Z").
func (t Time) MarshalJSON() ([]byte, error) {
	return []byte(`"` + t.UTC().Format(TimeFormat) + `"`), nil
}

// UnmarshalJSON reads any RFC 3339 time. A quoted string without escapes
// (every time this package writes) is read in place: the hot cache decodes
// two per cached message on every page it serves.
func (t *Time) UnmarshalJSON(b []byte) error {
	var s string
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && !bytes.ContainsAny(b[1:n-1], `"\`) {
		s = string(b[1 : n-1])
	} else if err := json.Unmarshal(b, &s); err != nil {
		return typeError(b, reflect.TypeFor[Time]())
	}
	p, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return typeError(b, reflect.TypeFor[Time]())
	}
	*t = NewTime(p)
	return nil
}

// Actions of the message-change path.
const (
	ActionRecall = "recall"
	ActionEdit   = "edit"
	ActionDelete = "delete"
	// ActionErase is one change of many messages of a topic (a batch of a
	// user erase): each of Change.Seqs became a tombstone by the delete's
	// rule (status deleted, content, head and mentions cleared, version
	// + 1, updated_at the change's At).
	ActionErase = "erase"
)

// Change is the event a committed recall, edit or delete for everyone
// emits on the topic's realtime channel, after the answer's state is in
// MySQL and no cache serves the old one. ChangeSeq counts the topic's
// changes from 1 without gaps or repeats (allocated in MySQL with the
// change): a consumer that missed some resumes from the revisions. An
// erase (ActionErase) changes every seq of Seqs (ascending; Seq is the
// first), MessageID and Version 0: each message's version moved on by one.
type Change struct {
	Topic     string `json:"topic"`
	Seq       int64  `json:"seq"`
	MessageID ID     `json:"message_id"`
	Action    string `json:"action"`
	Version   int    `json:"version"`
	ChangeSeq int64  `json:"change_seq"`
	Actor     ID     `json:"actor"`
	At        Time   `json:"at"`
	// Seqs: an erase's seqs; absent on every other action
	Seqs []int64 `json:"seqs,omitempty"`
}

// ChangeFrame is the realtime frame of a change, {"type":"change","change":…}:
// what the change path publishes and what a stream's catch-up writes.
func ChangeFrame(c Change) []byte {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Change Change `json:"change"`
	}{"change", c}) // a Change always encodes
	return b
}

// typeError is the error of a JSON value b that is no t: a decoder adds the
// field it was meant for, so a client can be told which one is wrong.
func typeError(b []byte, t reflect.Type) error {
	value, c := "null", byte('n')
	if len(b) > 0 {
		c = b[0]
	}
	switch {
	case c == '"':
		value = "string"
		if len(b) <= 40 {
			value += " " + string(b)
		}
	case c == '{':
		value = "object"
	case c == '[':
		value = "array"
	case c == 't' || c == 'f':
		value = "bool"
	case c != 'n':
		value = "number"
		if len(b) <= 40 {
			value += " " + string(b)
		}
	}
	return &json.UnmarshalTypeError{Value: value, Type: t}
}

// unallocated is how an event that has no group, seq or month yet renders
// those three fields: the send path stores such an event before Redis
// decides them (in the same call that decides them) and fills them in with
// WithAllocation. Tenant, topic and event id, the only fields before them,
// cannot contain it.
const unallocated = `"group_id":"0","seq_id":0,"shard_month":""`

// Unallocated renders e without its group, seq and month (whatever they
// hold): the form the send path stores in the idempotency record.
func Unallocated(e *Event) ([]byte, error) {
	c := *e
	c.GroupID, c.SeqID, c.ShardMonth = 0, 0, ""
	return c.AppendJSON(make([]byte, 0, 256+len(c.Content)+len(c.Head)))
}

// WithAllocation is the JSON of the event raw (an Unallocated rendering)
// with its group, seq and month set: byte for byte what json.Marshal of the
// whole event gives, so a retry re-produces the very same record.
func WithAllocation(raw []byte, groupID ID, seq int64, month string) ([]byte, error) {
	i := bytes.Index(raw, []byte(unallocated))
	if i < 0 {
		return nil, fmt.Errorf("message: event %.80q has no unallocated group, seq and month", raw)
	}
	out := make([]byte, 0, len(raw)+48)
	out = append(out, raw[:i]...)
	out = append(out, `"group_id":"`...)
	out = strconv.AppendInt(out, int64(groupID), 10)
	out = append(out, `","seq_id":`...)
	out = strconv.AppendInt(out, seq, 10)
	out = append(out, `,"shard_month":`...)
	out = strconv.AppendQuote(out, month)
	return append(out, raw[i+len(unallocated):]...), nil
}
