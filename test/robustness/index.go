package robustness

import (
	"slices"
	"sort"
	"time"
)

// topicKey names a topic: topic names are per tenant, so every index of the
// checkers is keyed by both.
type topicKey struct{ tenant, topic string }

func keyOf(o *Op) topicKey { return topicKey{o.Tenant, o.Topic} }

// ordered returns pointers to ops in the order they started (ties by id,
// the order they were recorded in), so every checker walks the same order
// whatever order it was handed.
func ordered(ops []Op) []*Op {
	out := make([]*Op, len(ops))
	for i := range ops {
		out[i] = &ops[i]
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Start.Equal(out[j].Start) {
			return out[i].Start.Before(out[j].Start)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// quiesceMark is the history's Quiesce op (the last one), nil when the run
// never settled.
func quiesceMark(all []*Op) *Op {
	var mark *Op
	for _, o := range all {
		if o.Kind == Quiesce {
			mark = o
		}
	}
	return mark
}

// refused reports a definite refusal (a 4xx): the op took no effect.
func (o *Op) refused() bool { return o.Status >= 400 && o.Status < 500 }

// mayHaveApplied reports whether a write's effect may exist at time t: it
// was not refused and it began before t (an op without an answer may take
// effect at any time after it began).
func (o *Op) mayHaveApplied(t time.Time) bool { return !o.refused() && o.Start.Before(t) }

// before reports whether a ended before b began: real-time order, the only
// order the history proves.
func before(a, b *Op) bool { return a.End.Before(b.Start) }

// ack is an acknowledged send: the seq it was answered and when.
type ack struct {
	seq int64
	op  *Op
}

// acks indexes the acknowledged sends (201, or 200 for a repeat) of each
// topic by seq, the earliest answer of a seq kept.
type acks map[topicKey][]ack

func ackedSends(all []*Op) acks {
	bySeq := map[topicKey]map[int64]*Op{}
	for _, o := range all {
		if o.Kind != Send || !o.Acked() || len(o.Messages) == 0 || o.Messages[0].Seq <= 0 {
			continue
		}
		k, s := keyOf(o), o.Messages[0].Seq
		if bySeq[k] == nil {
			bySeq[k] = map[int64]*Op{}
		}
		if prev := bySeq[k][s]; prev == nil || o.End.Before(prev.End) {
			bySeq[k][s] = o
		}
	}
	out := acks{}
	for k, m := range bySeq {
		list := make([]ack, 0, len(m))
		for s, o := range m {
			list = append(list, ack{s, o})
		}
		slices.SortFunc(list, func(a, b ack) int { return int(a.seq - b.seq) })
		out[k] = list
	}
	return out
}

// in returns the acknowledged sends of k with lo < seq <= hi.
func (a acks) in(k topicKey, lo, hi int64) []ack {
	list := a[k]
	i := sort.Search(len(list), func(i int) bool { return list[i].seq > lo })
	j := sort.Search(len(list), func(i int) bool { return list[i].seq > hi })
	if i >= j {
		return nil
	}
	return list[i:j]
}

// visibility knows which writes may hide a message from a reader: the
// reader's own hidden ranges and deletes for everyone (lists skip both).
type visibility struct {
	hides   map[topicKey]map[int64][]*Op // by user
	deletes map[topicKey]map[int64][]*Op // by seq
}

func newVisibility(all []*Op) visibility {
	v := visibility{hides: map[topicKey]map[int64][]*Op{}, deletes: map[topicKey]map[int64][]*Op{}}
	add := func(m map[topicKey]map[int64][]*Op, k topicKey, i int64, o *Op) {
		if m[k] == nil {
			m[k] = map[int64][]*Op{}
		}
		m[k][i] = append(m[k][i], o)
	}
	for _, o := range all {
		switch {
		case o.refused():
		case o.Kind == Hide:
			add(v.hides, keyOf(o), o.User, o)
		case o.Kind == DeleteAll:
			add(v.deletes, keyOf(o), o.Seq, o)
		}
	}
	return v
}

// mayBeAbsent reports whether seq of k may be legitimately missing from
// what user read by t: a hide of the user's covering it or a delete for
// everyone of it that may have applied by then. Either one counts whether
// it was answered or not: an op without an answer may have applied.
func (v visibility) mayBeAbsent(k topicKey, user, seq int64, t time.Time) bool {
	for _, h := range v.hides[k][user] {
		if h.Seq <= seq && seq < h.HideHi && h.mayHaveApplied(t) {
			return true
		}
	}
	for _, d := range v.deletes[k][seq] {
		if d.mayHaveApplied(t) {
			return true
		}
	}
	return false
}

// walk is a since walk: the pages one client read of one topic, each
// starting where the previous one ended (its Since the previous NextSince).
type walk struct {
	pages []*Op
}

// seqs returns the message seqs the walk delivered, in order.
func (w walk) seqs() []int64 {
	var out []int64
	for _, p := range w.pages {
		for _, m := range p.Messages {
			out = append(out, m.Seq)
		}
	}
	return out
}

// sinceWalks rebuilds the walks from the pages: a client's answered page
// continues its walk of the topic when it starts at the walk's end, and
// begins a new walk otherwise. Unanswered pages belong to none (the client
// asks again from the same place).
func sinceWalks(all []*Op) []walk {
	type client struct {
		tenant, topic string
		client        int
	}
	open := map[client]int{}
	var out []walk
	for _, o := range all {
		if o.Kind != PageSince || o.Status != 200 {
			continue
		}
		c := client{o.Tenant, o.Topic, o.Client}
		if i, ok := open[c]; ok && out[i].pages[len(out[i].pages)-1].NextSince == o.Since {
			out[i].pages = append(out[i].pages, o)
			continue
		}
		open[c] = len(out)
		out = append(out, walk{pages: []*Op{o}})
	}
	return out
}

// follow is one topic followed on one socket: from the open (single-topic
// socket) or the subscribe that began it to the close, the unsubscribe or
// the error frame that ended it, with the topic's frames in the order they
// arrived.
type follow struct {
	begin        *Op // the stream_open or stream_subscribe
	topic        topicKey
	since        int64 // the catch-up's start; -1 without
	changesSince int64 // -1 without
	frames       []*Op
}

// frameTopic is the topic a frame is of.
func frameTopic(o *Op) string {
	switch {
	case o.Topic != "":
		return o.Topic
	case len(o.Messages) > 0:
		return o.Messages[0].Topic
	case o.Change != nil:
		return o.Change.Topic
	}
	return ""
}

// follows splits every socket's frames by topic.
func follows(all []*Op) []*follow {
	type socket struct {
		open   *Op
		topics map[string]*follow
	}
	sockets := map[int64]*socket{}
	var out []*follow
	start := func(s *socket, begin *Op, topic string, since, changesSince int64) {
		f := &follow{begin: begin, topic: topicKey{begin.Tenant, topic}, since: since, changesSince: changesSince}
		s.topics[topic] = f
		out = append(out, f)
	}
	for _, o := range all {
		if o.Stream == 0 {
			continue
		}
		s := sockets[o.Stream]
		switch o.Kind {
		case StreamOpen:
			s = &socket{open: o, topics: map[string]*follow{}}
			sockets[o.Stream] = s
			if o.Topic != "" {
				start(s, o, o.Topic, o.Since, o.ChangesSince)
			}
			for _, t := range o.StreamTopics {
				start(s, o, t, -1, -1)
			}
		case StreamSubscribe:
			if s != nil && !o.refused() {
				start(s, o, o.Topic, o.Since, o.ChangesSince)
			}
		case StreamUnsubscribe:
			if s != nil {
				delete(s.topics, o.Topic)
			}
		case StreamClose:
			delete(sockets, o.Stream)
		case Frame:
			if s == nil {
				continue
			}
			t := frameTopic(o)
			f := s.topics[t]
			if f == nil {
				continue
			}
			f.frames = append(f.frames, o)
			if o.FrameType == "error" {
				delete(s.topics, t)
			}
		}
	}
	return out
}

// frameSeq is the seq a message frame carries.
func frameSeq(o *Op) int64 {
	if len(o.Messages) == 0 {
		return 0
	}
	return o.Messages[0].Seq
}

// observed calls fn for every message an answer or a frame showed: pages,
// lookups, frames, change answers and the topic lists' last messages.
func observed(all []*Op, fn func(o *Op, m *Msg)) {
	for _, o := range all {
		if o.Kind == Send || !(o.Acked() || o.Kind == Frame) {
			continue
		}
		for i := range o.Messages {
			fn(o, &o.Messages[i])
		}
		for i := range o.Topics {
			if m := o.Topics[i].LastMessage; m != nil {
				fn(o, m)
			}
		}
	}
}

// msgKey is the topic of a message shown in op o (a by-id lookup names no
// topic in its request).
func msgKey(o *Op, m *Msg) topicKey {
	if m.Topic != "" {
		return topicKey{o.Tenant, m.Topic}
	}
	return keyOf(o)
}

// violation names the ops that show a broken invariant, earliest first.
func violation(checker, detail string, ops ...*Op) Violation {
	ops = slices.Clone(ops)
	slices.SortStableFunc(ops, func(a, b *Op) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return int(a.ID - b.ID)
	})
	v := Violation{Checker: checker, Detail: detail}
	for i, o := range ops {
		if i == 0 || o != ops[i-1] {
			v.Ops = append(v.Ops, o.ID)
		}
	}
	return v
}
