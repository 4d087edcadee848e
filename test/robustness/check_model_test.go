package robustness

import "testing"

func TestModel(t *testing.T) {
	quiesce := Op{Kind: Quiesce}
	entry := func(topic string, last, read, unread int64, lastMessage int64) TopicEntry {
		e := TopicEntry{Topic: topic, LastSeq: last, ReadSeq: read, Unread: unread}
		if lastMessage > 0 {
			m := msg(topic, lastMessage)
			e.LastMessage = &m
		}
		return e
	}
	list := func(user int64, es ...TopicEntry) Op { return Op{Kind: List, User: user, Status: 200, Topics: es} }
	unread := func(user int64, es ...TopicEntry) Op { return Op{Kind: Unread, User: user, Status: 200, Topics: es} }
	mentions := func(e TopicEntry, n int64) TopicEntry { e.MentionUnread = n; return e }
	capped := func(e TopicEntry) TopicEntry { e.Unread, e.UnreadCapped = 999, true; return e }
	mentioning := func(o Op, users ...int64) Op { o.Mentions = users; return o }
	dissolve := Op{Kind: Dissolve, User: 9, Topic: "g", Status: 200, Role: "service"}

	// group g: users 1 and 2 joined, user 1 sent seqs 1..3, user 2 read up to 1
	base := func() *hist {
		return h().at(0, 1, join(1, "g")).at(0, 1, join(2, "g")).
			at(2, 3, send(1, "g", 1)).at(2, 3, mentioning(send(1, "g", 2), 2)).at(2, 3, send(1, "g", 3)).
			at(4, 5, cursor(2, "g", 1, 1))
	}
	many := func() *hist {
		b := base()
		for s := int64(4); s <= 1005; s++ {
			b.at(6, 7, send(1, "g", s))
		}
		return b
	}
	runCases(t, Model, []checkCase{
		{name: "list and unread as the history says", h: base().at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 2, 3), 1))).at(11, 12, unread(2, mentions(entry("g", 0, 0, 2, 0), 1)))},
		{name: "reads before the quiesce mark are not the final state", h: base().
			at(8, 9, list(2, entry("g", 3, 1, 7, 3))).at(10, 10, quiesce)},
		{name: "badges off by one", h: base().at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 3, 3), 1))),
			flagged: true, detail: "user 2's list of g: unread 3 (capped false) above read_seq 1, the history allows 2..2"},
		{name: "unread endpoint off by one", h: base().at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 2, 3), 1))).at(11, 12, unread(2, mentions(entry("g", 0, 0, 1, 0), 1))),
			flagged: true, detail: "user 2's unread of g: unread 1"},
		{name: "a mention not counted", h: base().at(10, 10, quiesce).
			at(11, 12, list(2, entry("g", 3, 1, 2, 3))),
			flagged: true, detail: "mention_unread 0, the history allows 1..1"},
		{name: "own message reads up to it", h: base().at(6, 7, send(2, "g", 4)).at(10, 10, quiesce).
			at(11, 12, list(2, entry("g", 4, 4, 0, 4)))},
		{name: "read_seq below the own message", h: base().at(6, 7, send(2, "g", 4)).at(10, 10, quiesce).
			at(11, 12, list(2, entry("g", 4, 1, 0, 4))),
			flagged: true, detail: "read_seq 1 below 4"},
		{name: "recalled and hidden messages do not count", h: base().
			at(6, 7, change(Recall, 1, "g", 3, 2, 1)).at(6, 7, hide(2, "g", 2, 3)).at(10, 10, quiesce).
			at(11, 12, list(2, entry("g", 3, 1, 0, 3)))},
		{name: "a recall without an answer may count either way", h: base().
			at(6, 7, unknown(change(Recall, 1, "g", 3, 2, 1))).at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 1, 3), 1))).at(11, 12, list(2, mentions(entry("g", 3, 1, 2, 3), 1)))},
		{name: "a deleted message is not the last message", h: base().
			at(6, 7, deleteAll("g", 3, 2, 1)).at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 1, 3), 1))),
			flagged: true, detail: "last_message seq 3, the history allows [2]"},
		{name: "a left group in the list", h: base().at(6, 7, leave(2, "g")).at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 2, 3), 1))),
			flagged: true, detail: "user 2's list shows g, which is not their group"},
		{name: "a leave without an answer may have applied or not", h: base().at(6, 7, unknown(leave(2, "g"))).at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 2, 3), 1))).at(11, 12, list(2))},
		{name: "a dissolved group in the list", h: base().at(6, 7, dissolve).at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 3, 1, 2, 3), 1))),
			flagged: true, detail: "which is not their group"},
		{name: "a list leaving out a group", h: base().at(10, 10, quiesce).at(11, 12, list(2)),
			flagged: true, detail: "user 2's list leaves out their group g"},
		{name: "capped at 999", h: many().at(10, 10, quiesce).
			at(11, 12, list(2, mentions(capped(entry("g", 1005, 1, 0, 1005)), 1)))},
		{name: "not capped above 999", h: many().at(10, 10, quiesce).
			at(11, 12, list(2, mentions(entry("g", 1005, 1, 999, 1005), 1))),
			flagged: true, detail: "unread 999 (capped false)"},
	})
}
