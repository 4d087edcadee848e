package robustness

import (
	"fmt"
	"sort"
)

const changeOrderName = "change-order"

// ChangeOrder: an answered change is never undone by a read, and a
// topic's changes are numbered once and delivered without a hole.
var ChangeOrder = Checker{
	Name: changeOrderName,
	Invariant: "after a recall, edit or delete answered 200 with version V, no read that began after the answer " +
		"returns the message below V, or with content after a recall or delete; a topic's answered changes " +
		"carry distinct change_seqs, a change frame agrees with the answer of its change_seq, and the change " +
		"frames one stream delivers of a topic follow each other from its changes_since or live frame without a hole " +
		"(invariant 14)",
	Check: checkChangeOrder,
}

// changed is an answered change of one message.
type changed struct {
	op      *Op
	version int64
	gone    bool // recalled or deleted: a tombstone from then on
}

// changeVersion is the version a change answer or frame names.
func changeVersion(o *Op) int64 {
	if o.Change != nil && o.Change.Version != 0 {
		return o.Change.Version
	}
	if len(o.Messages) > 0 {
		return o.Messages[0].Version
	}
	return 0
}

func checkChangeOrder(ops []Op) []Violation {
	all := ordered(ops)
	var out []Violation
	type seqKey struct {
		topicKey
		seq int64
	}
	// each message's answered changes by answer time, with the highest
	// version and whether it was gone by then
	byMsg := map[seqKey][]changed{}
	numbered := map[topicKey]map[int64]*Op{}
	for _, o := range all {
		if o.Kind == Frame && o.Change != nil && o.Change.Action == ActionErase {
			// an erase frame is one change of each of its seqs: committed
			// before it was sent, each a tombstone from then on
			for _, seq := range o.Change.Seqs {
				k := seqKey{topicKey{o.Tenant, o.Change.Topic}, seq}
				byMsg[k] = append(byMsg[k], changed{op: o, gone: true})
			}
			continue
		}
		if (o.Kind != Recall && o.Kind != Edit && o.Kind != DeleteAll) || o.Status != 200 {
			continue
		}
		k := seqKey{keyOf(o), o.Seq}
		byMsg[k] = append(byMsg[k], changed{op: o, version: changeVersion(o), gone: o.Kind != Edit})
		if o.Change == nil || o.Change.ChangeSeq == 0 {
			continue
		}
		if numbered[k.topicKey] == nil {
			numbered[k.topicKey] = map[int64]*Op{}
		}
		if prev := numbered[k.topicKey][o.Change.ChangeSeq]; prev != nil {
			out = append(out, violation(changeOrderName,
				fmt.Sprintf("%s: two changes answered change_seq %d", k.topic, o.Change.ChangeSeq), prev, o))
		} else {
			numbered[k.topicKey][o.Change.ChangeSeq] = o
		}
	}
	for _, cs := range byMsg {
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].op.End.Before(cs[j].op.End) })
		for i := 1; i < len(cs); i++ {
			if cs[i-1].version > cs[i].version {
				cs[i].version, cs[i].op = cs[i-1].version, cs[i-1].op
			}
			cs[i].gone = cs[i].gone || cs[i-1].gone
		}
	}
	observed(all, func(o *Op, m *Msg) {
		if o.Kind == Frame {
			// a frame was sent when its message was, which may be before
			// the change answered; the change frame follows it
			return
		}
		cs := byMsg[seqKey{msgKey(o, m), m.Seq}]
		i := sort.Search(len(cs), func(i int) bool { return !cs[i].op.End.Before(o.Start) }) - 1
		if i < 0 {
			return
		}
		c := cs[i]
		switch {
		case m.Version != 0 && m.Version < c.version:
			out = append(out, violation(changeOrderName,
				fmt.Sprintf("%s seq %d: version %d read after version %d was answered", m.Topic, m.Seq, m.Version, c.version), c.op, o))
		case c.gone && (m.Status == "normal" || m.Text != ""):
			out = append(out, violation(changeOrderName,
				fmt.Sprintf("%s seq %d: content read after it was recalled or deleted", m.Topic, m.Seq), c.op, o))
		}
	})
	for _, f := range follows(all) {
		out = append(out, followChanges(f, numbered[f.topic])...)
	}
	return out
}

// followChanges checks one followed topic's change frames: each is the
// next change_seq after the socket's change cursor (its changes_since, then
// the live or reset frame, then the last change frame), and is the change
// its change_seq was answered as.
func followChanges(f *follow, answered map[int64]*Op) []Violation {
	var out []Violation
	cursor := f.changesSince
	for _, fr := range f.frames {
		switch fr.FrameType {
		case "live":
			if cursor >= 0 && fr.ChangeSeq > cursor {
				out = append(out, violation(changeOrderName,
					fmt.Sprintf("%s: stream %d went live at change_seq %d after delivering up to %d", f.topic.topic, fr.Stream, fr.ChangeSeq, cursor),
					f.begin, fr))
			}
			cursor = max(cursor, fr.ChangeSeq)
		case "reset":
			cursor = fr.ChangeSeq
		case "change":
			c := fr.Change
			if c == nil {
				continue
			}
			if a := answered[c.ChangeSeq]; a != nil && (a.Seq != c.Seq || changeVersion(a) != c.Version) {
				out = append(out, violation(changeOrderName,
					fmt.Sprintf("%s: change_seq %d was answered for seq %d version %d, and a stream sent it for seq %d version %d",
						f.topic.topic, c.ChangeSeq, a.Seq, changeVersion(a), c.Seq, c.Version), a, fr))
			}
			if cursor >= 0 && c.ChangeSeq != cursor+1 {
				out = append(out, violation(changeOrderName,
					fmt.Sprintf("%s: stream %d sent change_seq %d after %d", f.topic.topic, fr.Stream, c.ChangeSeq, cursor), f.begin, fr))
			}
			if cursor >= 0 {
				cursor = c.ChangeSeq
			}
		}
	}
	return out
}
