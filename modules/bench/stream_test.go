package bench

import (
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestFrameAges: a message frame's age is read from its due time (the
// text) and from the server's created_at; other frames and frames without
// either value are not timed.
func TestFrameAges(t *testing.T) {
	due := time.Date(2026, 12, 1, 22, 0, 0, 123_456_789, time.UTC)
	at := due.Add(30 * time.Millisecond)
	ns := strconv.FormatInt(due.UnixNano(), 10)
	msg := func(text, created string) []byte {
		return []byte(`{"type":"message","message":{"topic":"t","seq":3,"content":{"text":"` + text +
			`"},"created_at":"` + created + `"}}`)
	}
	for _, c := range []struct {
		name          string
		frame         []byte
		sinceDue, arr time.Duration
		ok            bool
	}{
		// the server took it in at 22:00:00.125: 28.456789 ms before at
		{"message", msg(ns, "2026-12-01T22:00:00.125Z"), 30 * time.Millisecond, 28_456_789 * time.Nanosecond, true},
		{"no created_at", []byte(`{"type":"message","message":{"content":{"text":"` + ns + `"}}}`), 0, 0, false},
		{"bad created_at", msg(ns, "yesterday"), 0, 0, false},
		{"text not a time", msg("hello", "2026-12-01T22:00:00.125Z"), 0, 0, false},
		{"a change frame", []byte(`{"type":"change","topic":"t","seq":3}`), 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, d, a, ok := frameAges(c.frame, at)
			wantDue := int64(0)
			if c.ok {
				wantDue = due.UnixNano()
			}
			if ok != c.ok || n != wantDue || d != c.sinceDue || a != c.arr {
				t.Fatalf("frameAges = %v, %v, %v, %v; want %v, %v, %v, %v", n, d, a, ok, wantDue, c.sinceDue, c.arr, c.ok)
			}
		})
	}
}

// TestStreamMedianRatios: the figure held against the bar is the median
// over the rounds of each round's p99 ratio, from arrival and from the due
// time; a round without a raw p99 does not count.
func TestStreamMedianRatios(t *testing.T) {
	round := func(arrival, due, raw time.Duration) StreamRound {
		return StreamRound{Arrival: StreamLatency{P99: arrival}, Delivery: StreamLatency{P99: due}, PubSub: StreamLatency{P99: raw}}
	}
	rep := StreamReport{Rounds: []StreamRound{
		round(30*time.Millisecond, 40*time.Millisecond, 10*time.Millisecond), // 3, 4
		round(10*time.Millisecond, 12*time.Millisecond, 10*time.Millisecond), // 1, 1.2
		round(50*time.Millisecond, 60*time.Millisecond, 0),                   // no raw p99
		round(20*time.Millisecond, 25*time.Millisecond, 10*time.Millisecond), // 2, 2.5
	}}
	if a, d := rep.MedianRatios(); a != 2 || d != 2.5 {
		t.Fatalf("median ratios %v, %v; want 2, 2.5", a, d)
	}
	if a, d := (StreamReport{}).MedianRatios(); a != 0 || d != 0 {
		t.Fatalf("no rounds: %v, %v", a, d)
	}
}

// TestFanOut: each frame of a publication the plain subscriber read counts
// from that read, a frame read before it as 0; frames of publications it
// did not read (topics outside its sample) do not count.
func TestFanOut(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 17, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	l := fanOut(map[int64]time.Time{1: ms(10), 2: ms(20)}, map[int64][]time.Time{
		1: {ms(11), ms(13), ms(9)},
		2: {ms(24)},
		3: {ms(50)},
	})
	slices.Sort(l.d)
	want := []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 4 * time.Millisecond}
	if !slices.Equal(l.d, want) {
		t.Fatalf("fan-out %v; want %v", l.d, want)
	}
}
