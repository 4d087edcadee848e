package robustness

import (
	"fmt"
	"math"
)

const settledName = "settled"

// Settled: once the system settled, every acknowledged send is readable.
// Delivery judges only what a page covered; a watermark that stalls below
// an acknowledged seq (a lost insert, a seq left in flight for ever) covers
// nothing, so only the final state can tell it from a slow persist.
var Settled = Checker{
	Name: settledName,
	Invariant: "a since walk that began after the quiesce mark and reached the end of its topic (has_more false) holds " +
		"every acknowledged send of the topic above its start — a recalled one as its tombstone — unless a delete for " +
		"everyone or a hide of the reader's may have applied; a send answered with another seq of the same " +
		"client_msg_id is held when that message is (no-duplicate judges the two seqs) (invariants 8 and 12)",
	Check: checkSettled,
}

func checkSettled(ops []Op) []Violation {
	all := ordered(ops)
	mark := quiesceMark(all)
	if mark == nil {
		return nil
	}
	acked := ackedSends(all)
	vis := newVisibility(all)
	type sent struct {
		sender int64
		client string
	}
	var out []Violation
	for _, w := range sinceWalks(all) {
		first, last := w.pages[0], w.pages[len(w.pages)-1]
		if !first.Start.After(mark.End) || last.HasMore {
			continue
		}
		k := keyOf(first)
		seqs, clients := map[int64]bool{}, map[sent]bool{}
		for _, p := range w.pages {
			for _, m := range p.Messages {
				seqs[m.Seq] = true
				clients[sent{m.SenderID, m.ClientID}] = true
			}
		}
		for _, a := range acked.in(k, first.Since, math.MaxInt64) {
			if seqs[a.seq] || clients[sent{a.op.User, a.op.ClientMsgID}] || vis.mayBeAbsent(k, last.User, a.seq, last.End) {
				continue
			}
			out = append(out, violation(settledName, fmt.Sprintf(
				"%s seq %d: acknowledged, and a since walk after the quiesce mark ended at %d (has_more false) without it",
				k.topic, a.seq, last.NextSince), a.op, mark, first, last))
		}
	}
	return out
}
