package robustness

import (
	"fmt"
	"slices"
)

const deliveryName = "delivery"

// Delivery: an acknowledged send reaches every reader that followed its
// topic past it.
var Delivery = Checker{
	Name: deliveryName,
	Invariant: "an acknowledged send (201, or 200 for a repeat) reaches every since walk whose page covered its seq " +
		"after the answer, and every stream that followed its topic past its seq, never as a gap; " +
		"only a hide of the reader's or a delete for everyone that may have applied excuses its absence " +
		"(invariants 8 and 12; repeats are no-duplicate's, order no-missing's)",
	Check: checkDelivery,
}

func checkDelivery(ops []Op) []Violation {
	all := ordered(ops)
	acked := ackedSends(all)
	vis := newVisibility(all)
	var out []Violation
	for _, w := range sinceWalks(all) {
		out = append(out, walkDelivery(w, acked, vis)...)
	}
	for _, f := range follows(all) {
		out = append(out, followDelivery(f, acked, vis)...)
	}
	return out
}

// walkDelivery checks every page against the sends answered before it
// began: the page covered (Since, NextSince], so each of them is in the
// walk (or the page hid it legitimately).
func walkDelivery(w walk, acked acks, vis visibility) []Violation {
	in := map[int64]bool{}
	for _, s := range w.seqs() {
		in[s] = true
	}
	var out []Violation
	for _, p := range w.pages {
		k := keyOf(p)
		for _, a := range acked.in(k, p.Since, p.NextSince) {
			switch {
			case !before(a.op, p) || in[a.seq]:
			case slices.Contains(p.Gaps, a.seq):
				out = append(out, violation(deliveryName,
					fmt.Sprintf("%s seq %d: acknowledged, then a since page reported it as a gap", k.topic, a.seq), a.op, p))
			case !vis.mayBeAbsent(k, p.User, a.seq, p.End):
				out = append(out, violation(deliveryName, fmt.Sprintf("%s seq %d: acknowledged, then a since page covering (%d, %d] left it out",
					k.topic, a.seq, p.Since, p.NextSince), a.op, p))
			}
		}
	}
	return out
}

// followDelivery walks one followed topic's frames with the socket's
// cursor: every seq the cursor passes (a later message, a gap frame, the
// live frame) that an acknowledged send holds must have arrived as a
// message. The cursor starts at the catch-up's since, or at the first
// live frame (delivery from the topic's last seq on) without one.
func followDelivery(f *follow, acked acks, vis visibility) []Violation {
	cursor := f.since
	got := map[int64]bool{}
	var out []Violation
	pass := func(to int64, by *Op, gapFrom int64) {
		if cursor < 0 {
			if gapFrom == 0 {
				cursor = to
				return
			}
			cursor = gapFrom - 1
		}
		for _, a := range acked.in(f.topic, cursor, to) {
			if got[a.seq] {
				continue
			}
			switch {
			case gapFrom > 0 && a.seq >= gapFrom:
				out = append(out, violation(deliveryName,
					fmt.Sprintf("%s seq %d: acknowledged, and a stream sent it as a gap", f.topic.topic, a.seq), a.op, f.begin, by))
			case !vis.mayBeAbsent(f.topic, f.begin.User, a.seq, by.End):
				out = append(out, violation(deliveryName,
					fmt.Sprintf("%s seq %d: acknowledged, and a stream went past it without it", f.topic.topic, a.seq), a.op, f.begin, by))
			}
		}
		cursor = max(cursor, to)
	}
	for _, fr := range f.frames {
		switch fr.FrameType {
		case "message":
			s := frameSeq(fr)
			if cursor >= 0 && s > cursor {
				pass(s-1, fr, 0)
			}
			got[s] = true
			cursor = max(cursor, s)
		case "gap":
			pass(fr.GapTo, fr, fr.GapFrom)
		case "live":
			pass(fr.Seq, fr, 0)
		}
	}
	return out
}
