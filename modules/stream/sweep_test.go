package stream

import (
	"testing"
	"time"
)

// A ping interval is cut into slots of at least beatTickMin, at most
// beatSlots of them.
func TestBeatCount(t *testing.T) {
	for _, c := range []struct {
		interval time.Duration
		want     int
	}{
		{time.Millisecond, 1},
		{beatTickMin, 1},
		{100 * time.Millisecond, 10},
		{20 * time.Second, beatSlots},
		{time.Hour, beatSlots},
	} {
		if got := beatCount(c.interval); got != c.want {
			t.Errorf("beatCount(%v) = %d, want %d", c.interval, got, c.want)
		}
	}
}

// The sweep's tick asks a small share of the sockets for a heartbeat (a
// slot's, not an eighth of them as before), and one turn of the slots
// asks every socket once.
func TestSweepPingsASlotPerTick(t *testing.T) {
	s := &Server{conns: map[*conn]struct{}{}}
	s.beats = make([]map[*conn]struct{}, beatCount(20*time.Second))
	for i := range s.beats {
		s.beats[i] = map[*conn]struct{}{}
	}
	const sockets = 5000
	for range sockets {
		// closed: the sweep's wake starts no pump
		s.trackLocked(&conn{closed: true, done: make(chan struct{})})
	}
	due := func() (n int) {
		for c := range s.conns {
			if c.pingDue.Swap(false) {
				n++
			}
		}
		return n
	}
	// 5000/256 ≈ 20 a slot on average; an eighth would be 625
	s.pingLocked(0, 1)
	if n := due(); n > sockets/32 {
		t.Errorf("one tick asked %d of %d sockets for a heartbeat, want a slot's (about %d)", n, sockets, sockets/len(s.beats))
	}
	s.pingLocked(0, int64(len(s.beats)))
	if n := due(); n != sockets {
		t.Errorf("a turn of the slots asked %d of %d sockets, want each once", n, sockets)
	}
	// a turn counted on (the sweep's second interval) asks them all again
	s.pingLocked(int64(len(s.beats)), int64(2*len(s.beats)))
	if n := due(); n != sockets {
		t.Errorf("the second turn asked %d of %d sockets", n, sockets)
	}
	for c := range s.conns {
		s.untrackLocked(c)
	}
	for i, b := range s.beats {
		if len(b) != 0 {
			t.Errorf("slot %d keeps %d sockets after they closed", i, len(b))
		}
	}
}
