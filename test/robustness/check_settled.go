package robustness

import (
	"fmt"
	"math"
	"slices"
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
		"everyone or a hide of the reader's may have applied; a send answered with more than one seq for one " +
		"client_msg_id is held when the walk holds its message under any of them, or one of them may be absent " +
		"that way (no-duplicate judges the seqs) (invariants 8 and 12)",
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
		// the walk's pages from the first one after the mark: a walk
		// stalled at its start (every page since=0, next_since 0) chains
		// the final reads to the ones before the mark
		i := slices.IndexFunc(w.pages, func(p *Op) bool { return p.Start.After(mark.End) })
		if i < 0 || w.pages[len(w.pages)-1].HasMore {
			continue
		}
		pages := w.pages[i:]
		first, last := pages[0], pages[len(pages)-1]
		k := keyOf(first)
		seqs, clients := map[int64]bool{}, map[sent]bool{}
		for _, p := range pages {
			for _, m := range p.Messages {
				seqs[m.Seq] = true
				clients[sent{m.SenderID, m.ClientID}] = true
			}
		}
		// every seq a send's client_msg_id was answered with: the message
		// is stored under one of them
		answered := map[sent][]int64{}
		for _, a := range acked[k] {
			key := sent{a.op.User, a.op.ClientMsgID}
			answered[key] = append(answered[key], a.seq)
		}
		for _, a := range acked.in(k, first.Since, math.MaxInt64) {
			key := sent{a.op.User, a.op.ClientMsgID}
			if clients[key] || slices.ContainsFunc(answered[key], func(s int64) bool {
				return seqs[s] || vis.mayBeAbsent(k, last.User, s, last.End)
			}) {
				continue
			}
			out = append(out, violation(settledName, fmt.Sprintf(
				"%s seq %d: acknowledged, and a since walk after the quiesce mark ended at %d (has_more false) without it",
				k.topic, a.seq, last.NextSince), a.op, mark, first, last))
		}
	}
	return out
}
