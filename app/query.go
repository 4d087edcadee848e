package app

import (
	"context"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/query"
	"github.com/imshard/imshard/modules/routing"
)

// NewRouter builds the read path's shard router from the shared clients.
func (a *App) NewRouter() *routing.Router {
	c := &a.clients
	return routing.NewRouter(routing.RouterParams{
		Redis:   c.redis,
		DBs:     c.pools,
		Catalog: c.catalog,
		Routes:  c.routes,
		Metrics: c.rmetrics,
		Log:     a.Log.With().Str("module", Query).Logger(),
	})
}

// NewQuery builds the read service (also used by `imshard bench query`).
func (a *App) NewQuery() *query.Service {
	c := &a.clients
	return query.New(query.Params{
		Redis:        c.redis,
		DBs:          c.pools,
		Router:       a.NewRouter(),
		Catalog:      c.catalog,
		Routes:       c.routes,
		Flight:       c.flight,
		ACL:          c.acl,
		Scripts:      c.scripts,
		HiddenTTL:    a.Config.Send.ACLCacheTTL, // user facts cached as long as memberships
		LocalTopics:  a.Config.HotCache.LocalTopics,
		LocalMaxAge:  a.Config.HotCache.LocalMaxAge,
		RecallWindow: a.Config.Send.RecallWindow,
		MaxEditBody:  a.Config.Send.MaxBodyBytes,
		Log:          a.Log.With().Str("module", Query).Logger(),
		Registerer:   a.Registry,
	})
}

// NewRouteCheck builds the route checker of `imshard route check|rebuild`.
func (a *App) NewRouteCheck() *query.RouteCheck {
	c := &a.clients
	return &query.RouteCheck{Redis: c.redis, Routes: c.routes, Catalog: c.catalog, DBs: c.pools}
}

func initQuery(ctx context.Context, a *App) (Service, error) {
	svc := a.NewQuery()
	svc.Register(a.APIMux, httpapi.NewAuthenticator(a.Secrets(), a.Config.Auth.MaxTokenTTL), a.Log.With().Str("module", Query).Logger())
	return runner{
		run:  func(ctx context.Context) error { <-ctx.Done(); return nil },
		stop: func(context.Context) error { svc.Close(); return nil },
	}, nil
}
