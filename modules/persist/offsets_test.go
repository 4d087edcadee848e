package persist

import (
	"math/rand/v2"
	"testing"
)

func TestPartOffsetsCommitsOnlyTheContiguousPrefix(t *testing.T) {
	type step struct {
		admit    []int64
		complete []int64
		want     int64 // next offset to commit; -1 = nothing new
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing done", []step{{admit: []int64{0, 1, 2}, want: -1}}},
		{"in order", []step{{admit: []int64{0, 1, 2}, complete: []int64{0, 1}, want: 2}, {complete: []int64{2}, want: 3}}},
		{"hole holds back", []step{
			{admit: []int64{5, 6, 7, 8}, complete: []int64{6, 7, 8}, want: -1},
			{complete: []int64{5}, want: 9},
		}},
		{"offset gaps (compaction, markers)", []step{
			{admit: []int64{10, 12, 15}, complete: []int64{10, 15}, want: 11},
			{complete: []int64{12}, want: 16},
		}},
		{"refetch of an admitted offset is refused", []step{
			{admit: []int64{0, 1, 1, 0}, complete: []int64{0, 1}, want: 2},
		}},
		{"no new progress, no commit", []step{
			{admit: []int64{0}, complete: []int64{0}, want: 1},
			{want: -1},
		}},
		{"unknown completion ignored", []step{{admit: []int64{3}, complete: []int64{99}, want: -1}}},
		{"completed twice", []step{
			{admit: []int64{4, 5, 6}, complete: []int64{5, 5}, want: -1},
			{complete: []int64{4, 4, 5}, want: 6},
			{complete: []int64{4, 6}, want: 7},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPartOffsets()
			for i, s := range tc.steps {
				for _, o := range s.admit {
					p.admit(o, 1)
				}
				for _, o := range s.complete {
					p.complete(o)
				}
				next, epoch, ok := p.toCommit()
				got := int64(-1)
				if ok {
					got = next
					if epoch != 1 {
						t.Fatalf("step %d: epoch %d", i, epoch)
					}
					p.markCommitted(next)
				}
				if got != s.want {
					t.Fatalf("step %d: commit %d, want %d", i, got, s.want)
				}
			}
		})
	}
}

func TestPartOffsetsRevokedAdmitsNothing(t *testing.T) {
	p := newPartOffsets()
	if !p.admit(0, 0) {
		t.Fatal("admit refused")
	}
	p.revoke()
	if p.admit(1, 0) || !p.isRevoked() {
		t.Fatal("a revoked assignment admitted a record")
	}
	if p.outstanding() != 1 {
		t.Fatalf("outstanding %d", p.outstanding())
	}
}

func TestRevocationDoesNotWaitForParkedRecords(t *testing.T) {
	p := newPartOffsets()
	for off := int64(0); off < 3; off++ {
		p.admit(off, 0)
	}
	p.setParked(2)
	if p.outstanding() != 3 || p.pending() != 1 {
		t.Fatalf("outstanding %d, pending %d", p.outstanding(), p.pending())
	}
	p.complete(2)
	p.setParked(0)
	if p.pending() != 2 {
		t.Fatalf("pending %d", p.pending())
	}
}

// Records of a partition, with offset gaps, completed in random order: the
// offset to commit is always one past the end of the done prefix, and
// nothing while the first record is not done.
func TestPartOffsetsRandomOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 50; round++ {
		p := newPartOffsets()
		var offs []int64
		for off := int64(rng.IntN(3)); len(offs) < 200; off += 1 + int64(rng.IntN(3)) {
			offs = append(offs, off)
			p.admit(off, 0)
		}
		done := make([]bool, len(offs))
		for _, i := range rng.Perm(len(offs)) {
			p.complete(offs[i])
			done[i] = true
			want := int64(-1)
			for j := 0; j < len(offs) && done[j]; j++ {
				want = offs[j] + 1
			}
			next, _, ok := p.toCommit()
			if !ok {
				next = -1
			}
			if next != want {
				t.Fatalf("round %d: commit %d, want %d", round, next, want)
			}
		}
		if p.outstanding() != 0 {
			t.Fatalf("round %d: %d outstanding", round, p.outstanding())
		}
	}
}
