package app

import (
	"context"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/send"
)

func initSend(ctx context.Context, a *App) (Service, error) {
	c := &a.clients
	svc, err := send.New(ctx, send.Params{
		Send:       a.Config.Send,
		HotCache:   a.Config.HotCache,
		KafkaConn:  c.kafka,
		KafkaTopic: a.Config.Kafka.Topic,
		Redis:      c.redis,
		DBs:        c.pools,
		Catalog:    c.catalog,
		Allocator:  c.alloc,
		Scripts:    c.scripts,
		ACL:        c.acl,
		Migrations: c.migs,
		Auth:       httpapi.NewAuthenticator(a.Secrets(), a.Config.Auth.MaxTokenTTL),
		Log:        a.Log.With().Str("module", Send).Logger(),
		Registerer: a.Registry,
	})
	if err != nil {
		return nil, err
	}
	svc.Register(a.APIMux)
	return svc, nil
}
