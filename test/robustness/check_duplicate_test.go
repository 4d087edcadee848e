package robustness

import "testing"

func TestNoDuplicate(t *testing.T) {
	other := msg("g", 1)
	other.MessageID = "other"
	retried := send(1, "g", 2)
	retried.ClientMsgID = mid("g", 1)
	runCases(t, NoDuplicate, []checkCase{
		{name: "one message a seq, once a walk", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 12, since(2, "g", 0, 1, 1)).at(13, 14, since(2, "g", 1, 1)).
			at(15, 16, bySeq(3, "g", 1))},
		{name: "a repeat answers the first seq", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 12, status(send(1, "g", 1), 200, ""))},
		{name: "two message ids at one seq", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 12, Op{Kind: BySeq, User: 2, Topic: "g", Seq: 1, Status: 200, Messages: []Msg{other}}),
			flagged: true, detail: "g seq 1 holds two messages"},
		{name: "one client_msg_id with two seqs", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 20, retried),
			flagged: true, detail: `client_msg_id "g-1" of user 1 on g has seqs 1 and 2`},
		{name: "a seq twice in one walk", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 12, since(2, "g", 0, 1, 1)).at(13, 14, since(2, "g", 1, 1, 1)),
			flagged: true, detail: "arrived twice in one since walk"},
		{name: "a seq twice on one stream", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(2, 2, frameMsg(7, "g", 1)).at(3, 3, frameMsg(7, "g", 1)),
			flagged: true, detail: "arrived twice on stream 7"},
		{name: "an erase frame names seqs, no message", h: h().
			at(0, 10, send(1, "g", 1)).at(11, 12, stream(7, 2, "g", 0)).at(13, 13, frameErase(7, "g", 1, 1))},
		{name: "two sockets each get it once", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(2, 2, frameMsg(7, "g", 1)).
			at(4, 5, stream(8, 2, "g", 0)).at(6, 6, frameMsg(8, "g", 1))},
	})
}
