package app

import (
	"context"

	"github.com/imshard/imshard/modules/migrate"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
)

// NewMigrator builds the migrations' runner from the shared clients; the
// `migrate` commands use it to record intent, the migrate module runs it.
func (a *App) NewMigrator() *migrate.Migrator {
	c := &a.clients
	if c.migrator != nil {
		return c.migrator
	}
	mgr := a.NewShardManager()
	check := a.NewRouteCheck()
	c.migrator = migrate.New(migrate.Params{
		Config:    migrate.Config{BatchSize: a.Config.Migrate.BatchSize, RowsPerSecond: a.Config.Migrate.RowsPerSecond},
		LockTTL:   a.Config.Shard.LockTTL,
		Tenants:   c.pools.IDs,
		DBs:       c.pools,
		Redis:     c.redis,
		KeySpace:  c.keys,
		Scripts:   c.scripts,
		Catalog:   c.catalog,
		Allocator: c.alloc,
		EnsureMonths: func(ctx context.Context, tenant string, from routing.Month) ([]routing.Month, error) {
			res := mgr.SyncTenant(ctx, tenant, shardmgr.Options{MonthsAhead: -1, From: from})
			return res.Created, res.Err
		},
		FixRoute: check.Fix,
		RebuildRoutes: func(ctx context.Context, tenant string, topics []string) error {
			return check.Rebuild(ctx, tenant, topics, func(int, int) {})
		},
		Log:        a.Log.With().Str("module", Migrate).Logger(),
		Registerer: a.Registry,
	})
	return c.migrator
}

// initMigrate runs the migrations of every tenant: the backfill, the route
// rebuild and the verification, resuming where the last process stopped.
func initMigrate(ctx context.Context, a *App) (Service, error) {
	mg := a.NewMigrator()
	mg.ExportTenants(a.clients.pools.IDs())
	return runner{run: mg.Run}, nil
}
