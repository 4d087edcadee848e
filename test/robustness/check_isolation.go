package robustness

import (
	"fmt"
	"time"
)

const isolationName = "isolation"

// Isolation: a topic's data reaches its members (and the tenant's
// admins), a tenant's data its own tenant.
var Isolation = Checker{
	Name: isolationName,
	Invariant: "nothing of a topic (pages, lookups, stream frames, list, unread and sync entries other than removed) " +
		"reaches a user who was not a member for the whole read: one that began after a leave answered and ended " +
		"before any later join began, or ended before any join of the user began; a dissolve ends the group's " +
		"list, unread and sync entries (other than removed) the same way until a reactivation or a join, while its " +
		"members keep reading its history (pages, lookups, streams); admin tokens read any topic of their tenant; " +
		"no message of one tenant reaches another (invariant 10)",
	Check: checkIsolation,
}

// membership holds the writes that decide who may read a topic.
type membership struct {
	joins, leaves map[topicKey]map[int64][]*Op // by user
	dissolves     map[topicKey][]*Op
	puts          map[topicKey][]*Op // create or reactivate
}

func newMembership(all []*Op) membership {
	m := membership{joins: map[topicKey]map[int64][]*Op{}, leaves: map[topicKey]map[int64][]*Op{},
		dissolves: map[topicKey][]*Op{}, puts: map[topicKey][]*Op{}}
	byUser := func(idx map[topicKey]map[int64][]*Op, o *Op) {
		k := keyOf(o)
		if idx[k] == nil {
			idx[k] = map[int64][]*Op{}
		}
		idx[k][o.User] = append(idx[k][o.User], o)
	}
	for _, o := range all {
		switch {
		case o.Kind == Join && !o.refused():
			byUser(m.joins, o)
		case o.Kind == Leave && o.Acked():
			byUser(m.leaves, o)
		case o.Kind == Dissolve && o.Acked():
			m.dissolves[keyOf(o)] = append(m.dissolves[keyOf(o)], o)
		case o.Kind == GroupPut && !o.refused():
			m.puts[keyOf(o)] = append(m.puts[keyOf(o)], o)
		}
	}
	return m
}

// excluded reports whether user was no member of k for all of [start, end],
// with the write that proves it (none when the user never joined). A
// dissolve counts only when the read is an entry of the user's topics
// (entry: list, unread, sync): it leaves the members in the group, and
// they keep reading its history.
func (m membership) excluded(k topicKey, user int64, start, end time.Time, entry bool) (bool, *Op) {
	joins := m.joins[k][user]
	// a join (or a reactivation) that may take effect after w and before
	// end ends w's exclusion; one without an answer may apply at any time
	undone := func(w *Op, by []*Op) bool {
		for _, j := range by {
			if j.Start.Before(end) && (j.Unknown() || j.End.After(w.Start)) {
				return true
			}
		}
		return false
	}
	var first *Op
	for _, j := range joins {
		if first == nil || j.Start.Before(first.Start) {
			first = j
		}
	}
	if first == nil || end.Before(first.Start) {
		return true, first
	}
	for _, l := range m.leaves[k][user] {
		if l.End.Before(start) && !undone(l, joins) {
			return true, l
		}
	}
	for _, d := range m.dissolves[k] {
		if entry && d.End.Before(start) && !undone(d, joins) && !undone(d, m.puts[k]) {
			return true, d
		}
	}
	return false, nil
}

func checkIsolation(ops []Op) []Violation {
	all := ordered(ops)
	mem := newMembership(all)
	var vs []Violation
	reported := map[int64]bool{} // by read
	shown := func(read *Op, k topicKey, user int64, start time.Time, what string) {
		entry := read.Kind == List || read.Kind == Unread || read.Kind == Sync
		out, w := mem.excluded(k, user, start, read.End, entry)
		if !out || reported[read.ID] {
			return
		}
		reported[read.ID] = true
		why := "never joined"
		ops := []*Op{read}
		if w != nil {
			why = fmt.Sprintf("%s (#%d)", w.Kind, w.ID)
			if w.Kind == Join {
				why = fmt.Sprintf("only joined later (#%d)", w.ID)
			}
			ops = append(ops, w)
		}
		vs = append(vs, violation(isolationName, fmt.Sprintf("%s reached user %d of %s, who %s", what, user, k.topic, why), ops...))
	}
	for _, o := range all {
		if o.Role == "admin" || !(o.Acked() || o.Kind == Frame) {
			continue
		}
		switch o.Kind {
		case PageSince, PageBefore, BySeq, ByID:
			for i := range o.Messages {
				shown(o, msgKey(o, &o.Messages[i]), o.User, o.Start, fmt.Sprintf("%s of seq %d", o.Kind, o.Messages[i].Seq))
			}
			if len(o.Messages) == 0 && len(o.Gaps) > 0 {
				shown(o, keyOf(o), o.User, o.Start, fmt.Sprintf("%s gaps", o.Kind))
			}
		case List, Unread, Sync:
			for _, e := range o.Topics {
				if !e.Removed {
					shown(o, topicKey{o.Tenant, e.Topic}, o.User, o.Start, fmt.Sprintf("a %s entry", o.Kind))
				}
			}
		}
	}
	for _, f := range follows(all) {
		if f.begin.Role == "admin" {
			continue
		}
		for _, fr := range f.frames {
			if fr.FrameType == "message" || fr.FrameType == "change" || fr.FrameType == "gap" || fr.FrameType == "live" {
				shown(fr, f.topic, f.begin.User, f.begin.Start, fmt.Sprintf("a %s frame on stream %d", fr.FrameType, fr.Stream))
			}
		}
	}
	return append(vs, tenantLeaks(all)...)
}

// tenantLeaks finds a message another tenant's send was answered with in
// an answer of this tenant's (snowflake ids are unique across tenants).
func tenantLeaks(all []*Op) []Violation {
	owner := map[string]*Op{}
	for _, o := range all {
		if o.Kind == Send && o.Acked() && len(o.Messages) > 0 && o.Messages[0].MessageID != "" {
			if owner[o.Messages[0].MessageID] == nil {
				owner[o.Messages[0].MessageID] = o
			}
		}
	}
	var out []Violation
	observed(all, func(o *Op, m *Msg) {
		if s := owner[m.MessageID]; s != nil && s.Tenant != o.Tenant {
			out = append(out, violation(isolationName,
				fmt.Sprintf("message %s of tenant %s reached tenant %s", m.MessageID, s.Tenant, o.Tenant), s, o))
		}
	})
	return out
}
