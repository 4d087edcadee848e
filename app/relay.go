package app

import (
	"context"

	"github.com/imshard/imshard/modules/relay"
)

func initRelay(ctx context.Context, a *App) (Service, error) {
	c := &a.clients
	r := a.Config.Relay
	svc, err := relay.New(relay.Params{
		Config:     relay.Config{BatchSize: r.BatchSize, PollInterval: r.PollInterval, Workers: r.Workers, ProduceTimeout: r.ProduceTimeout},
		Topic:      a.Config.Kafka.ChangesTopic,
		KafkaConn:  c.kafka,
		Tenants:    c.pools.IDs,
		DBs:        c.pools,
		Log:        a.Log.With().Str("module", Relay).Logger(),
		Registerer: a.Registry,
	})
	if err != nil {
		return nil, err
	}
	svc.ExportTenants(c.pools.IDs())
	a.onTenantsAdded(svc.ExportTenants)
	return svc, nil
}
