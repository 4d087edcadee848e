package tenantdb

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

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
	v, err := Version(context.Background(), db)
	if err != nil || v < 1 {
		t.Fatalf("schema version %d (%v)", v, err)
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
