package app

import (
	"context"

	"github.com/imshard/imshard/modules/changes"
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
		KeySpace:   c.keys,
		DBs:        c.pools,
		Catalog:    c.catalog,
		Allocator:  c.alloc,
		Scripts:    c.scripts,
		ACL:        c.acl,
		Migrations: c.migs,
		Limits:     c.limits,
		Auth:       httpapi.NewAuthenticator(a.Keys(), a.Config.Auth.MaxTokenTTL),
		Log:        a.Log.With().Str("module", Send).Logger(),
		Registerer: a.Registry,
	})
	if err != nil {
		return nil, err
	}
	svc.Register(a.APIMux)
	return svc, nil
}

// NewChanges builds the message-change service (also used by `imshard
// bench query` and by the erase jobs) over the read path (module
// readpath), once per process.
func (a *App) NewChanges() *changes.Service {
	c := &a.clients
	if c.changes != nil {
		return c.changes
	}
	c.changes = changes.New(changes.Params{
		Reader:       a.reader,
		Redis:        c.redis,
		Router:       a.NewRouter(),
		Flight:       c.flight,
		ACL:          c.acl,
		Scripts:      c.scripts,
		Migrations:   c.migs,
		RecallWindow: a.Config.Send.RecallWindow,
		MaxEditBody:  a.Config.Send.MaxBodyBytes,
		Log:          a.Log.With().Str("module", Changes).Logger(),
		Registerer:   a.Registry,
	})
	return c.changes
}

// initChanges serves the change routes: recall, edit, delete for everyone
// and for me.
func initChanges(ctx context.Context, a *App) (Service, error) {
	svc := a.NewChanges()
	auth := httpapi.NewAuthenticator(a.Keys(), a.Config.Auth.MaxTokenTTL)
	svc.Register(a.APIMux, auth, a.Log.With().Str("module", Changes).Logger(), a.clients.limits)
	return holder{}, nil
}
