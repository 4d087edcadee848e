package robustness

import "testing"

func TestCursor(t *testing.T) {
	list := func(user int64, topic string, readSeq int64) Op {
		return Op{Kind: List, User: user, Status: 200, Topics: []TopicEntry{{Topic: topic, ReadSeq: readSeq}}}
	}
	runCases(t, Cursor, []checkCase{
		{name: "a lower PUT answers the cursor as it is", h: h().
			at(0, 10, cursor(2, "g", 5, 5)).at(11, 12, cursor(2, "g", 3, 5)).at(13, 14, list(2, "g", 5))},
		{name: "concurrent PUTs may answer in either order", h: h().
			at(0, 10, cursor(2, "g", 5, 5)).at(5, 12, cursor(2, "g", 3, 3))},
		{name: "a cursor going back", h: h().
			at(0, 10, cursor(2, "g", 5, 5)).at(11, 12, cursor(2, "g", 3, 3)),
			flagged: true, detail: "user 2's cursor of g answered 3 after 5"},
		{name: "a list below an answered PUT", h: h().
			at(0, 10, cursor(2, "g", 5, 5)).at(11, 12, list(2, "g", 4)),
			flagged: true, detail: "list entry of g has read_seq 4 after a PUT answered 5"},
		{name: "another user's cursor is another cursor", h: h().
			at(0, 10, cursor(2, "g", 5, 5)).at(11, 12, cursor(3, "g", 3, 3)).at(13, 14, list(3, "g", 3))},
	})
}
