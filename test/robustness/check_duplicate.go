package robustness

import "fmt"

const noDuplicateName = "no-duplicate"

// NoDuplicate: a seq names one message, a message one seq, and a reader
// gets each message once.
var NoDuplicate = Checker{
	Name: noDuplicateName,
	Invariant: "a (topic, seq) holds one message_id and a message_id one (topic, seq) everywhere; one client_msg_id " +
		"of one sender on one topic has one seq; no seq arrives twice in one since walk or one followed topic " +
		"(invariants 1, 4 and 8)",
	Check: checkNoDuplicate,
}

func checkNoDuplicate(ops []Op) []Violation {
	all := ordered(ops)
	var out []Violation
	type seqKey struct {
		topicKey
		seq int64
	}
	type idKey struct{ tenant, id string }
	type retryKey struct {
		topicKey
		sender int64
		client string
	}
	type seen struct {
		seq int64
		id  string
		op  *Op
	}
	bySeq, byID := map[seqKey]seen{}, map[idKey]seqKey{}
	byIDOp := map[idKey]*Op{}
	byRetry := map[retryKey]seen{}
	reported := map[string]bool{}
	flag := func(what string, a, b *Op) {
		if !reported[what] {
			reported[what] = true
			out = append(out, violation(noDuplicateName, what, a, b))
		}
	}
	note := func(o *Op, k topicKey, seq int64, id string, sender int64, client string) {
		if seq <= 0 {
			return
		}
		sk := seqKey{k, seq}
		if id != "" {
			if prev, ok := bySeq[sk]; ok && prev.id != id {
				flag(fmt.Sprintf("%s seq %d holds two messages: %s and %s", k.topic, seq, prev.id, id), prev.op, o)
			} else if !ok {
				bySeq[sk] = seen{seq, id, o}
			}
			ik := idKey{k.tenant, id}
			if prev, ok := byID[ik]; ok && prev != sk {
				flag(fmt.Sprintf("message %s is at %s seq %d and at %s seq %d", id, prev.topic, prev.seq, k.topic, seq), byIDOp[ik], o)
			} else if !ok {
				byID[ik], byIDOp[ik] = sk, o
			}
		}
		if client != "" {
			rk := retryKey{k, sender, client}
			if prev, ok := byRetry[rk]; ok && prev.seq != seq {
				flag(fmt.Sprintf("client_msg_id %q of user %d on %s has seqs %d and %d", client, sender, k.topic, prev.seq, seq), prev.op, o)
			} else if !ok {
				byRetry[rk] = seen{seq, id, o}
			}
		}
	}
	for _, o := range all {
		if o.Kind == Send && o.Acked() && len(o.Messages) > 0 {
			note(o, keyOf(o), o.Messages[0].Seq, o.Messages[0].MessageID, o.User, o.ClientMsgID)
		}
		// an erase's change names its seqs, no message_id: nothing to
		// tie a seq to
		if c := o.Change; c != nil && c.Action != ActionErase && (o.Acked() || o.Kind == Frame) {
			note(o, topicKey{o.Tenant, c.Topic}, c.Seq, c.MessageID, 0, "")
		}
	}
	observed(all, func(o *Op, m *Msg) {
		note(o, msgKey(o, m), m.Seq, m.MessageID, m.SenderID, m.ClientID)
	})

	for _, w := range sinceWalks(all) {
		first := map[int64]*Op{}
		for _, p := range w.pages {
			for _, m := range p.Messages {
				if prev, ok := first[m.Seq]; ok {
					flag(fmt.Sprintf("%s seq %d arrived twice in one since walk", p.Topic, m.Seq), prev, p)
				}
				first[m.Seq] = p
			}
		}
	}
	for _, f := range follows(all) {
		first := map[int64]*Op{}
		for _, fr := range f.frames {
			if fr.FrameType != "message" {
				continue
			}
			s := frameSeq(fr)
			if prev, ok := first[s]; ok {
				flag(fmt.Sprintf("%s seq %d arrived twice on stream %d", f.topic.topic, s, fr.Stream), prev, fr)
			}
			first[s] = fr
		}
	}
	return out
}
