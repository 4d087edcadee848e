package robustness

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The hand-written histories of the checkers' tests: one tenant, topics
// named by the test, times in milliseconds after t0, and every op built by
// a one-line helper so a case reads like the interleaving it describes.

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

const tenant = "acme"

// hist builds a history op by op.
type hist struct{ ops []Op }

// at appends o as running from start to end (ms after t0).
func (h *hist) at(start, end int, o Op) *hist {
	o.ID = int64(len(h.ops) + 1)
	if o.Tenant == "" {
		o.Tenant = tenant
	}
	if o.Client == 0 {
		o.Client = int(o.User)
	}
	o.Start = t0.Add(time.Duration(start) * time.Millisecond)
	o.End = t0.Add(time.Duration(end) * time.Millisecond)
	h.ops = append(h.ops, o)
	return h
}

// unknown turns o into an op whose answer never came.
func unknown(o Op) Op {
	o.Status, o.Err, o.Messages, o.Change, o.ReadSeq, o.Topics = 0, "timeout", nil, nil, 0, nil
	return o
}

// status gives o another answer's status (and code).
func status(o Op, s int, code string) Op {
	o.Status, o.Code = s, code
	if s >= 300 {
		o.Messages, o.Change, o.ReadSeq, o.Topics = nil, nil, 0, nil
	}
	return o
}

func mid(topic string, seq int64) string { return fmt.Sprintf("%s-%d", topic, seq) }

// msg is message seq of topic as a read shows it, sent by user 1 unless
// from says otherwise.
func msg(topic string, seq int64) Msg {
	return Msg{Topic: topic, Seq: seq, MessageID: mid(topic, seq), SenderID: 1, ClientID: mid(topic, seq),
		Status: "normal", Version: 1, Text: "hi"}
}

func msgs(topic string, seqs ...int64) []Msg {
	out := make([]Msg, len(seqs))
	for i, s := range seqs {
		out[i] = msg(topic, s)
	}
	return out
}

func send(user int64, topic string, seq int64) Op {
	m := Msg{Topic: topic, Seq: seq, MessageID: mid(topic, seq)}
	return Op{Kind: Send, User: user, Topic: topic, Status: 201, ClientMsgID: mid(topic, seq), Messages: []Msg{m}}
}

// since is an answered since page of user: (from, next] with the seqs it
// returned.
func since(user int64, topic string, from, next int64, seqs ...int64) Op {
	return Op{Kind: PageSince, User: user, Topic: topic, Status: 200, Since: from, NextSince: next, Messages: msgs(topic, seqs...)}
}

func withGaps(o Op, gaps ...int64) Op { o.Gaps = gaps; return o }

func bySeq(user int64, topic string, seq int64) Op {
	return Op{Kind: BySeq, User: user, Topic: topic, Seq: seq, Status: 200, Messages: msgs(topic, seq)}
}

func hide(user int64, topic string, low, hi int64) Op {
	return Op{Kind: Hide, User: user, Topic: topic, Seq: low, HideHi: hi, Status: 200}
}

func deleteAll(topic string, seq, version, changeSeq int64) Op {
	return change(DeleteAll, 99, topic, seq, version, changeSeq)
}

func change(k Kind, user int64, topic string, seq, version, changeSeq int64) Op {
	action := map[Kind]string{Recall: "recall", Edit: "edit", DeleteAll: "delete"}[k]
	o := Op{Kind: k, User: user, Topic: topic, Seq: seq, Status: 200,
		Change: &Change{Topic: topic, Seq: seq, MessageID: mid(topic, seq), Action: action, Version: version, ChangeSeq: changeSeq}}
	if k == DeleteAll {
		o.Role = "admin"
	}
	return o
}

func edit(user int64, topic string, seq, expected, version, changeSeq int64) Op {
	o := change(Edit, user, topic, seq, version, changeSeq)
	o.ExpectedVersion = expected
	return o
}

func join(user int64, topic string) Op {
	return Op{Kind: Join, User: user, Topic: topic, Status: 200, Role: "service"}
}

func leave(user int64, topic string) Op {
	return Op{Kind: Leave, User: user, Topic: topic, Status: 204, Role: "service"}
}

func cursor(user int64, topic string, seq, answer int64) Op {
	return Op{Kind: CursorPut, User: user, Topic: topic, Seq: seq, Status: 200, ReadSeq: answer}
}

// stream opens socket id of user on topic (since -1: without since).
func stream(id, user int64, topic string, from int64) Op {
	return Op{Kind: StreamOpen, User: user, Topic: topic, Stream: id, Since: from, ChangesSince: -1, Status: 101}
}

func frameMsg(id int64, topic string, seq int64) Op {
	return Op{Kind: Frame, Topic: topic, Stream: id, FrameType: "message", Messages: msgs(topic, seq)}
}

func frameGap(id int64, topic string, from, to int64) Op {
	return Op{Kind: Frame, Topic: topic, Stream: id, FrameType: "gap", GapFrom: from, GapTo: to}
}

func frameLive(id int64, topic string, seq, changeSeq int64) Op {
	return Op{Kind: Frame, Topic: topic, Stream: id, FrameType: "live", Seq: seq, ChangeSeq: changeSeq}
}

func frameChange(id int64, topic string, seq, version, changeSeq int64) Op {
	return Op{Kind: Frame, Topic: topic, Stream: id, FrameType: "change",
		Change: &Change{Topic: topic, Seq: seq, MessageID: mid(topic, seq), Action: "edit", Version: version, ChangeSeq: changeSeq}}
}

// frameErase is an erase's change frame of seqs.
func frameErase(id int64, topic string, changeSeq int64, seqs ...int64) Op {
	return Op{Kind: Frame, Topic: topic, Stream: id, FrameType: "change",
		Change: &Change{Topic: topic, Seq: seqs[0], MessageID: "0", Action: ActionErase, ChangeSeq: changeSeq, Seqs: seqs}}
}

// checkCase is one hand-written history and whether c must flag it.
type checkCase struct {
	name    string
	h       *hist
	flagged bool
	detail  string // a part of the first violation's detail, when flagged
}

// runCases runs c over every case, printing the history of a case that
// went the wrong way.
func runCases(t *testing.T, c Checker, cases []checkCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs := c.Check(tc.h.ops)
			switch {
			case tc.flagged && len(vs) == 0:
				t.Fatalf("%s passed a history that breaks it:\n%s", c.Name, Format(tc.h.ops))
			case !tc.flagged && len(vs) > 0:
				t.Fatalf("%s flagged a good history: %+v\n%s", c.Name, vs, Format(tc.h.ops))
			case tc.flagged && !strings.Contains(vs[0].Detail, tc.detail):
				t.Fatalf("%s: first violation %q, want one about %q", c.Name, vs[0].Detail, tc.detail)
			}
			for _, v := range vs {
				if v.Checker != c.Name || len(v.Ops) == 0 {
					t.Fatalf("violation %+v does not name its checker %s and ops", v, c.Name)
				}
			}
		})
	}
}

func h() *hist { return &hist{} }
