package readpath

import (
	"cmp"
	"slices"
	"sort"
	"unsafe"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/message"
)

// Order of a page.
type Order int

const (
	Desc Order = iota // newest first (before, search)
	Asc               // oldest first (since, context)
)

// merge appends rows read from one more month table to a page being built,
// keeping it sorted in order and each seq once. Month ranges never overlap
// (invariant 4), yet a row can be met twice — read from the hot cache and
// from MySQL, or from a legacy table during a migration — and then the
// newer version wins.
func merge(page, rows []message.Message, o Order) []message.Message {
	out := make([]message.Message, 0, len(page)+len(rows))
	i, j := 0, 0
	for i < len(page) || j < len(rows) {
		var next message.Message
		switch {
		case j == len(rows):
			next, i = page[i], i+1
		case i == len(page):
			next, j = rows[j], j+1
		case first(page[i].Seq, rows[j].Seq, o):
			next, i = page[i], i+1
		case page[i].Seq == rows[j].Seq:
			next = newer(page[i], rows[j])
			i, j = i+1, j+1
		default:
			next, j = rows[j], j+1
		}
		if n := len(out); n > 0 && out[n-1].Seq == next.Seq {
			out[n-1] = newer(out[n-1], next)
			continue
		}
		out = append(out, next)
	}
	return out
}

// first reports whether a sorts strictly before b in order o.
func first(a, b int64, o Order) bool {
	if o == Desc {
		return a > b
	}
	return a < b
}

func newer(a, b message.Message) message.Message {
	if b.Version > a.Version || (b.Version == a.Version && b.UpdatedAt.After(a.UpdatedAt.Time)) {
		return b
	}
	return a
}

// Truncate cuts a page read with one row of lookahead to limit: has_more is
// whether the lookahead row existed.
func Truncate(page []message.Message, limit int) ([]message.Message, bool) {
	if len(page) > limit {
		return page[:limit], true
	}
	return page, false
}

// NextBefore is a before page's cursor: the last seq scanned, or nil for
// an empty page (nothing older is visible).
func NextBefore(page []message.Message) *int64 {
	if len(page) == 0 {
		return nil
	}
	s := page[len(page)-1].Seq
	return &s
}

// nextSince is a since page's cursor: the last seq scanned, or the
// request's since for an empty page.
func nextSince(page []message.Message, since int64) int64 {
	if len(page) == 0 {
		return since
	}
	return page[len(page)-1].Seq
}

// Hidden is a caller's deletion ranges [Low, Hi) (im_dellog).
type Hidden [][2]int64

// Hides reports whether seq falls in one of the ranges.
func (h Hidden) Hides(seq int64) bool {
	for _, r := range h {
		if seq >= r[0] && seq < r[1] {
			return true
		}
	}
	return false
}

// Cached is what the hot cache holds around a page: its members as read
// (score = seq, sorted by score in either direction; several may share a
// seq), the recorded gaps, and the bounds the read covered — members and
// gaps were read completely within [Lo, Hi]. Members are read only when a
// page walks over them.
type Cached struct {
	Members []rueidis.ZScore
	Gaps    map[int64]bool
	Lo      int64
	Hi      int64
	Full    bool // the read returned all it asked for: more may lie beyond [Lo, Hi]
	// Version is the topic's message version read before the members
	// (routing.Keys.MessagesVersion): they are at least as new as it;
	// unversioned when Redis held none.
	Version int64
}

// unversioned is the Version of a read that found no message version.
const unversioned = 0

// msg is the cached message of seq; of several members for one seq the
// newest wins, and one that does not read back as this seq proves nothing.
// A member in the writer's own layout goes to the page as it is
// (message.Peek); others are decoded.
func (c Cached) msg(seq int64) (message.Message, bool) {
	var found message.Message
	ok := false
	for i := c.first(seq); i < len(c.Members) && int64(c.Members[i].Score) == seq; i++ {
		raw := bytesOf(c.Members[i].Member)
		var m message.Message
		if p, peeked := message.Peek(raw); peeked {
			m = p.Message()
		} else {
			var err error
			if m, err = message.DecodeJSON(raw); err != nil {
				continue
			}
		}
		if m.Seq != seq {
			continue
		}
		if ok {
			m = newer(found, m)
		}
		found, ok = m, true
	}
	return found, ok
}

// GapsIn lists the recorded gaps read within [lo, hi], ascending.
func (c Cached) GapsIn(lo, hi int64) []int64 {
	var out []int64
	for g := range c.Gaps {
		if g >= lo && g <= hi {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// bytesOf views a member as bytes without copying it: Peek and DecodeJSON
// only read their input, and a peeked message's Encoded, which aliases the
// member, is only ever copied out (AppendJSON). Nothing may write to it.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// first is the index of the first member scored seq (len if none).
func (c Cached) first(seq int64) int {
	n := len(c.Members)
	desc := n > 1 && c.Members[0].Score > c.Members[n-1].Score
	return sort.Search(n, func(i int) bool {
		if desc {
			return int64(c.Members[i].Score) <= seq
		}
		return int64(c.Members[i].Score) >= seq
	})
}

// hotView is what a page walks: the hot-cache read of its request (top)
// and, when one was used, this process's copy of the topic's newest
// stretch (base): seqs from base.lo to base.hi are the copy's, all others
// the read's — above a copy held from before, the read is of what lies
// above it; below a copy just made from the read, the read may know more.
type hotView struct {
	Top  Cached
	base *recent
}

// inBase reports whether the copy answers for seq.
func (v hotView) inBase(seq int64) bool {
	return v.base != nil && seq >= v.base.lo && seq <= v.base.hi
}

// Lo is the lowest seq the view may cover.
func (v hotView) Lo() int64 {
	if v.base != nil {
		return min(v.base.lo, v.Top.Lo)
	}
	return v.Top.Lo
}

// covers reports whether seq lies within what the view read completely.
func (v hotView) covers(seq int64) bool {
	return v.inBase(seq) || seq >= v.Top.Lo && seq <= v.Top.Hi
}

// GapsIn lists the recorded gaps within [lo, hi], ascending, and whether
// the view covers all of [lo, hi] (else the list proves nothing).
func (v hotView) GapsIn(lo, hi int64) ([]int64, bool) {
	var out []int64
	for lo <= hi {
		if v.inBase(lo) {
			out = append(out, v.base.gapsIn(lo, hi)...)
			lo = v.base.hi + 1
			continue
		}
		// the read's part: up to the copy, if the copy lies above
		end := hi
		if v.base != nil && lo < v.base.lo {
			end = min(hi, v.base.lo-1)
		}
		if !v.covers(lo) || !v.covers(end) {
			return nil, false
		}
		out = append(out, v.Top.GapsIn(lo, end)...)
		lo = end + 1
	}
	return out, true
}

// Held lists the messages the view holds with seq below `below`, newest
// first, without globally deleted ones. A message is in the hot cache
// before its send answers 201 but in MySQL only once persisted: a page the
// view cannot prove complete, which MySQL answers, adds these so that a
// reader whose request starts after the 201 sees the message.
func (v hotView) Held(below int64) []message.Message {
	var fromCopy, fromRead []message.Message
	if v.base != nil {
		for s := min(v.base.hi, below-1); s >= v.base.lo; s-- {
			if m := v.base.at(s); m != nil && m.Status != message.StatusDeleted {
				fromCopy = append(fromCopy, *m)
			}
		}
	}
	for i, z := range v.Top.Members {
		s := int64(z.Score)
		if s >= below || v.inBase(s) || i > 0 && int64(v.Top.Members[i-1].Score) == s {
			continue
		}
		if m, ok := v.Top.msg(s); ok && m.Status != message.StatusDeleted {
			fromRead = append(fromRead, m.Normalized())
		}
	}
	slices.SortFunc(fromRead, func(a, b message.Message) int { return cmp.Compare(b.Seq, a.Seq) })
	return merge(fromCopy, fromRead, Desc)
}

// walk builds a page from the view starting at seq from, stepping towards
// stop (inclusive) in order o, with one row of lookahead. It succeeds only
// if the view provably covers every seq it passes: each is cached or a
// recorded gap, within the bounds read; on failure miss is the first seq
// it could not prove. It ends early once the page holds limit+1 visible
// rows. Deleted rows are skipped unless keepDeleted, hidden ones always.
func walk(v hotView, from, stop int64, o Order, limit int, hidden Hidden, keepDeleted bool) (page []message.Message, ok bool, miss int64) {
	step := int64(1)
	if o == Desc {
		step = -1
	}
	page = make([]message.Message, 0, limit+1)
	for s := from; ; s += step {
		if first(stop, s, o) {
			return page, true, 0
		}
		if !v.covers(s) {
			return nil, false, s
		}
		var m message.Message
		if v.inBase(s) {
			p := v.base.at(s)
			if p == nil {
				continue // a recorded gap
			}
			m = *p // normalized when the copy was made
		} else {
			found := false
			if m, found = v.Top.msg(s); !found {
				if !v.Top.Gaps[s] {
					return nil, false, s
				}
				continue
			}
			m = m.Normalized()
		}
		if hidden.Hides(s) || (m.Status == message.StatusDeleted && !keepDeleted) {
			continue
		}
		page = append(page, m)
		if len(page) > limit {
			return page, true, 0
		}
	}
}
