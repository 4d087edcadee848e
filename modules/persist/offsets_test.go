package persist

import "testing"

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
