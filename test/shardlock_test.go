package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// TestShardLockKeptWhileSyncRuns: a sync that outlasts the shard lock's TTL
// keeps the lock (a second manager cannot take it), and stops with
// ErrLockLost once the lock is taken from it.
func TestShardLockKeptWhileSyncRuns(t *testing.T) {
	ctx := context.Background()
	tenant := testenv.NewTenant(t)
	const ttl = 2 * time.Second
	cfg := harness.Config(t, tenant, harness.Options{Mutate: func(c *config.Config) { c.Shard.LockTTL = ttl }})
	a := app.New(cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel))
	if err := a.StartTools(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// the sync's first use of the tenant database waits for the schema
	// lock this test holds: work that takes as long as the test wants
	lock := testenv.HoldSchemaLock(t, tenant)
	results := make(chan shardmgr.Result, 1)
	go func() { results <- a.NewShardManager().SyncTenant(ctx, tenant, shardmgr.Options{MonthsAhead: -1}) }()
	waitFor(t, 20*time.Second, func() bool { return lock.Waiters() == 1 })
	keys, err := a.KeySpace().Tenant(tenant)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * ttl / 2) // the sync runs on, past the TTL
	if _, err := routing.AcquireLock(ctx, a.Redis(), a.Scripts(), keys.ShardLock(), ttl, 0); !errors.Is(err, routing.ErrLockBusy) {
		t.Fatalf("a second manager took the lock of a sync still running (%v)", err)
	}
	// someone else holds it now (as after a long Redis outage): the sync stops
	rdb := a.Redis()
	if err := rdb.Do(ctx, rdb.B().Set().Key(keys.ShardLock()).Value("another-token").Px(time.Minute).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	res := <-results
	if !errors.Is(res.Err, routing.ErrLockLost) {
		t.Fatalf("sync after losing its lock: %v, want ErrLockLost", res.Err)
	}
	if v, err := rdb.Do(ctx, rdb.B().Get().Key(keys.ShardLock()).Build()).ToString(); err != nil || v != "another-token" {
		t.Fatalf("the other holder's lock: %q, %v", v, err)
	}
}
