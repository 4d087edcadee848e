// Package robustness holds the recorded history of a robustness run and the
// checkers that read it. A run (test/robustness_test.go) drives real role
// processes with a seeded random workload under injected faults and records
// every request with its answer, every stream frame and every fault, each
// with its time; the checkers then decide, from the history alone, whether
// an invariant of docs/invariants.md was broken. Nothing here talks to a
// server, so every checker is unit-tested against hand-written histories,
// including ones that break its invariant on purpose.
package robustness

import (
	"encoding/json"
	"io"
	"sort"
	"sync"
	"time"
)

// Kind names what an Op did.
type Kind string

// The operations of the workload. Writes change state; reads observe it.
const (
	// writes
	Send      Kind = "send"      // POST /v1/topics/{t}/messages
	Recall    Kind = "recall"    // POST …/messages/{seq}/recall
	Edit      Kind = "edit"      // PATCH …/messages/{seq} with expected_version
	DeleteAll Kind = "delete"    // DELETE …/messages/{seq}?scope=all
	Hide      Kind = "hide"      // POST /v1/topics/{t}/deletions [low, hi)
	Join      Kind = "join"      // PUT /v1/topics/{t}/members/{uid}
	Leave     Kind = "leave"     // DELETE /v1/topics/{t}/members/{uid}
	Dissolve  Kind = "dissolve"  // PUT /v1/topics/{t} status dissolved
	CursorPut Kind = "cursor"    // PUT /v1/topics/{t}/read
	GroupPut  Kind = "group_put" // PUT /v1/topics/{t} (create / reactivate)

	// reads
	PageSince  Kind = "since"  // GET …/messages?since=
	PageBefore Kind = "before" // GET …/messages?before=
	ByID       Kind = "by_id"  // GET /v1/messages/{id}
	BySeq      Kind = "by_seq" // GET …/messages/{seq}
	List       Kind = "list"   // GET /v1/me/topics
	Unread     Kind = "unread" // GET /v1/me/unread
	Sync       Kind = "sync"   // GET /v1/me/sync

	// streams: one StreamOpen per socket, then one Frame op per frame
	// received, then StreamClose; Op.Stream ties them together
	StreamOpen  Kind = "stream_open"
	Frame       Kind = "frame"
	StreamClose Kind = "stream_close"
	// a multi-topic socket's subscribe (Topic, Since, ChangesSince) and
	// unsubscribe (Topic) requests: where following one topic begins and
	// ends on a socket that outlives it
	StreamSubscribe   Kind = "stream_subscribe"
	StreamUnsubscribe Kind = "stream_unsubscribe"

	// Fault marks an injected fault's start (End zero until it was lifted).
	Fault Kind = "fault"
	// Quiesce marks the moment the workload and every fault stopped and
	// the system settled; reads that start after it are the final state
	// the model checkers compare.
	Quiesce Kind = "quiesce"
)

// Msg is a message as an answer or a frame showed it.
type Msg struct {
	Topic     string `json:"topic"`
	Seq       int64  `json:"seq"`
	MessageID string `json:"message_id"`
	SenderID  int64  `json:"sender_id"`
	ClientID  string `json:"client_msg_id,omitempty"`
	Status    string `json:"status"` // normal, recalled, deleted
	Version   int64  `json:"version"`
	Text      string `json:"text,omitempty"` // content.text, "" for a tombstone
}

// Change is a change as its answer or a change frame showed it.
type Change struct {
	Topic     string `json:"topic"`
	Seq       int64  `json:"seq"`
	MessageID string `json:"message_id,omitempty"`
	Action    string `json:"action"` // recall, edit, delete, erase
	Version   int64  `json:"version"`
	ChangeSeq int64  `json:"change_seq"` // 0 when the answer carried none (a repeat)
	// Seqs: an erase frame's seqs (Seq the first), each made a tombstone;
	// it names no message_id and no version
	Seqs []int64 `json:"seqs,omitempty"`
}

// ActionErase is the action of a user erase's change frame: one change of
// every seq of its Seqs.
const ActionErase = "erase"

// TopicEntry is one topic of a list, unread or sync answer.
type TopicEntry struct {
	Topic         string `json:"topic"`
	Removed       bool   `json:"removed,omitempty"` // sync: the caller left or the group is gone
	LastSeq       int64  `json:"last_seq"`
	ReadSeq       int64  `json:"read_seq"`
	Unread        int64  `json:"unread"`
	UnreadCapped  bool   `json:"unread_capped,omitempty"`
	MentionUnread int64  `json:"mention_unread"`
	LastMessage   *Msg   `json:"last_message,omitempty"`
}

// Op is one operation as the client saw it: what it asked, when, and what
// came back. An op whose answer never arrived (a timeout, a reset
// connection) has Status 0 and Err set: its effect is unknown, and the
// checkers treat it as possibly applied at any time after Start.
type Op struct {
	ID     int64  `json:"id"`
	Client int    `json:"client"` // the workload actor (one per goroutine)
	Kind   Kind   `json:"kind"`
	Tenant string `json:"tenant"`
	Topic  string `json:"topic,omitempty"`
	User   int64  `json:"user"`           // the token's sub (the member acted on for join/leave)
	Role   string `json:"role,omitempty"` // the token's role: "", service or admin (admins read any topic)
	Device int    `json:"device,omitempty"`

	Start time.Time `json:"start"`
	End   time.Time `json:"end"`

	Status int    `json:"status"` // HTTP status; 0 = no answer
	Code   string `json:"code,omitempty"`
	Err    string `json:"err,omitempty"`

	// request
	ClientMsgID     string  `json:"client_msg_id,omitempty"` // send
	Text            string  `json:"text,omitempty"`          // send, edit
	Mentions        []int64 `json:"mentions,omitempty"`      // send: mentioned_user_ids
	MentionAll      bool    `json:"mention_all,omitempty"`   // send
	Seq             int64   `json:"seq,omitempty"`           // change, by_seq, cursor, hide low
	HideHi          int64   `json:"hide_hi,omitempty"`       // hide: [Seq, HideHi)
	MessageID       string  `json:"message_id,omitempty"`    // by_id
	ExpectedVersion int64   `json:"expected_version,omitempty"`
	Since           int64   `json:"since,omitempty"`         // since page, stream open (-1: without since)
	ChangesSince    int64   `json:"changes_since,omitempty"` // stream open, subscribe (-1: without changes_since)
	Before          int64   `json:"before,omitempty"`
	Limit           int     `json:"limit,omitempty"`

	// answer
	Messages  []Msg        `json:"messages,omitempty"` // pages, by_id/by_seq (one), send (one: seq, id)
	Gaps      []int64      `json:"gaps,omitempty"`
	NextSince int64        `json:"next_since,omitempty"`
	HasMore   bool         `json:"has_more,omitempty"`
	Change    *Change      `json:"change,omitempty"`   // change answers and change frames
	Topics    []TopicEntry `json:"topics,omitempty"`   // list, unread, sync
	ReadSeq   int64        `json:"read_seq,omitempty"` // cursor answer
	// a 409's details: the message's version (a stale edit) or the wait
	// before a retry (a message not stored yet, which says nothing of its
	// version)
	CurrentVersion int64 `json:"current_version,omitempty"`
	RetryAfterMS   int64 `json:"retry_after_ms,omitempty"`
	// a 409's details.reason: "tenant_moving" when the tenant's writes were
	// held by a move's switch (nothing changed, and nothing is said of the
	// message)
	Reason string `json:"reason,omitempty"`

	// streams
	Stream       int64    `json:"stream,omitempty"`        // the socket's id, shared by its open/frames/close
	StreamTopics []string `json:"stream_topics,omitempty"` // a multi-topic socket's topics
	FrameType    string   `json:"frame_type,omitempty"`    // message, change, gap, live, read, error, reset
	GapFrom      int64    `json:"gap_from,omitempty"`
	// live frames name their seq in Seq; live and reset frames their
	// change_seq here
	ChangeSeq int64 `json:"change_seq,omitempty"`
	GapTo     int64 `json:"gap_to,omitempty"`
	CloseCode int   `json:"close_code,omitempty"`

	// faults
	Fault string `json:"fault,omitempty"` // e.g. "mysql-cut", "redis-flush", "persist-kill9"
}

// Acked reports whether the op's answer says it took effect.
func (o *Op) Acked() bool { return o.Status >= 200 && o.Status < 300 }

// Unknown reports whether the op may or may not have taken effect.
func (o *Op) Unknown() bool { return o.Status == 0 || o.Status >= 500 }

// History is what a run recorded, safe for concurrent appends.
type History struct {
	mu   sync.Mutex
	next int64
	ops  []Op
}

// Begin records op's start and returns its id; pass the finished op to
// Finish with that id.
func (h *History) Begin(op Op) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	op.ID = h.next
	if op.Start.IsZero() {
		op.Start = time.Now()
	}
	h.ops = append(h.ops, op)
	return op.ID
}

// Finish replaces the op with id by op (answer filled in), setting End.
func (h *History) Finish(id int64, op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = id
	if op.End.IsZero() {
		op.End = time.Now()
	}
	h.ops[id-1] = op
}

// Record appends an op that is already complete (a frame, a fault).
func (h *History) Record(op Op) int64 {
	if op.End.IsZero() {
		op.End = time.Now()
	}
	if op.Start.IsZero() {
		op.Start = op.End
	}
	return h.Begin(op)
}

// Ops returns a copy of the recorded ops ordered by start time.
func (h *History) Ops() []Op {
	h.mu.Lock()
	out := append([]Op(nil), h.ops...)
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Write dumps the history as JSON lines, for a failing run's artifact.
func (h *History) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, op := range h.Ops() {
		if err := enc.Encode(op); err != nil {
			return err
		}
	}
	return nil
}

// Violation is one broken invariant, with the ops that show it.
type Violation struct {
	Checker string  `json:"checker"`
	Ops     []int64 `json:"ops"` // the ids of the ops that break it, earliest first
	Detail  string  `json:"detail"`
}

// Checker decides one invariant over a whole history. Check must be pure
// (no I/O, no clock, no randomness) so a failing history can be shrunk by
// running it again over parts of the history.
type Checker struct {
	Name      string
	Invariant string // what it guards, as docs/invariants.md words it
	Check     func(ops []Op) []Violation
}
