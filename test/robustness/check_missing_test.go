package robustness

import "testing"

func TestNoMissing(t *testing.T) {
	runCases(t, NoMissing, []checkCase{
		{name: "gaps where nothing was stored", h: h().
			at(0, 10, send(1, "g", 2)).at(11, 12, withGaps(since(2, "g", 0, 2, 2), 1)).
			at(13, 13, stream(7, 2, "g", 0)).at(14, 14, frameGap(7, "g", 1, 1)).at(15, 15, frameMsg(7, "g", 2))},
		{name: "a gap at a stored seq", h: h().
			at(0, 10, withGaps(since(2, "g", 0, 2, 2), 1)).at(11, 12, bySeq(3, "g", 1)),
			flagged: true, detail: "g seq 1 was both a gap and a message"},
		{name: "a gap frame over a seq a page returned", h: h().
			at(0, 10, since(2, "g", 0, 3, 1, 2, 3)).
			at(0, 1, stream(7, 2, "g", 0)).at(14, 14, frameGap(7, "g", 1, 2)),
			flagged: true, detail: "was both a gap and a message"},
		{name: "a walk going back", h: h().
			at(0, 10, since(2, "g", 0, 3, 3)).at(11, 12, since(2, "g", 3, 4, 2, 4)),
			flagged: true, detail: "a since page of (3, 4] returned seq 2"},
		{name: "a stream going back", h: h().
			at(0, 1, stream(7, 2, "g", 0)).at(2, 2, frameMsg(7, "g", 2)).at(3, 3, frameMsg(7, "g", 1)),
			flagged: true, detail: "stream 7 went back from seq 2 to 1"},
	})
}
