package readpath

import (
	"cmp"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/message"
)

func msgs(seqs ...int64) []message.Message {
	out := make([]message.Message, len(seqs))
	for i, s := range seqs {
		out[i] = message.Message{Seq: s, Version: 1, Status: message.StatusNormal}
	}
	return out
}

func seqsOf(ms []message.Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Seq
	}
	return out
}

func TestMerge(t *testing.T) {
	cases := []struct {
		name      string
		page, add []int64
		o         Order
		want      []int64
	}{
		{"append desc", []int64{9, 8}, []int64{5, 4}, Desc, []int64{9, 8, 5, 4}},
		{"interleave asc", []int64{1, 4}, []int64{2, 3, 5}, Asc, []int64{1, 2, 3, 4, 5}},
		{"dedup", []int64{5, 4, 3}, []int64{4, 3, 2}, Desc, []int64{5, 4, 3, 2}},
		{"dup inside one side", nil, []int64{1, 1, 2}, Asc, []int64{1, 2}},
		{"empty", nil, nil, Asc, []int64{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := seqsOf(merge(msgs(c.page...), msgs(c.add...), c.o))
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
	t.Run("newer version wins", func(t *testing.T) {
		a, b := msgs(7), msgs(7)
		b[0].Version, b[0].Status = 2, message.StatusRecalled
		if got := merge(a, b, Desc); len(got) != 1 || got[0].Version != 2 {
			t.Fatalf("got %+v", got)
		}
		b[0].UpdatedAt = message.NewTime(time.Now())
		if got := merge(b, a, Desc); got[0].Version != 2 {
			t.Fatalf("older won: %+v", got)
		}
	})
}

func TestTruncateAndCursors(t *testing.T) {
	page, more := Truncate(msgs(10, 9, 8), 2)
	if !slices.Equal(seqsOf(page), []int64{10, 9}) || !more {
		t.Fatalf("truncate: %v %v", seqsOf(page), more)
	}
	if n := NextBefore(page); n == nil || *n != 9 {
		t.Fatalf("next_before = %v", n)
	}
	if NextBefore(nil) != nil {
		t.Fatal("empty before page must have next_before null")
	}
	if nextSince(nil, 42) != 42 || nextSince(msgs(43, 44), 42) != 44 {
		t.Fatal("next_since")
	}
	if page, more := Truncate(msgs(1), 5); len(page) != 1 || more {
		t.Fatal("short page has no more")
	}
}

// cached is a cache read holding messages (as send writes them, newest
// first as a before page reads them) and gaps within [lo, hi].
func cached(t *testing.T, lo, hi int64, have []message.Message, gaps []int64) Cached {
	t.Helper()
	c := Cached{Gaps: map[int64]bool{}, Lo: lo, Hi: hi, Version: 1} // read under a message version
	for _, m := range have {
		b, err := json.Marshal(m.Normalized())
		if err != nil {
			t.Fatal(err)
		}
		c.Members = append(c.Members, rueidis.ZScore{Member: string(b), Score: float64(m.Seq)})
	}
	slices.SortStableFunc(c.Members, func(a, b rueidis.ZScore) int { return cmp.Compare(b.Score, a.Score) })
	for _, g := range gaps {
		c.Gaps[g] = true
	}
	return c
}

func TestCachedMembers(t *testing.T) {
	old := msgs(5)[0]
	cur := old
	cur.Version, cur.Content = 2, json.RawMessage(`{"text":"edited"}`)
	other := msgs(6)[0]
	for _, desc := range []bool{true, false} {
		c := cached(t, 1, 10, []message.Message{other, old, cur}, nil)
		if !desc {
			slices.Reverse(c.Members)
		}
		m, ok := c.msg(5)
		if !ok || m.Version != 2 {
			t.Fatalf("desc=%v: the newer of two members must win: %+v %v", desc, m, ok)
		}
		if _, ok := c.msg(4); ok {
			t.Fatalf("desc=%v: seq 4 found", desc)
		}
		if m, ok := c.msg(6); !ok || m.Seq != 6 {
			t.Fatalf("desc=%v: seq 6: %+v %v", desc, m, ok)
		}
	}
	bad := Cached{Members: []rueidis.ZScore{{Member: `{"seq":`, Score: 3}, {Member: `{"seq":4}`, Score: 3}}}
	if _, ok := bad.msg(3); ok {
		t.Fatal("members that do not read back as seq 3 proved it cached")
	}
}

func TestWalkCoverage(t *testing.T) {
	full := cached(t, 1, 20, msgs(1, 2, 3, 5, 6, 7, 8, 9, 10), []int64{4})
	cases := []struct {
		name       string
		c          Cached
		from, stop int64
		o          Order
		limit      int
		hidden     Hidden
		want       []int64
		ok         bool
	}{
		{"desc page with lookahead", full, 10, 1, Desc, 3, nil, []int64{10, 9, 8, 7}, true},
		{"desc steps over a recorded gap", full, 6, 1, Desc, 3, nil, []int64{6, 5, 3, 2}, true},
		{"desc reaches seq 1: complete", full, 3, 1, Desc, 10, nil, []int64{3, 2, 1}, true},
		{"desc empty range", full, 0, 1, Desc, 10, nil, nil, true},
		{"hole is not covered", cached(t, 1, 20, msgs(1, 3), nil), 3, 1, Desc, 10, nil, nil, false},
		{"outside the bounds read", cached(t, 5, 20, msgs(5, 6), nil), 6, 1, Desc, 10, nil, nil, false},
		{"asc to the stop", full, 7, 10, Asc, 10, nil, []int64{7, 8, 9, 10}, true},
		{"asc stops past the cache", full, 9, 11, Asc, 10, nil, nil, false},
		{"hidden seqs are skipped", full, 10, 1, Desc, 2, Hidden{{8, 10}}, []int64{10, 7, 6}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok, _ := walk(hotView{Top: c.c}, c.from, c.stop, c.o, c.limit, c.hidden, false)
			if ok != c.ok || (ok && !slices.Equal(seqsOf(got), c.want)) {
				t.Fatalf("got %v %v, want %v %v", seqsOf(got), ok, c.want, c.ok)
			}
		})
	}
	t.Run("deleted skipped unless kept", func(t *testing.T) {
		ms := msgs(1, 2, 3)
		ms[1].Status = message.StatusDeleted
		c := cached(t, 1, 3, ms, nil)
		got, _, _ := walk(hotView{Top: c}, 3, 1, Desc, 10, nil, false)
		if !slices.Equal(seqsOf(got), []int64{3, 1}) {
			t.Fatalf("got %v", seqsOf(got))
		}
		got, _, _ = walk(hotView{Top: c}, 3, 1, Desc, 10, nil, true)
		if !slices.Equal(seqsOf(got), []int64{3, 2, 1}) {
			t.Fatalf("kept: got %v", seqsOf(got))
		}
	})
}

func TestHidden(t *testing.T) {
	h := Hidden{{5, 10}, {20, 21}}
	for seq, want := range map[int64]bool{4: false, 5: true, 9: true, 10: false, 20: true, 21: false} {
		if h.Hides(seq) != want {
			t.Errorf("Hides(%d) = %v", seq, !want)
		}
	}
}
