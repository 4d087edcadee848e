package readpath

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
)

// checkRecent verifies a copy's own consistency: every seq of [lo, hi] is
// a message read back as that seq or one of the listed gaps.
func checkRecent(t *testing.T, r *recent, lo, hi int64, gaps []int64) {
	t.Helper()
	if r == nil {
		t.Fatal("no copy")
	}
	if r.lo != lo || r.hi != hi || len(r.msgs) != int(hi-lo+1) {
		t.Fatalf("copy [%d, %d] of %d seqs, want [%d, %d]", r.lo, r.hi, len(r.msgs), lo, hi)
	}
	for s := lo; s <= hi; s++ {
		m := r.at(s)
		if slices.Contains(gaps, s) != (m == nil) {
			t.Fatalf("seq %d: gap %v, message %v", s, slices.Contains(gaps, s), m)
		}
		if m != nil && m.Seq != s {
			t.Fatalf("seq %d holds message %d", s, m.Seq)
		}
	}
	if got := r.gapsIn(lo, hi); !slices.Equal(got, gaps) && len(got)+len(gaps) > 0 {
		t.Fatalf("gaps %v, want %v", got, gaps)
	}
}

func TestNewRecent(t *testing.T) {
	at := time.Unix(100, 0)
	// 1–10 with 4 a gap and 2 unknown (pending or lost)
	c := cached(t, 1, math.MaxInt64-1, msgs(1, 3, 5, 6, 7, 8, 9, 10), []int64{4})
	checkRecent(t, newRecent(c, 10, at), 3, 10, []int64{4})
	checkRecent(t, newRecent(c, 8, at), 3, 8, []int64{4})
	if r := newRecent(c, 11, at); r != nil {
		t.Fatalf("an unproven top made a copy [%d, %d]", r.lo, r.hi)
	}
	lost := c
	lost.Version = unversioned
	if r := newRecent(lost, 10, at); r != nil {
		t.Fatalf("a read without a message version made a copy [%d, %d]", r.lo, r.hi)
	}
	if r := newRecent(cached(t, 5, 20, msgs(5, 6), nil), 6, at); r.lo != 5 {
		t.Fatalf("the copy reaches below the read: lo %d", r.lo)
	}
	var many []int64
	for s := int64(1); s <= 300; s++ {
		many = append(many, s)
	}
	checkRecent(t, newRecent(cached(t, 1, 300, msgs(many...), nil), 300, at), 300-recentKeep+1, 300, nil)
}

func TestRecentExtend(t *testing.T) {
	at := time.Unix(100, 0)
	base := newRecent(cached(t, 1, 10, msgs(3, 5, 6, 7, 8, 9, 10), []int64{4}), 10, at)
	// above 10: 11, 12, gap 13, 14, then 15 unknown, 16
	delta := cached(t, 11, math.MaxInt64-1, msgs(11, 12, 14, 16), []int64{13})
	got := base.extend(delta)
	checkRecent(t, got, 3, 14, []int64{4, 13})
	if got.read != at {
		t.Fatal("an extension must keep the time of the full read")
	}
	checkRecent(t, base, 3, 10, []int64{4}) // copies never change
	if same := base.extend(cached(t, 11, 20, nil, nil)); same != base {
		t.Fatal("nothing proven above: the copy itself")
	}
	if same := base.extend(cached(t, 12, 20, msgs(12), nil)); same != base {
		t.Fatal("a read not reaching right above the copy extends nothing")
	}
	// at recentKeep the oldest go: messages and gaps re-indexed
	var seqs []int64
	for s := int64(1); s <= recentKeep; s++ {
		if s%10 != 0 {
			seqs = append(seqs, s)
		}
	}
	var gaps []int64
	for s := int64(10); s <= recentKeep; s += 10 {
		gaps = append(gaps, s)
	}
	full := newRecent(cached(t, 1, recentKeep, msgs(seqs...), gaps), recentKeep, at)
	checkRecent(t, full, 1, recentKeep, gaps)
	grown := full.extend(cached(t, recentKeep+1, math.MaxInt64-1, msgs(recentKeep+1, recentKeep+2, recentKeep+4), []int64{recentKeep + 3}))
	var kept []int64
	for _, g := range append(gaps, recentKeep+3) {
		if g >= 5 {
			kept = append(kept, g)
		}
	}
	checkRecent(t, grown, 5, recentKeep+4, kept)
	// more new seqs than a copy keeps: the copy is the newest of them only
	// up to what one read proves at a time, nothing of the old stretch
	var burst []int64
	for s := int64(11); s <= 11+recentKeep+20; s++ {
		burst = append(burst, s)
	}
	checkRecent(t, base.extend(cached(t, 11, math.MaxInt64-1, msgs(burst...), nil)), 11, 10+recentKeep, nil)
}

func TestRecentUsable(t *testing.T) {
	r := &recent{lo: 41, hi: 100}
	cases := []struct {
		name  string
		o     Order
		bound int64
		n     int
		want  bool
	}{
		{"latest page within the copy", Desc, math.MaxInt64, 55, true},
		{"latest page deeper than the copy", Desc, math.MaxInt64, 61, false},
		{"cursor leaving too little below", Desc, 60, 55, false},
		{"cursor above the copy", Desc, 200, 60, true},
		{"since inside the copy", Asc, 50, 55, true},
		{"since right below the copy", Asc, 40, 55, true},
		{"since below the copy", Asc, 39, 55, false},
		{"since at the copy's top", Asc, 100, 55, true},
		{"since above the copy", Asc, 101, 55, false},
	}
	for _, c := range cases {
		if got := r.usable(c.o, c.bound, c.n); got != c.want {
			t.Errorf("%s: usable %v", c.name, got)
		}
	}
	if !(&recent{lo: 1, hi: 3}).usable(Desc, math.MaxInt64, 55) {
		t.Error("a copy reaching seq 1 serves any latest page")
	}
}

func TestWalkOverCopy(t *testing.T) {
	at := time.Unix(100, 0)
	base := newRecent(cached(t, 1, 20, msgs(11, 12, 14, 15, 16, 17, 18, 19, 20), []int64{13}), 20, at) // [11, 20]
	above := cached(t, 21, math.MaxInt64-1, msgs(21, 22, 24), nil)                                     // 23 unknown
	v := hotView{Top: above, base: base}
	page, ok, _ := walk(v, 22, 1, Desc, 5, nil, false)
	if !ok || !slices.Equal(seqsOf(page), []int64{22, 21, 20, 19, 18, 17}) {
		t.Fatalf("page over the read and the copy: %v %v", seqsOf(page), ok)
	}
	if _, ok, miss := walk(v, 24, 1, Desc, 5, nil, false); ok || miss != 23 || !v.covers(miss) {
		t.Fatalf("an unknown seq above the copy: ok %v miss %d", ok, miss)
	}
	if _, ok, miss := walk(v, 22, 1, Desc, 20, nil, false); ok || miss != 10 || v.covers(miss) {
		t.Fatalf("a page deeper than the copy: ok %v miss %d", ok, miss)
	}
	page, ok, _ = walk(v, 12, 22, Asc, 10, Hidden{{15, 17}}, false)
	if !ok || !slices.Equal(seqsOf(page), []int64{12, 14, 17, 18, 19, 20, 21, 22}) {
		t.Fatalf("since page over the copy: %v %v", seqsOf(page), ok)
	}
	if g, ok := v.GapsIn(12, 22); !ok || !slices.Equal(g, []int64{13}) {
		t.Fatalf("gaps %v %v", g, ok)
	}
	// a copy made from the read itself: below the copy the read answers
	read := cached(t, 1, math.MaxInt64-1, msgs(1, 2, 3, 5, 6), nil)
	own := hotView{Top: read, base: newRecent(read, 6, at)}
	if _, ok, miss := walk(own, 6, 1, Desc, 5, nil, false); ok || miss != 4 || !own.covers(miss) {
		t.Fatalf("an unknown seq right below a copy of the same read: ok %v miss %d", ok, miss)
	}
	if g, ok := own.GapsIn(1, 6); !ok || len(g) != 0 {
		t.Fatalf("gaps %v %v", g, ok)
	}
	hole := hotView{Top: cached(t, 25, 30, msgs(25), nil), base: base}
	if _, ok := hole.GapsIn(12, 26); ok {
		t.Fatal("gaps across a hole above the copy proved")
	}
}

// TestCopyAnswersAsTheCache: a topic's seqs turn into messages or gaps
// over time (some staying pending a while); a process that keeps a copy,
// reading only above it, answers every latest and since page exactly as a
// full read of the cache at that moment does, whenever it answers at all.
func TestCopyAnswersAsTheCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	overCopy, sinceOverCopy := 0, 0 // pages a held copy answered
	for round := range 20 {
		const (
			unknown = iota
			isMsg
			isGap
		)
		state := []int{unknown} // by seq; seq 0 unused
		var held *recent
		now := time.Unix(int64(round), 0)
		full := func() Cached {
			var ms []message.Message
			var gs []int64
			for s := 1; s < len(state); s++ {
				switch state[s] {
				case isMsg:
					ms = append(ms, msgs(int64(s))...)
				case isGap:
					gs = append(gs, int64(s))
				}
			}
			return cached(t, 1, math.MaxInt64-1, ms, gs)
		}
		for step := range 120 {
			// new seqs are issued; pending ones settle
			for range rng.IntN(4) {
				state = append(state, unknown)
			}
			for s := 1; s < len(state); s++ {
				if state[s] == unknown && rng.IntN(3) > 0 {
					state[s] = isMsg
					if rng.IntN(8) == 0 {
						state[s] = isGap
					}
				}
			}
			last := int64(len(state) - 1)
			if last == 0 {
				continue
			}
			c := full()
			limit := 1 + rng.IntN(30)
			n := limit + 1 + HotSlack
			// the latest page, newest first
			want, wantOK, _ := walk(hotView{Top: c}, last, 1, Desc, limit, nil, false)
			v := hotView{Top: c}
			fromHeld := held != nil && held.usable(Desc, math.MaxInt64, n)
			if fromHeld {
				above := c
				above.Lo = held.hi + 1 // what a read above the copy covers
				v = hotView{Top: above, base: held}
			} else if b := newRecent(c, last, now); b != nil {
				v.base = b
			}
			got, ok, _ := walk(v, last, 1, Desc, limit, nil, false)
			if ok && fromHeld {
				overCopy++
			}
			if ok && (!wantOK || !slices.Equal(seqsOf(got), seqsOf(want))) {
				t.Fatalf("round %d step %d: latest page over the copy %v, the cache says %v (%v)", round, step, seqsOf(got), seqsOf(want), wantOK)
			}
			if v.base != nil {
				held = v.base.extend(v.Top)
				if held.hi < last {
					if r := newRecent(v.Top, last, now); r != nil {
						held = r
					}
				}
			}
			// a since page from a random cursor within the copy
			if held == nil || held.hi < held.lo {
				continue
			}
			since := held.lo - 1 + rng.Int64N(held.hi-held.lo+1)
			if !held.usable(Asc, since, n) {
				t.Fatalf("since %d within the copy [%d, %d] not usable", since, held.lo, held.hi)
			}
			want, wantOK, _ = walk(hotView{Top: c}, since+1, last, Asc, limit, nil, false)
			above := c
			above.Lo = held.hi + 1
			got, ok, _ = walk(hotView{Top: above, base: held}, since+1, last, Asc, limit, nil, false)
			if ok && (!wantOK || !slices.Equal(seqsOf(got), seqsOf(want))) {
				t.Fatalf("round %d step %d: since %d over the copy %v, the cache says %v (%v)", round, step, since, seqsOf(got), seqsOf(want), wantOK)
			}
			if ok {
				sinceOverCopy++
			}
			if ok != wantOK && wantOK {
				// the copy may only fall short where the cache itself can
				// answer: never for a page inside the copy and its read
				t.Fatalf("round %d step %d: since %d: the copy could not answer a page the cache answers", round, step, since)
			}
		}
	}
	t.Logf("over copy: %d latest, %d since", overCopy, sinceOverCopy)
	if overCopy < 200 || sinceOverCopy < 500 {
		t.Fatalf("only %d latest and %d since pages answered over a held copy", overCopy, sinceOverCopy)
	}
}

func TestRecents(t *testing.T) {
	c := newRecents(recentShards, time.Minute) // one copy per shard
	t0 := time.Unix(1000, 0)
	k := func(topic string) topicKey { return topicKey{"t1", topic} }
	r := func(hi int64, at time.Time) *recent {
		return &recent{lo: 1, hi: hi, read: at, msgs: make([]message.Message, hi)}
	}
	c.put(k("a"), r(10, t0), t0)
	if got := c.get(k("a"), t0); got == nil || got.hi != 10 {
		t.Fatalf("get: %+v", got)
	}
	if got := c.get(topicKey{"t2", "a"}, t0); got != nil {
		t.Fatal("another tenant's copy")
	}
	if got := c.get(k("a"), t0.Add(2*time.Minute)); got != nil {
		t.Fatal("a copy older than maxAge was used")
	}
	c.put(k("a"), r(5, t0), t0)
	if got := c.get(k("a"), t0); got.hi != 10 {
		t.Fatal("a young copy reaching further was replaced by a shorter one")
	}
	c.put(k("a"), r(5, t0.Add(2*time.Minute)), t0.Add(2*time.Minute))
	if got := c.get(k("a"), t0.Add(2*time.Minute)); got == nil || got.hi != 5 {
		t.Fatal("an old copy was kept over a fresh one")
	}
	c.drop(k("a"))
	if c.get(k("a"), t0) != nil || c.topics() != 0 {
		t.Fatal("drop")
	}
	// many topics: at most one per shard kept, the last put of each shard
	for i := range 200 {
		name := string(rune('A'+i%26)) + string(rune('a'+i/26))
		c.put(k(name), r(int64(i+1), t0), t0)
		if c.get(k(name), t0) == nil {
			t.Fatalf("the copy just put for %s is gone", name)
		}
	}
	if n := c.topics(); n > recentShards {
		t.Fatalf("%d copies held, at most %d", n, recentShards)
	}
	var none *recents
	none.put(k("a"), r(1, t0), t0)
	if none.get(k("a"), t0) != nil || none.topics() != 0 || newRecents(0, time.Minute) != nil || newRecents(10, 0) != nil {
		t.Fatal("copies disabled")
	}
}

// TestRecentsMessageVersion: a copy made under a newer message version
// replaces any held one, one made under an older version never replaces a
// newer one, and a copy is never extended by a read of another version.
func TestRecentsMessageVersion(t *testing.T) {
	c := newRecents(recentShards, time.Minute)
	t0 := time.Unix(1000, 0)
	k := topicKey{"t", "a"}
	r := func(hi, ver int64) *recent {
		return &recent{lo: 1, hi: hi, read: t0, ver: ver, msgs: make([]message.Message, hi)}
	}
	c.put(k, r(10, 1), t0)
	c.put(k, r(5, 2), t0)
	if got := c.get(k, t0); got.ver != 2 || got.hi != 5 {
		t.Fatalf("a shorter copy of a newer version must replace the held one: %+v", got)
	}
	c.put(k, r(20, 1), t0)
	if got := c.get(k, t0); got.ver != 2 {
		t.Fatal("a copy of an older version replaced a newer one")
	}
	at := time.Unix(100, 0)
	base := newRecent(cached(t, 1, 10, msgs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), nil), 10, at)
	delta := cached(t, 11, 20, msgs(11, 12), nil)
	delta.Version = 7
	if same := base.extend(delta); same != base {
		t.Fatal("a copy was extended by a read of another message version")
	}
	base.ver = 7
	if grown := base.extend(delta); grown.hi != 12 || grown.ver != 7 {
		t.Fatalf("extension under the same version: %+v", grown)
	}
}

func TestRecentsEvictLeastRecentlyRead(t *testing.T) {
	c := newRecents(2*recentShards, time.Minute)
	t0 := time.Unix(1000, 0)
	// three topics of one shard: the one not read lately goes
	var same []topicKey
	first := c.shard(topicKey{"t", "x0"})
	for i := 0; len(same) < 3; i++ {
		k := topicKey{"t", "x" + string(rune('0'+i%10)) + string(rune('a'+i/10))}
		if c.shard(k) == first {
			same = append(same, k)
		}
	}
	r := &recent{lo: 1, hi: 1, read: t0, msgs: make([]message.Message, 1)}
	c.put(same[0], r, t0)
	c.put(same[1], r, t0)
	c.get(same[0], t0)
	c.put(same[2], r, t0)
	if c.get(same[0], t0) == nil || c.get(same[2], t0) == nil || c.get(same[1], t0) != nil {
		t.Fatal("not the least recently read copy was evicted")
	}
}

// TestRecentsConcurrent: readers and writers of many topics at once (run
// with -race): every copy read is one that was put for its topic.
func TestRecentsConcurrent(t *testing.T) {
	c := newRecents(64, time.Minute)
	now := time.Unix(1000, 0)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 2000 {
				n := rng.IntN(200)
				k, hi := topicKey{"ten", "t" + strconv.Itoa(n)}, int64(n+1) // each topic's copies end at its own hi
				switch rng.IntN(10) {
				case 0:
					c.drop(k)
				case 1, 2:
					c.put(k, &recent{lo: 1, hi: hi, read: now, msgs: make([]message.Message, hi)}, now)
				default:
					if r := c.get(k, now); r != nil && r.hi != hi {
						t.Errorf("%s: a copy of another topic", k.topic)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := c.topics(); n < 0 || n > 64+recentShards {
		t.Fatalf("%d copies counted", n)
	}
}
