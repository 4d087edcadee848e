package inbox

import "testing"

func TestMentionCounts(t *testing.T) {
	us := []userTopic{{topic: "a"}, {topic: "b"}, {topic: "c"}, {topic: "d"}}
	seqs := map[string][]int64{
		"a": {3, 5, 9},    // cursor 4: 5 and 9
		"b": {2, 7, 8},    // counted up to 7 (8 in flight)
		"c": {6},          // nothing unread: no mention either
		"d": {5, 6, 7, 8}, // more entries than unread messages
	}
	out := []unreadCount{
		{readSeq: 4, unread: 3},
		{readSeq: 1, unread: 5, upTo: 7},
		{readSeq: 1, unread: 0},
		{readSeq: 4, unread: 2},
	}
	mentionCounts(us, seqs, out)
	for i, want := range []int{2, 2, 0, 2} {
		if out[i].mentions != want {
			t.Errorf("%s: %d mentions, want %d", us[i].topic, out[i].mentions, want)
		}
	}
}
