package tenantdb

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/test/testenv"
)

func newPools(t *testing.T, ids ...string) *Pools {
	t.Helper()
	var ts []Tenant
	for _, id := range ids {
		ts = append(ts, Tenant{ID: id, DSN: strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", id)})
	}
	ps := New(Params{MaxOpenConns: 4, Log: zerolog.Nop()}, ts)
	t.Cleanup(func() { _ = ps.Close() })
	return ps
}

func TestPoolsOpenLazilyCreateDatabaseAndMigrate(t *testing.T) {
	a, b := testenv.NewTenant(t), testenv.NewTenant(t)
	ps := newPools(t, a, b)
	if err := ps.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	var exists int
	admin := testenv.MySQL(t)
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", "imshard_"+a).Scan(&exists); err != nil || exists != 0 {
		t.Fatalf("database created before first use (%d, %v)", exists, err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := ps.DB(context.Background(), a); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	db, _ := ps.DB(context.Background(), a)
	v, err := schemaVersion(context.Background(), db)
	if err != nil || v < 1 {
		t.Fatalf("schema version %d (%v)", v, err)
	}
	// tables nothing writes are not kept
	for _, dead := range []string{"im_group_message_dedup", "im_group_message_consume_log"} {
		var n int
		if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
			"imshard_"+a, dead).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s exists after migrating (%d, %v)", dead, n, err)
		}
	}
	// applying again (another process starting) changes nothing
	if err := Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.DB(context.Background(), "nobody"); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("unknown tenant: %v", err)
	}
	ps.SetTenants([]Tenant{{ID: b, DSN: strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", b)}})
	if _, err := ps.DB(context.Background(), a); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("removed tenant still served: %v", err)
	}
	if ids := ps.IDs(); len(ids) != 1 || ids[0] != b {
		t.Fatalf("IDs = %v", ids)
	}
}

// TestPoolsFirstCallerGivingUpDoesNotFailOthers: a caller whose context
// ends while the tenant's pool opens gets its own error; a caller waiting
// for the same open gets the pool.
func TestPoolsFirstCallerGivingUpDoesNotFailOthers(t *testing.T) {
	ctx := context.Background()
	tenant := testenv.NewTenant(t)
	ps := newPools(t, tenant)
	// hold the schema lock, so the open waits in Migrate
	lock := testenv.HoldSchemaLock(t, tenant)
	first, cancel := context.WithCancel(ctx)
	firstErr := make(chan error, 1)
	go func() { _, err := ps.DB(first, tenant); firstErr <- err }()
	waitUntil(t, "the open to wait for the schema lock", func() bool { return lock.Waiters() == 1 })
	secondErr := make(chan error, 1)
	go func() { _, err := ps.DB(ctx, tenant); secondErr <- err }()
	waitUntil(t, "the second caller to wait for the open", func() bool { return callersIn("tenantdb.(*Pools).DB(") == 2 })
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v, want its context's error", err)
	}
	lock.Release()
	if err := <-secondErr; err != nil {
		t.Fatalf("second caller got the first caller's failure: %v", err)
	}
}

// callersIn counts the goroutines whose stack holds frame.
func callersIn(frame string) int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), frame)
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// A pool whose every connection is taken (requests queued behind them) is
// not a server down: readiness asks through a probe of its own and answers
// at once, where a ping through the pool would wait for a free connection.
func TestPingDoesNotWaitForASaturatedPool(t *testing.T) {
	a, b := testenv.NewTenant(t), testenv.NewTenant(t)
	ps := newPools(t, a, b)
	var held []*sql.Conn
	for _, id := range []string{a, b} {
		db, err := ps.DB(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 4; i++ { // newPools' MaxOpenConns
			c, err := db.Conn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
	}
	t.Cleanup(func() {
		for _, c := range held {
			_ = c.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := ps.Ping(ctx); err != nil {
		t.Fatalf("readiness failed while only the pools were full: %v", err)
	}
	ps.mu.Lock()
	probes := len(ps.probes)
	ps.mu.Unlock()
	if probes != 1 {
		t.Fatalf("two tenants on one server: %d probes, want 1", probes)
	}
}
