package robustness

import "testing"

func TestChangeOrder(t *testing.T) {
	at := func(seq, version int64, status string) Op {
		o := bySeq(2, "g", seq)
		o.Messages[0].Version, o.Messages[0].Status = version, status
		if status != "normal" {
			o.Messages[0].Text = ""
		}
		return o
	}
	resumed := stream(8, 2, "g", 0)
	resumed.ChangesSince = 1
	runCases(t, ChangeOrder, []checkCase{
		{name: "reads after an edit see it", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(5, 8, at(1, 1, "normal")).at(11, 12, at(1, 2, "normal"))},
		{name: "an older version after an edit answered", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(11, 12, at(1, 1, "normal")),
			flagged: true, detail: "g seq 1: version 1 read after version 2 was answered"},
		{name: "recalled content coming back", h: h().
			at(0, 10, change(Recall, 1, "g", 1, 2, 1)).at(11, 12, at(1, 2, "normal")),
			flagged: true, detail: "content read after it was recalled"},
		{name: "a tombstone after the recall", h: h().
			at(0, 10, change(Recall, 1, "g", 1, 2, 1)).at(11, 12, at(1, 2, "recalled"))},
		{name: "content read after an erase frame", h: h().
			at(0, 1, stream(7, 2, "g", -1)).at(2, 2, frameLive(7, "g", 0, 3)).at(4, 4, frameErase(7, "g", 4, 1, 3)).
			at(5, 6, at(3, 1, "normal")),
			flagged: true, detail: "g seq 3: content read after it was recalled or deleted"},
		{name: "tombstones after an erase frame", h: h().
			at(0, 1, stream(7, 2, "g", -1)).at(2, 2, frameLive(7, "g", 0, 3)).at(4, 4, frameErase(7, "g", 4, 1, 3)).
			at(5, 6, at(3, 2, "deleted")).at(5, 6, at(2, 1, "normal"))},
		{name: "two changes with one change_seq", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(0, 10, edit(1, "g", 2, 1, 2, 1)),
			flagged: true, detail: "two changes answered change_seq 1"},
		{name: "a stream's changes follow its live frame", h: h().
			at(0, 1, stream(7, 2, "g", -1)).at(2, 2, frameLive(7, "g", 0, 3)).
			at(3, 10, edit(1, "g", 1, 1, 2, 4)).at(11, 11, frameChange(7, "g", 1, 2, 4)).
			at(12, 12, frameChange(7, "g", 1, 3, 5))},
		{name: "a stream skipping a change_seq", h: h().
			at(0, 1, stream(7, 2, "g", -1)).at(2, 2, frameLive(7, "g", 0, 3)).
			at(11, 11, frameChange(7, "g", 1, 2, 5)),
			flagged: true, detail: "stream 7 sent change_seq 5 after 3"},
		{name: "a catch-up that went live past a change it did not send", h: h().
			at(0, 1, resumed).at(2, 2, frameChange(8, "g", 1, 2, 2)).at(3, 3, frameLive(8, "g", 1, 3)),
			flagged: true, detail: "stream 8 went live at change_seq 3 after delivering up to 2"},
		{name: "a change frame that is not the answered change", h: h().
			at(0, 10, edit(1, "g", 1, 1, 2, 1)).at(0, 1, stream(7, 2, "g", -1)).at(2, 2, frameLive(7, "g", 0, 0)).
			at(11, 11, frameChange(7, "g", 2, 2, 1)),
			flagged: true, detail: "change_seq 1 was answered for seq 1 version 2, and a stream sent it for seq 2"},
	})
}
