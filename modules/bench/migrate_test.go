package bench

import (
	"testing"
	"time"
)

// TestBatchLogAchieved: the achieved rate is the pace between batch
// starts — five batches of 2,000 rows started 1 s apart made 2,000 rows/s,
// not 10,000 rows over the 4.2 s from the first start to the last end.
func TestBatchLogAchieved(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    BatchLog
		want float64
	}{
		{"paced", BatchLog{Batches: 5, Rows: 10_000, Wall: 4200 * time.Millisecond, Paced: 4 * time.Second, PacedRows: 8_000}, 2_000},
		{"one batch", BatchLog{Batches: 1, Rows: 2_000, Wall: 500 * time.Millisecond}, 4_000},
		{"none", BatchLog{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.Achieved(); got != tc.want {
				t.Fatalf("achieved %v rows/s, want %v", got, tc.want)
			}
		})
	}
}
