package stream

import (
	"context"
	"testing"
	"time"
)

// One user holds at most its share of the catch-up slots: its next
// catch-up waits (holding nothing) while another user's goes at once, and
// goes once one of its own ends.
func TestCatchupSlotsShareOfOneUser(t *testing.T) {
	s := newCatchupSlots(16) // a share of 2
	alice, bob := userKey{"t", 1}, userKey{"t", 2}
	var held []func()
	for range 2 {
		release, waited, ok := s.acquire(context.Background(), alice)
		if !ok || waited {
			t.Fatalf("alice's slot within her share: ok %v, waited %v", ok, waited)
		}
		held = append(held, release)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, waited, ok := s.acquire(ctx, alice); ok || !waited {
		t.Fatalf("alice's third catch-up: ok %v, waited %v; want it to wait for her share", ok, waited)
	}
	release, waited, ok := s.acquire(context.Background(), bob)
	if !ok || waited {
		t.Fatalf("bob's catch-up beside alice's full share: ok %v, waited %v", ok, waited)
	}
	release()

	got := make(chan bool, 1)
	go func() {
		release, _, ok := s.acquire(context.Background(), alice)
		if ok {
			release()
		}
		got <- ok
	}()
	select {
	case <-got:
		t.Fatal("alice's third catch-up went before one of hers ended")
	case <-time.After(20 * time.Millisecond):
	}
	held[0]()
	if !<-got {
		t.Fatal("alice's third catch-up did not go once one of hers ended")
	}
	held[1]()
	if len(s.users) != 0 || len(s.all) != 0 {
		t.Fatalf("slots left after every release: %d users, %d slots", len(s.users), len(s.all))
	}
}

// The process's slots bound all users together, and a share is at least one.
func TestCatchupSlotsProcessBound(t *testing.T) {
	s := newCatchupSlots(2)
	if s.share != 1 {
		t.Fatalf("share of 2 slots = %d, want 1", s.share)
	}
	r1, _, _ := s.acquire(context.Background(), userKey{"t", 1})
	r2, _, _ := s.acquire(context.Background(), userKey{"t", 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, waited, ok := s.acquire(ctx, userKey{"t", 3}); ok || waited {
		t.Fatalf("a third user with every slot taken: ok %v, waited for its share %v", ok, waited)
	}
	r1()
	r2()
}
