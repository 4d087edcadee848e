package test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// TestMovePlacementFollowedAtRunTime: a placement record overrides the
// configured DSN, and a running process follows it — its pools, and the
// shard manager through them, re-point within the poll interval without a
// restart; epochs only go up; the records are read from the placement
// servers that answer, so losing one (here the second one) or Redis loses
// no placement.
func TestMovePlacementFollowedAtRunTime(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	second, targetDSN := mvStartSecond(t, tenant)
	shared, err := placement.DefaultServers([]string{strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant)})
	if err != nil {
		t.Fatal(err)
	}
	onSecond, err := placement.DefaultServers([]string{targetDSN})
	if err != nil {
		t.Fatal(err)
	}
	env := harness.Start(t, harness.Options{Tenant: tenant, Mutate: func(c *config.Config) {
		c.MySQL.PlacementDSNs = append(shared, onSecond...)
		c.MySQL.PlacementPoll = 200 * time.Millisecond
	}})
	store := mvStore(t, env)
	ctx := context.Background()

	at, err := env.App.Pools().Placement(tenant)
	if err != nil || at.Epoch != 0 || at.DSN != env.Config.TenantDSN(env.Config.Tenants[0]) {
		t.Fatalf("initial placement %+v %v: want the configured DSN at epoch 0", at, err)
	}

	// a record moves the tenant's handles to the second server
	mvPlace(t, store, tenant, targetDSN, 1)
	mvWaitEpoch(t, env, 1)
	db, err := env.App.Pools().DB(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	var port int
	if err := db.QueryRow("SELECT @@port").Scan(&port); err != nil {
		t.Fatal(err)
	}
	if cfg, _ := mysql.ParseDSN(targetDSN); cfg.Addr != "127.0.0.1:"+strconv.Itoa(port) {
		t.Fatalf("the tenant's handle reaches port %d, want the second server %s", port, cfg.Addr)
	}
	if e := mvFence(t, db); e != 0 {
		t.Fatalf("a fresh database's fence is at %d, want 0", e)
	}
	// the shard manager of the same process creates the month tables
	// there, once the database serves epoch 1 (a move's switch raises the
	// target's fence so; every write, DDL included, passes the fence)
	if _, err := db.Exec("UPDATE im_tenant_fence SET epoch = 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	now := env.Now()
	if res := env.App.NewShardManager().SyncTenant(ctx, tenant, shardmgr.Options{MonthsAhead: 1}); res.Err != nil {
		t.Fatalf("shard ensure on the new placement: %v", res.Err)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
		"im_group_messages_"+now.String()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("month table %s on the second server: %d %v", now, n, err)
	}

	// back to the configured server, at a higher epoch; a lower epoch
	// written afterwards changes nothing
	mvPlace(t, store, tenant, env.Config.TenantDSN(env.Config.Tenants[0]), 2)
	mvWaitEpoch(t, env, 2)
	mvPlace(t, store, tenant, targetDSN, 1)
	recs, _, err := store.Load(ctx)
	if err != nil || recs[tenant].Epoch != 2 {
		t.Fatalf("records after a lower write: %+v %v, want epoch 2 kept", recs[tenant], err)
	}

	// Redis and one placement server gone: the placement stays, and a
	// fresh reader still finds it
	if err := testenv.DeleteTenantKeys(ctx, env.Redis, tenant); err != nil {
		t.Fatal(err)
	}
	second.Kill()
	time.Sleep(600 * time.Millisecond)
	if at, _ := env.App.Pools().Placement(tenant); at.Epoch != 2 {
		t.Fatalf("after losing a placement server the process follows epoch %d, want 2", at.Epoch)
	}
	recs, failed, err := store.Load(ctx)
	if err != nil || len(failed) != 1 || recs[tenant].Epoch != 2 {
		t.Fatalf("a fresh read with one server gone: %+v failed %v err %v", recs[tenant], failed, err)
	}
	if persistMetric(t, env, "imshard_placement_polls_total", `result="failed"`) == 0 {
		t.Fatal("the lost placement server is not counted as failed polls")
	}
}
