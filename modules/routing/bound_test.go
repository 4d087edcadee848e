package routing_test

import (
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

// Forward decides how far every forward reader goes: up to the settled
// watermark, never past it, and nothing at all when the watermark is at or
// below the reader's cursor — above all for a bound that is only what the
// mirror proves (0 when it proves nothing), which never reads as
// "unbounded".
func TestBoundForwardStopsAtTheSettledWatermark(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b     routing.Bound
		from  int64
		to    int64
		reads bool
	}{
		{"counted, above the cursor", routing.Bound{Settled: 10, Counted: true}, 4, 10, true},
		{"counted, at the cursor", routing.Bound{Settled: 10, Counted: true}, 10, 10, false},
		{"counted, below the cursor", routing.Bound{Settled: 3, Counted: true}, 10, 3, false},
		{"in flight right above the cursor", routing.Bound{Settled: 4, Counted: true}, 4, 4, false},
		{"no counter, nothing proven", routing.Bound{}, 0, 0, false},
		{"no counter, a since cursor", routing.Bound{}, 7, 0, false},
		{"no counter, the mirror proves a prefix", routing.Bound{Settled: 30}, 20, 30, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to, ok := tc.b.Forward(tc.from)
			if to != tc.to || ok != tc.reads {
				t.Fatalf("Forward(%d) = %d %v, want %d %v", tc.from, to, ok, tc.to, tc.reads)
			}
		})
	}
}
