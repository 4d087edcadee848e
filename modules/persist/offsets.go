package persist

import (
	"cmp"
	"slices"
	"sync"
)

// partOffsets tracks one assigned partition's records from poll to done, so
// that the committed offset only ever covers a contiguous completed prefix
// (invariant 8, docs/invariants.md): a record still in a retrying batch holds back every
// later offset of its partition, however many of them are already stored.
// Records finish out of order because one poll is split into batches by
// tenant and month, and batches run concurrently.
//
// One partOffsets lives for one assignment of the partition; a revocation
// detaches it, so late completions of an abandoned batch change nothing
// that is committed.
type partOffsets struct {
	mu        sync.Mutex
	revoked   bool
	last      int64         // highest offset admitted (-1: none)
	queue     []offsetEntry // from the oldest not done, in offset order (admit)
	committed int64         // next offset already committed (-1: none)
	commitAt  offsetEntry   // the completed prefix's end, for the commit
	prefix    bool          // commitAt is set
	parked    int           // admitted records queued behind parked tenants
}

type offsetEntry struct {
	off   int64
	epoch int32
	done  bool
}

func newPartOffsets() *partOffsets {
	return &partOffsets{last: -1, committed: -1}
}

// admit starts tracking a polled record. It refuses a record of a revoked
// assignment and any offset not above the last one admitted (a refetch of
// something already tracked), so each offset is processed once per
// assignment.
func (p *partOffsets) admit(off int64, epoch int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.revoked || off <= p.last {
		return false
	}
	p.last = off
	p.queue = append(p.queue, offsetEntry{off: off, epoch: epoch})
	return true
}

// complete marks a record done (stored, compensated or dead-lettered) and
// advances the completed prefix. The queue is in offset order, so the
// record is found by binary search: a map from offset to position cost
// more (a lookup that misses the cache per record, thousands in flight).
func (p *partOffsets) complete(off int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := slices.BinarySearchFunc(p.queue, off, func(e offsetEntry, off int64) int { return cmp.Compare(e.off, off) })
	if !ok {
		return
	}
	p.queue[i].done = true
	n := 0
	for n < len(p.queue) && p.queue[n].done {
		p.commitAt, p.prefix = p.queue[n], true
		n++
	}
	if n > 0 {
		p.queue = append(p.queue[:0], p.queue[n:]...)
	}
}

// toCommit is the offset to commit next (one past the completed prefix) and
// its leader epoch; ok is false when nothing new completed since the last
// commit.
func (p *partOffsets) toCommit() (next int64, epoch int32, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.prefix {
		return 0, 0, false
	}
	next = p.commitAt.off + 1
	if next <= p.committed {
		return 0, 0, false
	}
	return next, p.commitAt.epoch, true
}

// committed records that next was committed.
func (p *partOffsets) markCommitted(next int64) {
	p.mu.Lock()
	if next > p.committed {
		p.committed = next
	}
	p.mu.Unlock()
}

// revoke detaches the assignment: nothing more is admitted, and whatever is
// still queued is abandoned uncommitted.
func (p *partOffsets) revoke() {
	p.mu.Lock()
	p.revoked = true
	p.mu.Unlock()
}

func (p *partOffsets) isRevoked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.revoked
}

// outstanding is how many admitted records are not done yet.
func (p *partOffsets) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, e := range p.queue {
		if !e.done {
			n++
		}
	}
	return n
}

// setParked records how many of the partition's records wait behind parked
// tenants: a revocation does not wait for them (they may wait for a
// database for hours); the next owner gets them from the committed offset.
func (p *partOffsets) setParked(n int) {
	p.mu.Lock()
	p.parked = n
	p.mu.Unlock()
}

// pending is how many admitted records are not done yet and not parked:
// what a revocation waits for.
func (p *partOffsets) pending() int {
	n := p.outstanding()
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(0, n-p.parked)
}
