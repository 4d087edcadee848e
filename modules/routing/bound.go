package routing

// Bound is how far a forward reader may go in a topic — a since page, a
// stream's catch-up and its starting cursor, the settled prefix a mirror
// proves — so that none of them ever passes a seq still in flight or one
// not proven stored (invariant 12, docs/invariants.md). Flight.Bound
// builds it from the seq counter and the pending set, MirrorBound from
// the route mirror alone; every reader decides with Forward.
type Bound struct {
	// Settled is the settled watermark: every seq at or below it is stored
	// or a recorded gap. Always a seq, never "unbounded".
	Settled int64
	// Counted: Redis held the topic's seq counter and Settled is that
	// counter lowered below the oldest seq in flight. False: Redis held no
	// counter (or a topic never written to), and Settled is only what the
	// route mirror proves stored — 0 when it proves nothing, which stops a
	// since read at its cursor (an empty page the client polls again).
	Counted bool
	// Regapped: resolving the bound recorded gaps (seqs past the produce
	// timeout, a lifted resume fence) or re-seeded a lost counter, which
	// reads pipelined with its own did not see: a caller that read the
	// recorded gaps there reads them again.
	Regapped bool
}

// Forward is the highest seq a forward reader whose cursor is at `from`
// (every seq up to it accounted for) may reach: to, inclusive; ok is false
// when the bound stops the reader at its cursor — nothing above it may be
// read yet, and the page is empty with the cursor echoed.
func (b Bound) Forward(from int64) (to int64, ok bool) {
	return b.Settled, b.Settled > from
}

// MirrorBound is the bound the route mirror alone proves: the highest seq
// s such that the mirror ranges (oldest month first) prove every seq from
// 1 to s stored. A month whose range starts right after the previous one
// and counts one row per seq of its range is whole (each row one seq: the
// unique key; counted in the transaction that stored it). It stops at the
// first seq it cannot prove — a gap, a seq still in flight, a month
// dropped, rows kept elsewhere — and is 0 when it proves none.
func MirrorBound(ranges []MonthRange) Bound { return MirrorBoundAbove(ranges, 0) }

// MirrorBoundAbove is MirrorBound for a topic whose history begins at its
// retention floor (LoadFloor): every seq below the floor is accounted for
// (removed past retention), so the proof starts there.
func MirrorBoundAbove(ranges []MonthRange, floor int64) Bound {
	through := max(floor-1, 0)
	for _, r := range ranges {
		if r.MaxSeq <= through {
			continue
		}
		if r.MinSeq != through+1 {
			break
		}
		if r.Count != r.MaxSeq-r.MinSeq+1 {
			return Bound{Settled: r.MinSeq}
		}
		through = r.MaxSeq
	}
	return Bound{Settled: through}
}
