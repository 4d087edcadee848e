package app

import (
	"context"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/modules/query"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/stream"
)

// NewRouter builds the read path's shard router from the shared clients.
func (a *App) NewRouter() *routing.Router {
	c := &a.clients
	return routing.NewRouter(routing.RouterParams{
		Redis:      c.redis,
		KeySpace:   c.keys,
		DBs:        c.pools,
		Catalog:    c.catalog,
		Routes:     c.routes,
		Metrics:    c.rmetrics,
		Migrations: c.migs,
		Log:        a.Log.With().Str("module", Query).Logger(),
	})
}

// initReadPath builds the process's one read path, shared by the modules
// that read (its metrics are registered once); stopping it releases its
// prepared statements, after every module using it stopped.
func initReadPath(ctx context.Context, a *App) (Service, error) {
	c := &a.clients
	a.reader = readpath.New(readpath.Params{
		Redis:       c.redis,
		KeySpace:    c.keys,
		DBs:         c.pools,
		Router:      a.NewRouter(),
		Catalog:     c.catalog,
		Cold:        a.NewColdReader(),
		Flight:      c.flight,
		ACL:         c.acl,
		Scripts:     c.scripts,
		HiddenTTL:   a.Config.Send.ACLCacheTTL, // user facts cached as long as memberships
		LocalTopics: a.Config.HotCache.LocalTopics,
		LocalMaxAge: a.Config.HotCache.LocalMaxAge,
		Log:         a.Log.With().Str("module", ReadPath).Logger(),
		Registerer:  a.Registry,
	})
	return holder{close: func() error { a.reader.Close(); return c.cold.Close() }}, nil
}

// NewQuery builds the read service (also used by `imshard bench query`)
// over the read path (module readpath).
func (a *App) NewQuery() *query.Service {
	c := &a.clients
	return query.New(query.Params{
		Reader:     a.reader,
		Redis:      c.redis,
		KeySpace:   c.keys,
		DBs:        c.pools,
		Router:     a.NewRouter(),
		Catalog:    c.catalog,
		Routes:     c.routes,
		Flight:     c.flight,
		Migrations: c.migs,
		RouteCheck: a.NewRouteCheck(),
	})
}

// NewInbox builds the read-state service (also used by `imshard bench
// inbox`) over the read path (module readpath); Close waits for its read
// frames under way.
func (a *App) NewInbox() *inbox.Service {
	c := &a.clients
	return inbox.New(inbox.Params{
		Reader:           a.reader,
		Redis:            c.redis,
		KeySpace:         c.keys,
		DBs:              c.pools,
		Router:           a.NewRouter(),
		Flight:           c.flight,
		ACL:              c.acl,
		Scripts:          c.scripts,
		Migrations:       c.migs,
		LocalUsers:       a.Config.HotCache.LocalUsers,
		RememberedMaxAge: a.Config.HotCache.RememberedMaxAge,
		LocalRoutes:      a.Config.HotCache.LocalRoutes,
		Log:              a.Log.With().Str("module", Inbox).Logger(),
		Registerer:       a.Registry,
	})
}

// NewRouteCheck builds the route checker of `imshard route check|rebuild`.
func (a *App) NewRouteCheck() *routecheck.Checker {
	c := &a.clients
	return &routecheck.Checker{Redis: c.redis, KeySpace: c.keys, Routes: c.routes, Catalog: c.catalog, DBs: c.pools,
		Archives: a.NewColdReader()}
}

// initQuery serves the message reads: pages, one message, context,
// search, by id, the admin lookups and legal holds.
func initQuery(ctx context.Context, a *App) (Service, error) {
	auth := httpapi.NewAuthenticator(a.Keys(), a.Config.Auth.MaxTokenTTL)
	log := a.Log.With().Str("module", Query).Logger()
	a.NewQuery().Register(a.APIMux, auth, log, a.clients.limits)
	// the retention admin routes (holds) sit beside the other admin routes
	a.Retention().Register(a.APIMux, auth, log)
	return holder{}, nil
}

// initInbox serves the read state: cursors, badges, the topic list, sync,
// preferences; on stop it waits for the read frames under way.
func initInbox(ctx context.Context, a *App) (Service, error) {
	svc := a.NewInbox()
	auth := httpapi.NewAuthenticator(a.Keys(), a.Config.Auth.MaxTokenTTL)
	svc.Register(a.APIMux, auth, a.Log.With().Str("module", Inbox).Logger(), a.clients.limits)
	return holder{close: func() error { svc.Close(); return nil }}, nil
}

// initStream serves the realtime stream, reading through a query service
// of its own (its catch-up is the read path): on stop the sockets close
// with 1001 within the stop context (http.shutdown_grace), after the API
// listener closed.
func initStream(ctx context.Context, a *App) (Service, error) {
	auth := httpapi.NewAuthenticator(a.Keys(), a.Config.Auth.MaxTokenTTL)
	st := a.Config.Stream
	rt := stream.New(stream.Params{
		Redis:    a.clients.redis,
		KeySpace: a.clients.keys,
		Reads:    a.NewQuery(),
		Auth:     auth,
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
			MaxPerUser:        st.MaxConnectionsPerUser,
		},
		RateLimits: a.clients.limits,
		Log:        a.Log.With().Str("module", Stream).Logger(),
		Registerer: a.Registry,
	})
	rt.Register(a.APIMux)
	a.onTenantsChanged(rt.Revalidate)
	a.keys.OnKeysRemoved(rt.Revalidate)
	return runner{
		run: func(ctx context.Context) error { <-ctx.Done(); return nil },
		stop: func(ctx context.Context) error {
			rt.Close(ctx)
			return nil
		},
	}, nil
}
