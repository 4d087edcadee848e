package readpath

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imshard/imshard/modules/message"
)

// recentKeep is the most seqs a process's copy of a topic's newest stretch
// holds (a page of 100 with its lookahead and slack fits); the oldest go
// first as the stretch grows.
const recentKeep = 128

// recent is this process's copy of the newest stretch of a topic's hot
// cache: the messages (decoded once) and recorded gaps of a seq range
// [lo, hi] that a cache read proved complete, every seq in it a message or
// a gap. It is immutable once built and shared by the readers of the
// topic, who read from Redis only what lies above hi (the delta): a cached
// message changes only through the change path (recall, edit, delete for
// everyone), which moves the topic's message version forward before it
// commits, and every page compares the version it reads with the copy's
// (ver) — a copy of another version is dropped. A gap only ever gains a
// late message, so what the copy knows stays true. That late message — a
// dead-lettered or compensated event an operator replays into a seq that
// was a gap (a seq that timed out is abandoned and never stored) — is what
// a copy can miss, for at most the hot_cache.local_max_age it lives before
// a full read replaces it.
type recent struct {
	lo   int64
	hi   int64
	read time.Time         // of the full read it began with; extensions keep it
	ver  int64             // the topic's message version its reads were made under
	msgs []message.Message // one per seq from lo to hi, normalized; a recorded gap has Seq 0
}

// newRecent decodes the stretch of c that a page walking down from top
// passes while every seq is proven (cached or a recorded gap), at most
// recentKeep seqs; nil when top itself is not proven, or when c was read
// without a message version (unversioned): a copy is only ever compared
// with a version Redis held, since a missing one says nothing of the
// changes made before it went missing.
func newRecent(c Cached, top int64, read time.Time) *recent {
	if c.Version == unversioned {
		return nil
	}
	msgs := proven(c, top, -1)
	if len(msgs) == 0 {
		return nil
	}
	slices.Reverse(msgs) // read newest first
	return &recent{lo: top - int64(len(msgs)) + 1, hi: top, read: read, ver: c.Version, msgs: msgs}
}

// proven decodes the seqs of c from `from` on, stepping by step, while each
// is proven within c's bounds, at most recentKeep of them, in that order:
// a message, or a zero Message (Seq 0) for a recorded gap.
func proven(c Cached, from, step int64) []message.Message {
	var msgs []message.Message
	for s := from; len(msgs) < recentKeep && s >= c.Lo && s <= c.Hi; s += step {
		if m, ok := c.msg(s); ok {
			msgs = append(msgs, m.Normalized())
		} else if c.Gaps[s] {
			msgs = append(msgs, message.Message{})
		} else {
			break
		}
	}
	return msgs
}

// extend is the copy grown by what c proves right above hi, keeping the
// newest recentKeep seqs; r itself when c proves nothing there or was read
// under another message version.
func (r *recent) extend(c Cached) *recent {
	if c.Version != r.ver {
		return r
	}
	above := proven(c, r.hi+1, 1)
	if len(above) == 0 {
		return r
	}
	hi := r.hi + int64(len(above))
	// at most recentKeep new seqs: the kept part of the old stretch starts
	// within it or right at its end
	lo := max(r.lo, hi-recentKeep+1)
	kept := r.msgs[lo-r.lo:]
	msgs := append(append(make([]message.Message, 0, len(kept)+len(above)), kept...), above...)
	return &recent{lo: lo, hi: hi, read: r.read, ver: r.ver, msgs: msgs}
}

// at is the copy's message of seq, nil for a recorded gap; seq must lie
// within [lo, hi].
func (r *recent) at(seq int64) *message.Message {
	if m := &r.msgs[seq-r.lo]; m.Seq != 0 {
		return m
	}
	return nil
}

// gapsIn lists the recorded gaps of the copy within [lo, hi] (clipped to
// the copy), ascending.
func (r *recent) gapsIn(lo, hi int64) []int64 {
	var out []int64
	for s := max(lo, r.lo); s <= min(hi, r.hi); s++ {
		if r.at(s) == nil {
			out = append(out, s)
		}
	}
	return out
}

// usable reports whether a page read from bound in order o, n seqs deep,
// is likely answered by the copy and a delta above it: a newest-first page
// needs n seqs of the copy below its cursor (or the copy to reach seq 1),
// an oldest-first page has to start inside the copy or right above it.
func (r *recent) usable(o Order, bound int64, n int) bool {
	if o == Asc {
		return bound+1 >= r.lo && bound <= r.hi
	}
	return r.lo <= 1 || min(bound-1, r.hi)-r.lo+1 >= int64(n)
}

// topicKey names a topic across tenants.
type topicKey struct{ tenant, topic string }

const recentShards = 16

// recentSample is how many copies a full shard compares to evict one.
const recentSample = 8

// recents holds the copies of this process, at most topics of them, the
// least recently read of a sample going first; a copy older than maxAge is
// not used. Lookups take a shard's read lock only.
type recents struct {
	maxAge time.Duration
	per    int // copies per shard
	seed   maphash.Seed
	clock  atomic.Int64 // ticks of use, for eviction
	count  atomic.Int64
	shards [recentShards]recentShard
}

type recentShard struct {
	mu sync.RWMutex
	m  map[topicKey]*recentSlot
}

type recentSlot struct {
	r    *recent // guarded by the shard's lock
	used atomic.Int64
}

// newRecents is the copies' cache; nil (keeping nothing) when topics or
// maxAge is 0.
func newRecents(topics int, maxAge time.Duration) *recents {
	if topics <= 0 || maxAge <= 0 {
		return nil
	}
	c := &recents{maxAge: maxAge, per: (topics + recentShards - 1) / recentShards, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[topicKey]*recentSlot)
	}
	return c
}

func (c *recents) shard(k topicKey) *recentShard {
	return &c.shards[maphash.String(c.seed, k.topic)%recentShards]
}

// get is the topic's copy, if one is held and young enough.
func (c *recents) get(k topicKey, now time.Time) *recent {
	if c == nil {
		return nil
	}
	sh := c.shard(k)
	sh.mu.RLock()
	slot := sh.m[k]
	var r *recent
	if slot != nil {
		r = slot.r
	}
	sh.mu.RUnlock()
	if r == nil || now.Sub(r.read) > c.maxAge {
		return nil
	}
	slot.used.Store(c.clock.Add(1))
	return r
}

// put keeps r as the topic's copy unless the one held is of a newer
// message version, or of the same one, reaches further and is still young;
// a full shard loses its least recently read copy.
func (c *recents) put(k topicKey, r *recent, now time.Time) {
	if c == nil {
		return
	}
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot := sh.m[k]; slot != nil {
		if old := slot.r; old.ver < r.ver || old.ver == r.ver && (old.hi <= r.hi || now.Sub(old.read) > c.maxAge) {
			slot.r = r
		}
		return
	}
	if len(sh.m) >= c.per {
		// the least recently read of a few (map order is random): the
		// eviction costs the same at any local_topics
		var victim topicKey
		oldest, seen := int64(-1), 0
		for k, s := range sh.m {
			if u := s.used.Load(); oldest < 0 || u < oldest {
				victim, oldest = k, u
			}
			if seen++; seen == recentSample {
				break
			}
		}
		delete(sh.m, victim)
		c.count.Add(-1)
	}
	slot := &recentSlot{r: r}
	slot.used.Store(c.clock.Add(1))
	sh.m[k] = slot
	c.count.Add(1)
}

// drop forgets the topic's copy.
func (c *recents) drop(k topicKey) {
	if c == nil {
		return
	}
	sh := c.shard(k)
	sh.mu.Lock()
	if _, ok := sh.m[k]; ok {
		delete(sh.m, k)
		c.count.Add(-1)
	}
	sh.mu.Unlock()
}

// topics is how many copies are held.
func (c *recents) topics() int64 {
	if c == nil {
		return 0
	}
	return c.count.Load()
}
