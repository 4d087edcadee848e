package app

import (
	"context"

	"github.com/imshard/imshard/modules/persist"
)

func initPersist(ctx context.Context, a *App) (Service, error) {
	c := &a.clients
	return persist.New(persist.Params{
		Config:     a.Config.Persist,
		Kafka:      a.Config.Kafka,
		Brokers:    c.brokers,
		DBs:        c.pools,
		Tenants:    c.pools.IDs,
		Redis:      c.redis,
		Scripts:    c.scripts,
		Catalog:    c.catalog,
		Flight:     c.flight,
		Routes:     c.routes,
		Metrics:    c.rmetrics,
		Log:        a.Log.With().Str("module", Persist).Logger(),
		Registerer: a.Registry,
	})
}
