package app

import (
	"context"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/query"
	"github.com/imshard/imshard/modules/query/stream"
	"github.com/imshard/imshard/modules/routing"
)

// NewRouter builds the read path's shard router from the shared clients.
func (a *App) NewRouter() *routing.Router {
	c := &a.clients
	return routing.NewRouter(routing.RouterParams{
		Redis:      c.redis,
		DBs:        c.pools,
		Catalog:    c.catalog,
		Routes:     c.routes,
		Metrics:    c.rmetrics,
		Migrations: c.migs,
		Log:        a.Log.With().Str("module", Query).Logger(),
	})
}

// NewQuery builds the read service (also used by `imshard bench query`).
func (a *App) NewQuery() *query.Service {
	c := &a.clients
	return query.New(query.Params{
		Redis:            c.redis,
		DBs:              c.pools,
		Router:           a.NewRouter(),
		Catalog:          c.catalog,
		Routes:           c.routes,
		Flight:           c.flight,
		ACL:              c.acl,
		Scripts:          c.scripts,
		Migrations:       c.migs,
		HiddenTTL:        a.Config.Send.ACLCacheTTL, // user facts cached as long as memberships
		LocalTopics:      a.Config.HotCache.LocalTopics,
		LocalMaxAge:      a.Config.HotCache.LocalMaxAge,
		LocalUsers:       a.Config.HotCache.LocalUsers,
		RememberedMaxAge: a.Config.HotCache.RememberedMaxAge,
		LocalRoutes:      a.Config.HotCache.LocalRoutes,
		RecallWindow:     a.Config.Send.RecallWindow,
		MaxEditBody:      a.Config.Send.MaxBodyBytes,
		Log:              a.Log.With().Str("module", Query).Logger(),
		Registerer:       a.Registry,
	})
}

// NewRouteCheck builds the route checker of `imshard route check|rebuild`.
func (a *App) NewRouteCheck() *query.RouteCheck {
	c := &a.clients
	return &query.RouteCheck{Redis: c.redis, Routes: c.routes, Catalog: c.catalog, DBs: c.pools}
}

// initQuery serves the read routes and the realtime stream (its catch-up
// is the read path): on stop the stream's sockets close with 1001 within
// the stop context (http.shutdown_grace), after the API listener closed.
func initQuery(ctx context.Context, a *App) (Service, error) {
	svc := a.NewQuery()
	auth := httpapi.NewAuthenticator(a.Secrets(), a.Config.Auth.MaxTokenTTL)
	log := a.Log.With().Str("module", Query).Logger()
	svc.Register(a.APIMux, auth, log)
	st := a.Config.Stream
	rt := stream.New(stream.Params{
		Redis: a.clients.redis,
		Query: svc,
		Auth:  auth,
		Limits: stream.Limits{
			MaxConnections:    st.MaxConnections,
			MaxTopics:         st.MaxTopics,
			SendQueue:         st.SendQueue,
			WriteTimeout:      st.WriteTimeout,
			PingInterval:      st.PingInterval,
			IdleTimeout:       st.IdleTimeout,
			ACLCheckInterval:  st.ACLCheckInterval,
			MaxCatchups:       st.MaxCatchups,
			MaxCatchupChanges: st.MaxCatchupChanges,
		},
		Log:        log,
		Registerer: a.Registry,
	})
	rt.Register(a.APIMux)
	a.onTenantsChanged(rt.Revalidate)
	return runner{
		run: func(ctx context.Context) error { <-ctx.Done(); return nil },
		stop: func(ctx context.Context) error {
			rt.Close(ctx)
			svc.Close()
			return nil
		},
	}, nil
}
