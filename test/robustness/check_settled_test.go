package robustness

import "testing"

func TestSettled(t *testing.T) {
	quiesce := Op{Kind: Quiesce}
	more := func(o Op) Op { o.HasMore = true; return o }
	recalled := since(2, "g", 0, 2, 1, 2)
	recalled.Messages[0].Status, recalled.Messages[0].Text = "recalled", ""
	retried := send(1, "g", 3)
	retried.ClientMsgID = mid("g", 2)
	runCases(t, Settled, []checkCase{
		{name: "a final walk holds every acknowledged send", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(20, 20, quiesce).
			at(21, 22, more(since(2, "g", 0, 1, 1))).at(23, 24, since(2, "g", 1, 2, 2))},
		{name: "a final walk stalled below an acknowledged send", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(20, 20, quiesce).
			at(21, 22, since(2, "g", 0, 1, 1)),
			flagged: true, detail: "g seq 2: acknowledged, and a since walk after the quiesce mark ended at 1 (has_more false) without it"},
		{name: "the admin's final walk stalled too", h: h().
			at(0, 10, send(1, "g", 1)).at(20, 20, quiesce).
			at(21, 22, Op{Kind: PageSince, User: 999, Role: "admin", Topic: "g", Status: 200}),
			flagged: true, detail: "g seq 1"},
		{name: "a walk stalled at its start from before the mark to after it", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 12, since(2, "g", 0, 0)).at(20, 20, quiesce).at(21, 22, since(2, "g", 0, 0)),
			flagged: true, detail: "g seq 1: acknowledged, and a since walk after the quiesce mark ended at 0"},
		{name: "a walk resumed after the mark owes what lies above its resumption", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).at(11, 12, more(since(2, "g", 0, 1))).
			at(20, 20, quiesce).at(21, 22, since(2, "g", 1, 2, 2))},
		{name: "a walk that did not reach the end owes nothing yet", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(20, 20, quiesce).
			at(21, 22, more(since(2, "g", 0, 1, 1)))},
		{name: "a walk before the quiesce mark is delivery's", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).
			at(13, 14, since(2, "g", 0, 1, 1)).at(20, 20, quiesce)},
		{name: "without a quiesce mark nothing is final", h: h().
			at(0, 10, send(1, "g", 1)).at(21, 22, since(2, "g", 0, 0))},
		{name: "a recalled message comes as its tombstone", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(13, 14, change(Recall, 1, "g", 1, 2, 1)).
			at(20, 20, quiesce).at(21, 22, recalled)},
		{name: "a delete for everyone and the reader's hide excuse it", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(0, 12, send(1, "g", 3)).
			at(13, 14, deleteAll("g", 1, 2, 1)).at(13, 14, hide(2, "g", 2, 3)).
			at(20, 20, quiesce).at(21, 22, since(2, "g", 0, 3, 3))},
		{name: "another reader's hide does not", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(13, 14, hide(3, "g", 1, 2)).
			at(20, 20, quiesce).at(21, 22, since(2, "g", 0, 2, 2)),
			flagged: true, detail: "g seq 1"},
		{name: "a retry answered with another seq is held by the stored one", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(11, 14, retried).
			at(20, 20, quiesce).at(21, 22, since(2, "g", 0, 3, 1, 2))},
		{name: "a retry answered with another seq, the stored one hidden by the reader", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(11, 14, retried).at(15, 16, hide(2, "g", 2, 3)).
			at(20, 20, quiesce).at(21, 22, since(2, "g", 0, 3, 1))},
		{name: "a retry answered with another seq, neither held", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).at(11, 14, retried).
			at(20, 20, quiesce).at(21, 22, since(2, "g", 0, 3, 1)),
			flagged: true, detail: "g seq 2"},
	})
}
