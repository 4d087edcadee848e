package routing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Lock is a Redis lock with a token and an expiry: one holder at a time, and
// a crashed holder's lock lapses after its TTL. Release and refresh check the
// token, so a holder whose lock expired cannot free someone else's.
type Lock struct {
	rdb     rueidis.Client
	scripts *Scripts
	key     string
	token   string
	ttl     time.Duration
}

// ErrLockBusy is returned when another holder keeps the lock past the wait.
var ErrLockBusy = errors.New("lock held by another process")

// ErrLockLost ends the context of Keep when the lock is no longer ours.
var ErrLockLost = errors.New("lock lost")

// AcquireLock takes key, retrying until wait has passed (wait 0 tries once).
func AcquireLock(ctx context.Context, rdb rueidis.Client, scripts *Scripts, key string, ttl, wait time.Duration) (*Lock, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	l := &Lock{rdb: rdb, scripts: scripts, key: key, token: hex.EncodeToString(b[:]), ttl: ttl}
	deadline := time.Now().Add(wait)
	for {
		err := rdb.Do(ctx, rdb.B().Set().Key(key).Value(l.token).Nx().Px(ttl).Build()).Error()
		if err == nil {
			return l, nil
		}
		if !rueidis.IsRedisNil(err) {
			return nil, fmt.Errorf("lock %s: %w", key, err)
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("%w: %s", ErrLockBusy, key)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Refresh extends the lock; false means it was lost (expired or taken).
func (l *Lock) Refresh(ctx context.Context) (bool, error) {
	n, err := l.scripts.Refresh.Exec(ctx, l.rdb, []string{l.key}, []string{l.token, strconv.FormatInt(l.ttl.Milliseconds(), 10)}).AsInt64()
	return n == 1, err
}

// Release frees the lock if this holder still owns it.
func (l *Lock) Release(ctx context.Context) error {
	return l.scripts.Unlock.Exec(ctx, l.rdb, []string{l.key}, []string{l.token}).Error()
}

// Keep holds the lock while work runs longer than its TTL: it refreshes the
// lock every third of the TTL until stop is called. The context it returns
// ends, with cause ErrLockLost, as soon as the lock is not ours any more (a
// refresh finds another token or none) or no refresh has succeeded for a
// whole TTL (Redis unreachable: someone else may hold it by now); work
// fenced by the lock runs under that context and stops there.
func (l *Lock) Keep(ctx context.Context) (held context.Context, stop func()) {
	held, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(l.ttl / 3)
		defer tick.Stop()
		lastOK := time.Now()
		for {
			select {
			case <-held.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			rctx, cancelRefresh := context.WithTimeout(held, l.ttl/3)
			ok, err := l.Refresh(rctx)
			cancelRefresh()
			switch {
			case err == nil && ok:
				lastOK = start
			case err == nil, time.Since(lastOK) >= l.ttl:
				cancel(fmt.Errorf("%w: %s", ErrLockLost, l.key))
				return
			}
		}
	}()
	return held, func() { cancel(nil); <-done }
}
