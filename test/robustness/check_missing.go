package robustness

import "fmt"

const noMissingName = "no-missing"

// NoMissing: a gap is a seq that never holds a message, and a cursor only
// moves forward.
var NoMissing = Checker{
	Name: noMissingName,
	Invariant: "no seq is reported as a gap (a page's gaps, a stream's gap frame) that any read ever returned " +
		"as a message, before or after; a since walk's and a followed topic's seqs strictly increase and a page " +
		"stays inside (since, next_since] (invariants 1, 7 and 12)",
	Check: checkNoMissing,
}

func checkNoMissing(ops []Op) []Violation {
	all := ordered(ops)
	var out []Violation
	flag := func(detail string, ops ...*Op) {
		out = append(out, violation(noMissingName, detail, ops...))
	}

	type seqKey struct {
		topicKey
		seq int64
	}
	// the first op that reported each gap seq; a gap frame names a short
	// run of seqs
	gaps := map[seqKey]*Op{}
	gap := func(k topicKey, from, to int64, o *Op) {
		for s := from; s <= to; s++ {
			if gaps[seqKey{k, s}] == nil {
				gaps[seqKey{k, s}] = o
			}
		}
	}
	for _, o := range all {
		switch {
		case o.Kind == PageSince && o.Status == 200:
			for _, g := range o.Gaps {
				gap(keyOf(o), g, g, o)
			}
		case o.Kind == Frame && o.FrameType == "gap":
			gap(topicKey{o.Tenant, frameTopic(o)}, o.GapFrom, o.GapTo, o)
		}
	}
	reported := map[seqKey]bool{}
	observed(all, func(o *Op, m *Msg) {
		k := msgKey(o, m)
		sk := seqKey{k, m.Seq}
		g := gaps[sk]
		if g == nil || reported[sk] {
			return
		}
		reported[sk] = true
		flag(fmt.Sprintf("%s seq %d was both a gap and a message", k.topic, m.Seq), g, o)
	})

	for _, w := range sinceWalks(all) {
		last := int64(-1)
		var lastOp *Op
		for _, p := range w.pages {
			for _, m := range p.Messages {
				if m.Seq <= p.Since || m.Seq > p.NextSince {
					flag(fmt.Sprintf("%s: a since page of (%d, %d] returned seq %d", p.Topic, p.Since, p.NextSince, m.Seq), p)
				}
				if m.Seq < last {
					flag(fmt.Sprintf("%s: a since walk went back from seq %d to %d", p.Topic, last, m.Seq), lastOp, p)
				}
				last, lastOp = m.Seq, p
			}
		}
	}
	for _, f := range follows(all) {
		last := int64(-1)
		var lastOp *Op
		for _, fr := range f.frames {
			if fr.FrameType != "message" {
				continue
			}
			s := frameSeq(fr)
			if s < last {
				flag(fmt.Sprintf("%s: stream %d went back from seq %d to %d", f.topic.topic, fr.Stream, last, s), lastOp, fr)
			}
			last, lastOp = max(last, s), fr
		}
	}
	return out
}
