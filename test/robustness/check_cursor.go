package robustness

import (
	"fmt"
	"sort"
)

const cursorName = "cursor"

// Cursor: a read cursor only moves forward.
var Cursor = Checker{
	Name: cursorName,
	Invariant: "per user and topic, a PUT read answer is never below one that ended before it began, and a " +
		"list or sync entry of a read that began after a PUT answered X has read_seq >= X " +
		"(read cursors only move forward)",
	Check: checkCursor,
}

func checkCursor(ops []Op) []Violation {
	all := ordered(ops)
	type userTopic struct {
		topicKey
		user int64
	}
	// each cursor's answered PUTs by answer time, as the highest answer
	// (and the op that gave it) by then
	type answered struct {
		op   *Op
		high *Op
	}
	puts := map[userTopic][]answered{}
	for _, o := range all {
		if o.Kind == CursorPut && o.Status == 200 {
			k := userTopic{keyOf(o), o.User}
			puts[k] = append(puts[k], answered{op: o})
		}
	}
	for _, as := range puts {
		sort.SliceStable(as, func(i, j int) bool { return as[i].op.End.Before(as[j].op.End) })
		for i := range as {
			as[i].high = as[i].op
			if i > 0 && as[i-1].high.ReadSeq > as[i].op.ReadSeq {
				as[i].high = as[i-1].high
			}
		}
	}
	// highest is the highest answer of k that ended before o began
	highest := func(k userTopic, o *Op) *Op {
		as := puts[k]
		i := sort.Search(len(as), func(i int) bool { return !as[i].op.End.Before(o.Start) }) - 1
		if i < 0 {
			return nil
		}
		return as[i].high
	}
	var out []Violation
	for _, o := range all {
		switch {
		case o.Kind == CursorPut && o.Status == 200:
			if h := highest(userTopic{keyOf(o), o.User}, o); h != nil && h.ReadSeq > o.ReadSeq {
				out = append(out, violation(cursorName,
					fmt.Sprintf("user %d's cursor of %s answered %d after %d", o.User, o.Topic, o.ReadSeq, h.ReadSeq), h, o))
			}
		case (o.Kind == List || o.Kind == Sync) && o.Status == 200:
			for _, e := range o.Topics {
				if e.Removed {
					continue
				}
				if h := highest(userTopic{topicKey{o.Tenant, e.Topic}, o.User}, o); h != nil && h.ReadSeq > e.ReadSeq {
					out = append(out, violation(cursorName,
						fmt.Sprintf("user %d's %s entry of %s has read_seq %d after a PUT answered %d", o.User, o.Kind, e.Topic, e.ReadSeq, h.ReadSeq), h, o))
				}
			}
		}
	}
	return out
}
