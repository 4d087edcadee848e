package ratelimit

import (
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/imshard/imshard/config"
)

// Local is a set of per-(tenant, user) GCRA buckets kept in the process,
// bounded by an LRU. It serves the limits where exactness across processes
// does not matter: reads and changes protect the process that serves them
// (its MySQL pool, its CPU), and a client spreading its requests over N
// processes gets at most N times its limit, each process still protected.
// Sends, whose limits are a tenant's quota, are decided in Redis instead.
type Local struct {
	mu   sync.Mutex
	tats *simplelru.LRU[localKey, time.Time]
}

type localKey struct {
	tenant string
	user   int64
}

// NewLocal keeps the buckets of at most size users.
func NewLocal(size int) *Local {
	tats, _ := simplelru.NewLRU[localKey, time.Time](size, nil) // size > 0: no error
	return &Local{tats: tats}
}

// Take decides one request of the user at now under r, and keeps the
// bucket's new state when it passes.
func (b *Local) Take(tenant string, user int64, r config.Rate, now time.Time) Decision {
	k := localKey{tenant, user}
	b.mu.Lock()
	defer b.mu.Unlock()
	tat, _ := b.tats.Get(k)
	next, d := Decide(r, tat, now)
	if d.OK {
		b.tats.Add(k, next)
	}
	return d
}
