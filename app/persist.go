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
		KafkaConn:  c.kafka,
		DBs:        c.pools,
		Tenants:    c.pools.IDs,
		Redis:      c.redis,
		KeySpace:   c.keys,
		Scripts:    c.scripts,
		Catalog:    c.catalog,
		Flight:     c.flight,
		Routes:     c.routes,
		Metrics:    c.rmetrics,
		Log:        a.Log.With().Str("module", Persist).Logger(),
		Registerer: a.Registry,
	})
}

// DLQTool starts what `imshard dlq` needs — the tool modules and Kafka —
// and returns the dead-letter/compensation tool. Close stops them. With
// kafka.brokers empty this opens the in-process log in kafka.data_dir.
func (a *App) DLQTool(ctx context.Context) (*persist.Tool, error) {
	if err := a.StartTools(ctx); err != nil {
		return nil, err
	}
	if err := a.startModule(ctx, Kafka); err != nil {
		return nil, err
	}
	c := &a.clients
	return persist.NewTool(persist.ToolParams{Kafka: a.Config.Kafka, KafkaConn: c.kafka, DBs: c.pools,
		Tenants: c.pools.IDs, Catalog: c.catalog}), nil
}
