package archive

import (
	"math"
	"testing"
)

// TestCutIDs: scanTable's ranges hold every id once, in order, the first
// from MinInt64 and the last to MaxInt64, whatever the table's ids.
func TestCutIDs(t *testing.T) {
	for _, c := range []struct{ lo, hi int64 }{
		{1, 1}, {1, 2}, {100, 1_000_100}, {-50, 50}, {math.MinInt64 + 1, math.MaxInt64}, {0, math.MaxInt64},
	} {
		for _, n := range []int{1, 2, 3} {
			b := cutIDs(c.lo, c.hi, n)
			if len(b) != n+1 || b[0] != math.MinInt64 || b[n] != math.MaxInt64 {
				t.Fatalf("%d..%d in %d: bounds %v", c.lo, c.hi, n, b)
			}
			for i := 1; i < n; i++ {
				if b[i] < b[i-1] || b[i] < c.lo || b[i] > c.hi {
					t.Fatalf("%d..%d in %d: bounds %v", c.lo, c.hi, n, b)
				}
			}
		}
	}
}
