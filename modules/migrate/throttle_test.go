package migrate

import (
	"testing"
	"time"
)

// TestPacerReachesItsLimit: batches of 2,000 rows that take 60 ms each plus
// 30 ms of work between them, throttled to 10,000 rows/s, average the limit
// from the end of the first batch on (the first goes without waiting) —
// the overhead between batches is absorbed by the schedule, not added to
// every batch's allotment.
func TestPacerReachesItsLimit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		batch, between time.Duration
		rate           float64
		want           float64 // rows/s over the run
	}{
		{"fast database: held at the limit", 60 * time.Millisecond, 30 * time.Millisecond, 10_000, 10_000},
		{"no overhead", 100 * time.Millisecond, 0, 5_000, 5_000},
		{"database slower than the limit: never waits", 300 * time.Millisecond, 20 * time.Millisecond, 10_000, 2_000 / 0.32},
		{"unthrottled", 60 * time.Millisecond, 30 * time.Millisecond, 0, 2_000 / 0.09},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pacer{rate: tc.rate}
			now := time.Unix(1_700_000_000, 0)
			var start time.Time
			const batches, rows = 200, 2000
			for i := range batches {
				now = now.Add(tc.between) // reading the migration row, the loop
				now = now.Add(tc.batch)
				w := p.wait(now, rows)
				if w < 0 {
					t.Fatalf("negative wait %v", w)
				}
				now = now.Add(w)
				if i == 0 {
					start = now.Add(-w)
				}
			}
			got := float64((batches-1)*rows) / now.Sub(start).Seconds()
			if got > tc.want*1.001 || got < tc.want*0.99 {
				t.Fatalf("rate %.0f rows/s, want %.0f", got, tc.want)
			}
		})
	}
}

// TestPacerNoBurstAfterStall: after a stall the copy is not made up for by
// a burst — at most one batch goes without waiting.
func TestPacerNoBurstAfterStall(t *testing.T) {
	p := pacer{rate: 10_000}
	now := time.Unix(1_700_000_000, 0)
	for range 5 {
		now = now.Add(10 * time.Millisecond)
		now = now.Add(p.wait(now, 2000))
	}
	now = now.Add(time.Minute) // a long lock wait
	free := 0
	for range 10 {
		now = now.Add(10 * time.Millisecond)
		w := p.wait(now, 2000)
		if w == 0 {
			free++
		}
		now = now.Add(w)
	}
	if free > 1 {
		t.Fatalf("%d batches went without waiting after the stall, want at most 1", free)
	}
}

func TestRateWindow(t *testing.T) {
	w := rateWindow{span: 10 * time.Second}
	t0 := time.Unix(1_700_000_000, 0)
	if r := w.rate(t0); r != 0 {
		t.Fatalf("empty window: %v", r)
	}
	// a batch of 1,000 rows every 500 ms (throttle waits between them)
	at := t0
	for range 100 {
		w.add(at, 1000)
		at = at.Add(500 * time.Millisecond)
	}
	if r := w.rate(at); r < 1999 || r > 2001 {
		t.Fatalf("rate %v, want 2000", r)
	}
	if n := len(w.batches); n > 22 {
		t.Fatalf("window keeps %d batches; want only the last 10 s", n)
	}
	// the pace halves: the window follows within its span
	for range 40 {
		w.add(at, 1000)
		at = at.Add(time.Second)
	}
	if r := w.rate(at); r < 999 || r > 1001 {
		t.Fatalf("rate after slowing down %v, want 1000", r)
	}
}
