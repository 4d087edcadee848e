package stream

import (
	"context"
	"sync"
)

// userShare is the part of the process's catch-up slots one user may hold
// at a time: 1/userShare of stream.max_catchups, at least one.
const userShare = 8

// userKey names the user a socket authenticated as.
type userKey struct {
	tenant string
	user   int64
}

// catchupSlots are the process's concurrent catch-up reads
// (stream.max_catchups), of which one user holds at most a share. A
// catch-up holds its slot while it writes what it read, so sockets that
// do not read their frames hold slots until write_timeout ends them:
// without the share, one user opening enough such sockets would hold every
// slot and every other user's catch-up would wait behind them.
type catchupSlots struct {
	all   chan struct{}
	share int

	mu    sync.Mutex
	users map[userKey]*userSlots
}

// userSlots are one user's held slots; refs counts the catch-ups holding
// or waiting for one, so the entry goes when the last leaves.
type userSlots struct {
	held chan struct{}
	refs int
}

func newCatchupSlots(n int) *catchupSlots {
	return &catchupSlots{all: make(chan struct{}, n), share: max(1, n/userShare), users: map[userKey]*userSlots{}}
}

// acquire takes a slot for user k, waiting first for k's share (holding
// nothing of the others' meanwhile), then for a slot of the process; ok is
// false when ctx ended first. waited reports that k's share was full.
func (s *catchupSlots) acquire(ctx context.Context, k userKey) (release func(), waited, ok bool) {
	s.mu.Lock()
	u := s.users[k]
	if u == nil {
		u = &userSlots{held: make(chan struct{}, s.share)}
		s.users[k] = u
	}
	u.refs++
	s.mu.Unlock()
	leave := func() {
		s.mu.Lock()
		if u.refs--; u.refs == 0 {
			delete(s.users, k)
		}
		s.mu.Unlock()
	}
	select {
	case u.held <- struct{}{}:
	default:
		waited = true
		select {
		case u.held <- struct{}{}:
		case <-ctx.Done():
			leave()
			return nil, waited, false
		}
	}
	select {
	case s.all <- struct{}{}:
	case <-ctx.Done():
		<-u.held
		leave()
		return nil, waited, false
	}
	return func() {
		<-s.all
		<-u.held
		leave()
	}, waited, true
}
