package routing

import (
	"slices"
	"testing"
	"time"
)

// A fence member parses only in its own shape, lifts only once persist's
// time reaches the re-seed plus the produce timeout, and its unstored seqs
// are those no mirror range covers plus, inside a month that is not whole,
// those its rows must tell.
func TestResumeFenceLiftsOnlyOncePersistPassedItsTimeout(t *testing.T) {
	fc, ok := parseFence("3:f:10:1000")
	if !ok || fc.from != 3 || fc.to != 10 || fc.at != 1000 {
		t.Fatalf("parse: %+v %v", fc, ok)
	}
	for _, m := range []string{"3:1000", "3:a", "x:f:10:1000", "3:f:10", "3:f:10:x"} {
		if _, ok := parseFence(m); ok {
			t.Errorf("%q read as a fence", m)
		}
	}
	for _, tc := range []struct {
		persisted int64
		want      bool
	}{{0, false}, {1000, false}, {60999, false}, {61000, true}, {99999, true}} {
		if got := fc.liftable(tc.persisted, time.Minute); got != tc.want {
			t.Errorf("persisted before %d: liftable %v, want %v", tc.persisted, got, tc.want)
		}
	}
	m1, m2, m3 := MustMonth("202601"), MustMonth("202602"), MustMonth("202603")
	holes, partial := fenceHoles(3, 12, []MonthRange{
		{Month: m3, MinSeq: 9, MaxSeq: 10, Count: 2}, // out of order on purpose
		{Month: m1, MinSeq: 1, MaxSeq: 3, Count: 3},
		{Month: m2, MinSeq: 5, MaxSeq: 7, Count: 2}, // one of 5..7 not stored
	})
	if want := []int64{4, 8, 11, 12}; !slices.Equal(holes, want) {
		t.Errorf("holes %v, want %v", holes, want)
	}
	if len(partial) != 1 || partial[0].Month != m2 {
		t.Errorf("months to read %v, want only %s", partial, m2)
	}
	if holes, partial := fenceHoles(5, 4, nil); len(holes) != 0 || len(partial) != 0 {
		t.Errorf("an empty fence: %v %v", holes, partial)
	}
}
