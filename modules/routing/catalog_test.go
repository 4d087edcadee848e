package routing_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// countingDBs hands out one database and counts how often it was asked.
type countingDBs struct {
	db *sql.DB
	n  atomic.Int64
}

func (c *countingDBs) DB(context.Context, string) (*sql.DB, error) {
	c.n.Add(1)
	return c.db, nil
}

// TestCatalogMissesShareOneRead: lookups of a month the catalog does not
// register, many at once and many in a row, read MySQL once, not once each.
func TestCatalogMissesShareOneRead(t *testing.T) {
	ctx := context.Background()
	tenant, db := testenv.MigratedTenantDB(t)
	known, unknown := routing.MustMonth("202601"), routing.MustMonth("202602")
	table, _ := routing.TableFor(known)
	if err := routing.RegisterShard(ctx, db, table); err != nil {
		t.Fatal(err)
	}
	dbs := &countingDBs{db: db}
	c := routing.NewCatalog(dbs, time.Hour)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, _, err := c.Table(ctx, tenant, unknown); !errors.Is(err, routing.ErrShardNotRegistered) {
					t.Errorf("unregistered month: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, st, err := c.Table(ctx, tenant, known); err != nil || st != routing.StatusPrepared {
		t.Fatalf("registered month: %s, %v", st, err)
	}
	if n := dbs.n.Load(); n != 1 {
		t.Fatalf("401 lookups read the catalog %d times, want once", n)
	}
	c.Invalidate(tenant)
	if _, _, err := c.Table(ctx, tenant, unknown); !errors.Is(err, routing.ErrShardNotRegistered) {
		t.Fatal(err)
	}
	if n := dbs.n.Load(); n != 2 {
		t.Fatalf("after Invalidate the catalog was read %d times in all, want 2", n)
	}
}
