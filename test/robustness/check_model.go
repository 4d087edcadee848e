package robustness

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

const modelName = "model"

// unreadCap is where unread and mention counts stop being exact.
const unreadCap = 999

// Model: once the system settled, every user's topic list and unread
// badges are what the history says they must be.
var Model = Checker{
	Name: modelName,
	Invariant: "a list or unread read that began after the quiesce mark shows the caller's groups (joined, not left, " +
		"not dissolved) and nothing else, with last_seq the last stored seq, last_message the newest message the " +
		"caller may see, read_seq at least every answered PUT and the caller's newest own message, and unread " +
		"(and mention_unread) the stored messages above read_seq not the caller's own, not recalled or deleted, " +
		"not hidden by the caller (and mentioning them or everyone), exact up to 999; where an unanswered write " +
		"leaves the state open every outcome it allows is accepted (invariant 15)",
	Check: checkModel,
}

// stored is a message the history proves stored: an acknowledged send or
// a message a read returned.
type stored struct {
	sender       int64
	mentionKnown bool // the send's request is in the history
	mentions     []int64
	mentionAll   bool
}

// topicModel is what the history says of one topic at the quiesce mark.
type topicModel struct {
	msgs    map[int64]*stored
	seqs    []int64        // of msgs, ascending
	gone    map[int64]bool // an answered recall or delete for everyone
	deleted map[int64]bool // an answered delete for everyone
	// the same, counting the changes without an answer
	maybeGone, maybeDeleted map[int64]bool
	unanswered              bool // a send without an answer: a message nobody saw may exist
	dissolved               outcomes
	members                 map[int64]outcomes
	hides                   map[int64][]*Op
	puts                    map[int64][]*Op // answered cursor PUTs by user
}

// member is what user's membership may be at the mark.
func (m *topicModel) member(user int64) outcomes {
	if o, ok := m.members[user]; ok {
		return o
	}
	return outcomes{no: true}
}

// outcomes is what a state may be after every write to it: true, false
// or, while an unanswered write leaves it open, both.
type outcomes struct{ yes, no bool }

// settle returns the outcomes of a yes/no state that writes set (set says
// which way each one sets it) from an initial no. An answered write may be
// the last one unless another answered one began after it ended; an
// unanswered one may always be (it may apply late).
func settle(writes []*Op, set func(*Op) bool) outcomes {
	var o outcomes
	answered := false
	for _, w := range writes {
		answered = answered || !w.Unknown()
	}
	if !answered {
		o.no = true
	}
	for _, w := range writes {
		last := w.Unknown() || !slices.ContainsFunc(writes, func(x *Op) bool { return !x.Unknown() && before(w, x) })
		if last && set(w) {
			o.yes = true
		} else if last {
			o.no = true
		}
	}
	return o
}

// settledModel builds every topic's model from the writes before the mark.
func settledModel(all []*Op, mark time.Time) map[topicKey]*topicModel {
	models := map[topicKey]*topicModel{}
	get := func(k topicKey) *topicModel {
		if models[k] == nil {
			models[k] = &topicModel{msgs: map[int64]*stored{}, gone: map[int64]bool{}, deleted: map[int64]bool{},
				maybeGone: map[int64]bool{}, maybeDeleted: map[int64]bool{},
				members: map[int64]outcomes{}, hides: map[int64][]*Op{}, puts: map[int64][]*Op{}}
		}
		return models[k]
	}
	type retryKey struct {
		topicKey
		sender int64
		client string
	}
	sends := map[retryKey]*Op{}
	groups := map[topicKey][]*Op{}
	joins := map[topicKey]map[int64][]*Op{}
	for _, o := range all {
		if o.refused() || !o.Start.Before(mark) {
			continue
		}
		k := keyOf(o)
		switch o.Kind {
		case Send:
			m := get(k)
			sends[retryKey{k, o.User, o.ClientMsgID}] = o
			if o.Acked() && len(o.Messages) > 0 {
				m.msgs[o.Messages[0].Seq] = &stored{sender: o.User, mentionKnown: true, mentions: o.Mentions, mentionAll: o.MentionAll}
			} else if o.Unknown() {
				m.unanswered = true
			}
		case Recall, DeleteAll:
			m, del := get(k), o.Kind == DeleteAll
			m.gone[o.Seq] = m.gone[o.Seq] || o.Acked()
			m.deleted[o.Seq] = m.deleted[o.Seq] || (del && o.Acked())
			m.maybeGone[o.Seq] = true
			m.maybeDeleted[o.Seq] = m.maybeDeleted[o.Seq] || del
		case Hide:
			m := get(k)
			m.hides[o.User] = append(m.hides[o.User], o)
		case CursorPut:
			if o.Acked() {
				m := get(k)
				m.puts[o.User] = append(m.puts[o.User], o)
			}
		case Dissolve, GroupPut:
			get(k)
			groups[k] = append(groups[k], o)
		case Join, Leave:
			get(k)
			if joins[k] == nil {
				joins[k] = map[int64][]*Op{}
			}
			joins[k][o.User] = append(joins[k][o.User], o)
		}
	}
	observed(all, func(o *Op, msg *Msg) {
		m := get(msgKey(o, msg))
		if m.msgs[msg.Seq] != nil || msg.Seq <= 0 {
			return
		}
		s := &stored{sender: msg.SenderID}
		if send := sends[retryKey{msgKey(o, msg), msg.SenderID, msg.ClientID}]; send != nil && msg.ClientID != "" {
			s.mentionKnown, s.mentions, s.mentionAll = true, send.Mentions, send.MentionAll
		}
		m.msgs[msg.Seq] = s
	})
	for k, m := range models {
		for s := range m.msgs {
			m.seqs = append(m.seqs, s)
		}
		slices.Sort(m.seqs)
		m.dissolved = settle(groups[k], func(o *Op) bool { return o.Kind == Dissolve })
		for u, ws := range joins[k] {
			m.members[u] = settle(ws, func(o *Op) bool { return o.Kind == Join })
		}
	}
	return models
}

// hidden tells whether user's hides cover seq: surely (an answered hide)
// and maybe (one without an answer too).
func (m *topicModel) hidden(user, seq int64) (surely, maybe bool) {
	for _, h := range m.hides[user] {
		if h.Seq <= seq && seq < h.HideHi {
			maybe = true
			surely = surely || h.Acked()
		}
	}
	return surely, maybe
}

// readFloor is the lowest read_seq user's entry may show: every answered
// PUT, and the user's newest own message that is surely still normal.
func (m *topicModel) readFloor(user int64) int64 {
	var floor int64
	for _, p := range m.puts[user] {
		floor = max(floor, p.ReadSeq)
	}
	for _, s := range m.seqs {
		if _, maybeHidden := m.hidden(user, s); m.msgs[s].sender == user && !m.maybeGone[s] && !maybeHidden {
			floor = max(floor, s)
		}
	}
	return floor
}

// unread returns the range of user's unread and mention counts above
// readSeq that the history allows.
func (m *topicModel) unread(user, readSeq int64) (lo, hi, mentionLo, mentionHi int64) {
	i := sort.Search(len(m.seqs), func(i int) bool { return m.seqs[i] > readSeq })
	for _, s := range m.seqs[i:] {
		msg := m.msgs[s]
		surelyHidden, maybeHidden := m.hidden(user, s)
		if msg.sender == user || m.gone[s] || surelyHidden {
			continue
		}
		surely := !m.maybeGone[s] && !maybeHidden
		mentioned := msg.mentionAll || slices.Contains(msg.mentions, user)
		hi++
		if surely {
			lo++
		}
		if !msg.mentionKnown || mentioned {
			mentionHi++
		}
		if surely && msg.mentionKnown && mentioned {
			mentionLo++
		}
	}
	return lo, hi, mentionLo, mentionHi
}

// countFits reports whether an answered count (capped at 999) is one of
// the counts in [lo, hi].
func countFits(n int64, capped bool, lo, hi int64) bool {
	if capped {
		return n == unreadCap && hi > unreadCap
	}
	return n <= unreadCap && lo <= n && n <= hi
}

// lastMessages returns the seqs user's last_message may be, newest first,
// and whether it may be null (no message surely visible).
func (m *topicModel) lastMessages(user int64) ([]int64, bool) {
	var out []int64
	for i := len(m.seqs) - 1; i >= 0; i-- {
		s := m.seqs[i]
		surelyHidden, maybeHidden := m.hidden(user, s)
		if m.deleted[s] || surelyHidden {
			continue
		}
		out = append(out, s)
		if !maybeHidden && !m.maybeDeleted[s] {
			return out, false
		}
	}
	return out, true
}

func checkModel(ops []Op) []Violation {
	all := ordered(ops)
	mark := quiesceMark(all)
	if mark == nil {
		return nil
	}
	models := settledModel(all, mark.End)
	var out []Violation
	flag := func(o *Op, format string, a ...any) {
		out = append(out, violation(modelName, fmt.Sprintf(format, a...), mark, o))
	}
	// read_seq of each user's topics as the final list showed it: the
	// unread answer names none
	listed := map[topicKey]map[int64]int64{}
	for _, o := range all {
		if o.Kind != List || o.Status != 200 || o.Role == "admin" || !o.Start.After(mark.End) {
			continue
		}
		for _, e := range o.Topics {
			k := topicKey{o.Tenant, e.Topic}
			if listed[k] == nil {
				listed[k] = map[int64]int64{}
			}
			listed[k][o.User] = e.ReadSeq
		}
	}
	for _, o := range all {
		if (o.Kind != List && o.Kind != Unread) || o.Status != 200 || o.Role == "admin" || !o.Start.After(mark.End) {
			continue
		}
		shown := map[string]bool{}
		for _, e := range o.Topics {
			k := topicKey{o.Tenant, e.Topic}
			shown[e.Topic] = true
			m := models[k]
			if m == nil || !m.member(o.User).yes || !m.dissolved.no {
				flag(o, "user %d's %s shows %s, which is not their group", o.User, o.Kind, e.Topic)
				continue
			}
			readSeq, known := e.ReadSeq, o.Kind == List
			if !known {
				readSeq, known = listed[k][o.User]
			}
			if o.Kind == List {
				out = append(out, checkListEntry(m, o, e, mark)...)
			}
			if !known {
				continue
			}
			lo, hi, mlo, mhi := m.unread(o.User, readSeq)
			if !countFits(e.Unread, e.UnreadCapped, lo, hi) {
				flag(o, "user %d's %s of %s: unread %d (capped %v) above read_seq %d, the history allows %d..%d",
					o.User, o.Kind, e.Topic, e.Unread, e.UnreadCapped, readSeq, lo, hi)
			}
			if !countFits(e.MentionUnread, e.MentionUnread == unreadCap && mhi > unreadCap, mlo, mhi) {
				flag(o, "user %d's %s of %s: mention_unread %d, the history allows %d..%d", o.User, o.Kind, e.Topic, e.MentionUnread, mlo, mhi)
			}
		}
		if o.HasMore {
			continue
		}
		for k, m := range models {
			if k.tenant != o.Tenant || shown[k.topic] || m.member(o.User).no || m.dissolved.yes {
				continue
			}
			if o.Kind == List {
				flag(o, "user %d's list leaves out their group %s", o.User, k.topic)
			} else if readSeq, ok := listed[k][o.User]; ok {
				if lo, _, _, _ := m.unread(o.User, readSeq); lo > 0 {
					flag(o, "user %d's unread leaves out %s, where at least %d are unread", o.User, k.topic, lo)
				}
			}
		}
	}
	return out
}

// checkListEntry compares what a list entry says of a topic beyond the
// counts: its last seq, its last message and its read cursor.
func checkListEntry(m *topicModel, o *Op, e TopicEntry, mark *Op) []Violation {
	var out []Violation
	flag := func(format string, a ...any) {
		out = append(out, violation(modelName, fmt.Sprintf(format, a...), mark, o))
	}
	var last int64
	if len(m.seqs) > 0 {
		last = m.seqs[len(m.seqs)-1]
	}
	if e.LastSeq < last || (e.LastSeq > last && !m.unanswered) {
		flag("user %d's list of %s: last_seq %d, the last stored seq is %d", o.User, e.Topic, e.LastSeq, last)
	}
	if floor := m.readFloor(o.User); e.ReadSeq < floor {
		flag("user %d's list of %s: read_seq %d below %d (answered PUTs, own newest message)", o.User, e.Topic, e.ReadSeq, floor)
	}
	may, mayBeNull := m.lastMessages(o.User)
	switch {
	case e.LastMessage == nil && !mayBeNull:
		flag("user %d's list of %s: no last_message, the newest visible is seq %d", o.User, e.Topic, may[len(may)-1])
	case e.LastMessage != nil && !slices.Contains(may, e.LastMessage.Seq):
		flag("user %d's list of %s: last_message seq %d, the history allows %v", o.User, e.Topic, e.LastMessage.Seq, may)
	}
	return out
}
