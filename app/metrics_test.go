package app

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/testenv"
)

// TestReloadExportsAddedTenantsAtZero: a tenant a reload adds gets its
// tenant-labelled series at 0 at once, like the tenants of the start, so
// an alert sees its first shard or DDL failure as an increase.
func TestReloadExportsAddedTenantsAtZero(t *testing.T) {
	tenant, added := testenv.NewTenant(t), testenv.NewTenant(t)
	cfg := localConfig(tenant)
	cfg.Shard.PatrolInterval = time.Hour
	a := New(cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err := a.Start(context.Background(), []string{ShardMgr}); err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	series := func() map[string]float64 {
		t.Helper()
		families, err := a.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "tenant" {
						v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
						out[f.GetName()+"/"+l.GetValue()] = v
					}
				}
			}
		}
		return out
	}
	names := []string{"group_message_shard_missing_total", "imshard_shardmgr_ddl_failures_total",
		"imshard_shardmgr_last_success_timestamp_seconds"}
	got := series()
	for _, n := range names {
		if _, ok := got[n+"/"+tenant]; !ok {
			t.Errorf("%s{tenant=%q} is not exported at start", n, tenant)
		}
	}
	next := *cfg
	next.Tenants = append([]config.Tenant{{ID: added, JWTSecret: "secret-" + added}}, cfg.Tenants...)
	a.Reload(&next)
	got = series()
	for _, n := range names {
		if v, ok := got[n+"/"+added]; !ok || v != 0 {
			t.Errorf("after the reload adding %s: %s = %v (exported %v), want 0", added, n, v, ok)
		}
	}
}
