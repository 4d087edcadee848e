package send

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// Decompose splits an id into its fields: the inverse of Compose, which
// only the tests need (the service never reads an id's fields back).
func Decompose(id int64) (ms int64, node, seq int) {
	return id >> (NodeBits + SeqBits), int(id>>SeqBits) & MaxNode, int(id & maxSeq)
}

func TestComposeLayout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ms        int64
		node, seq int
		want      int64
	}{
		{"zero", 0, 0, 0, 0},
		{"seq only", 0, 0, 1, 1},
		{"max seq", 0, 0, maxSeq, 4095},
		{"node only", 0, 1, 0, 1 << 12},
		{"max node", 0, MaxNode, 0, 1023 << 12},
		{"ms only", 1, 0, 0, 1 << 22},
		{"all", 5, 7, 9, 5<<22 | 7<<12 | 9},
		{"41-bit ms stays positive", 1<<41 - 1, MaxNode, maxSeq, 1<<63 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := Compose(tc.ms, tc.node, tc.seq)
			if id != tc.want {
				t.Fatalf("Compose = %d, want %d", id, tc.want)
			}
			ms, node, seq := Decompose(id)
			if ms != tc.ms || node != tc.node || seq != tc.seq {
				t.Fatalf("Decompose = %d,%d,%d", ms, node, seq)
			}
		})
	}
}

// fakeClock is a settable clock whose sleep advances it.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	slept time.Duration
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) sleep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	c.slept += d
}
func (c *fakeClock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

func newTestSnowflake(c *fakeClock, node int) *Snowflake {
	s := NewSnowflake(5 * time.Millisecond)
	s.now, s.sleep = c.now, c.sleep
	s.SetNode(node, c.now().Add(time.Hour))
	return s
}

func TestSnowflakeMonotonic(t *testing.T) {
	start := Epoch.Add(1000 * time.Hour)
	c := &fakeClock{t: start}
	s := newTestSnowflake(c, 42)
	var last int64
	// 10,000 ids in one frozen millisecond overflow the 12-bit sequence:
	// the ids run into the next milliseconds and stay increasing
	for i := range 10000 {
		id, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if id <= last {
			t.Fatalf("id %d: %d not above %d", i, id, last)
		}
		if _, node, _ := Decompose(id); node != 42 {
			t.Fatalf("node = %d", node)
		}
		last = id
	}
	if c.slept == 0 {
		t.Fatal("overflowing the sequence should have waited for the clock")
	}
}

func TestSnowflakeClockBackward(t *testing.T) {
	start := Epoch.Add(1000 * time.Hour)
	for _, tc := range []struct {
		name    string
		back    time.Duration
		wantErr error
	}{
		{"small step waits", 3 * time.Millisecond, nil},
		{"bound waits", 5 * time.Millisecond, nil},
		{"past the bound refuses", 6 * time.Millisecond, ErrClockBackward},
		{"far back refuses", time.Hour, ErrClockBackward},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeClock{t: start}
			s := newTestSnowflake(c, 1)
			first, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			c.set(start.Add(-tc.back))
			id, err := s.Next()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && id <= first {
				t.Fatalf("id %d not above %d after waiting", id, first)
			}
			if err != nil {
				// once the clock is back, minting resumes above the last id
				c.set(start.Add(time.Millisecond))
				id, err := s.Next()
				if err != nil || id <= first {
					t.Fatalf("after recovery: id %d err %v", id, err)
				}
			}
		})
	}
}

func TestSnowflakeLease(t *testing.T) {
	c := &fakeClock{t: Epoch.Add(time.Hour)}
	s := NewSnowflake(time.Second)
	s.now, s.sleep = c.now, c.sleep
	if _, err := s.Next(); !errors.Is(err, ErrNoNode) {
		t.Fatalf("without a lease: %v", err)
	}
	s.SetNode(3, c.now().Add(time.Second))
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	if !s.Leased() {
		t.Fatal("lease not trusted within its horizon")
	}
	c.set(c.now().Add(2 * time.Second))
	if s.Leased() {
		t.Fatal("lease trusted past its horizon")
	}
	if _, err := s.Next(); !errors.Is(err, ErrNoNode) {
		t.Fatalf("past the lease horizon: %v", err)
	}
}

func TestSnowflakeConcurrentUnique(t *testing.T) {
	s := NewSnowflake(time.Second)
	s.SetNode(7, time.Now().Add(time.Hour))
	const workers, per = 8, 5000
	ids := make([][]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				id, err := s.Next()
				if err != nil {
					t.Error(err)
					return
				}
				ids[w] = append(ids[w], id)
			}
		}()
	}
	wg.Wait()
	seen := make(map[int64]bool, workers*per)
	for w := range ids {
		for i, id := range ids[w] {
			if seen[id] {
				t.Fatalf("duplicate id %d", id)
			}
			if i > 0 && id <= ids[w][i-1] {
				t.Fatalf("worker %d: ids not increasing", w)
			}
			seen[id] = true
		}
	}
}
