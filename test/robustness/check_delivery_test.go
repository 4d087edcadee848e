package robustness

import "testing"

func TestDelivery(t *testing.T) {
	runCases(t, Delivery, []checkCase{
		{name: "a walk after the ack holds the send", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 12, send(1, "g", 2)).
			at(20, 21, since(2, "g", 0, 1, 1)).at(22, 23, since(2, "g", 1, 2, 2))},
		{name: "a page before the ack may stop below it", h: h().
			at(0, 30, send(1, "g", 1)).at(5, 6, since(2, "g", 0, 0))},
		{name: "an acknowledged send left out of a later walk", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(20, 21, since(2, "g", 0, 2, 2)),
			flagged: true, detail: "g seq 1: acknowledged, then a since page covering (0, 2] left it out"},
		{name: "an acknowledged send reported as a gap", h: h().
			at(0, 10, send(1, "g", 1)).at(20, 21, withGaps(since(2, "g", 0, 1), 1)),
			flagged: true, detail: "reported it as a gap"},
		{name: "the reader's own hide excuses the absence", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 12, hide(2, "g", 1, 2)).at(20, 21, since(2, "g", 0, 2, 2))},
		{name: "another user's hide does not", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 12, hide(3, "g", 1, 2)).at(20, 21, since(2, "g", 0, 2, 2)),
			flagged: true, detail: "left it out"},
		{name: "a delete without an answer may have applied", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 12, unknown(deleteAll("g", 1, 2, 1))).at(20, 21, since(2, "g", 0, 2, 2))},
		{name: "a refused delete does not excuse it", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 12, status(deleteAll("g", 1, 2, 1), 403, "permission_denied")).at(20, 21, since(2, "g", 0, 2, 2)),
			flagged: true, detail: "left it out"},
		{name: "a stream delivers every seq it passes", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 11, frameMsg(7, "g", 1)).at(12, 12, frameMsg(7, "g", 2))},
		{name: "a stream that skipped a seq", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(12, 12, frameMsg(7, "g", 2)),
			flagged: true, detail: "g seq 1: acknowledged, and a stream went past it without it"},
		{name: "a stream that sent an acknowledged seq as a gap", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 11, frameGap(7, "g", 1, 1)).at(12, 12, frameMsg(7, "g", 2)),
			flagged: true, detail: "sent it as a gap"},
		{name: "a stream without since starts at its live frame", h: h().
			at(0, 10, send(1, "g", 1)).at(0, 1, stream(7, 2, "g", -1)).at(2, 2, frameLive(7, "g", 1, 0)).
			at(3, 10, send(1, "g", 2)).at(11, 11, frameMsg(7, "g", 2))},
		{name: "a multi-topic socket follows a subscribed topic from its since", h: h().
			at(0, 1, Op{Kind: StreamOpen, User: 2, Stream: 7, StreamTopics: []string{"a"}, Status: 101}).
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 11, Op{Kind: StreamSubscribe, User: 2, Stream: 7, Topic: "g", Since: 0, ChangesSince: -1}).
			at(12, 12, frameMsg(7, "g", 1)).at(13, 13, frameMsg(7, "g", 2)).
			at(14, 14, Op{Kind: StreamUnsubscribe, User: 2, Stream: 7, Topic: "g"}).at(15, 16, send(1, "g", 3)).
			at(17, 17, frameMsg(7, "g", 4))},
		{name: "a subscribed topic that skipped a seq", h: h().
			at(0, 1, Op{Kind: StreamOpen, User: 2, Stream: 7, StreamTopics: []string{"a"}, Status: 101}).
			at(0, 10, send(1, "g", 1)).at(0, 10, send(1, "g", 2)).
			at(11, 11, Op{Kind: StreamSubscribe, User: 2, Stream: 7, Topic: "g", Since: 0, ChangesSince: -1}).
			at(13, 13, frameMsg(7, "g", 2)),
			flagged: true, detail: "g seq 1: acknowledged, and a stream went past it without it"},
		{name: "a stream that closed before passing the seq owes nothing", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(0, 10, send(1, "g", 1)).
			at(5, 5, Op{Kind: StreamClose, Stream: 7, User: 2})},
	})
}
