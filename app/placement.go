package app

import (
	"context"
	"crypto/tls"
	"strings"
	"time"

	"github.com/imshard/imshard/modules/placement"
)

// following is the MySQL module's Service: the tenant pools (a client,
// closed at stop) and the loop that keeps them on each tenant's current
// placement.
type following struct {
	holder
	run func(ctx context.Context) error
}

func (f following) Run(ctx context.Context) error { return f.run(ctx) }

// placementSyncTimeout bounds the first read of the placement records at
// start: a process that cannot read them starts on the configured DSNs
// (whose fences refuse its writes if a tenant moved) and follows the
// records from its first successful poll.
const placementSyncTimeout = 5 * time.Second

// initPlacement opens the placement store (mysql.placement_dsns, or one
// database per server of the tenants' DSNs) and reads it once, before any
// module takes a tenant handle.
func initPlacement(ctx context.Context, a *App, tlsCfg *tls.Config) error {
	dsns := a.Config.MySQL.PlacementDSNs
	if len(dsns) == 0 {
		var tenantDSNs []string
		for _, t := range Tenants(a.Config) {
			tenantDSNs = append(tenantDSNs, t.DSN)
		}
		if len(tenantDSNs) == 0 {
			// no tenant yet: the first ones will come from the template
			tenantDSNs = []string{strings.ReplaceAll(a.Config.MySQL.DSNTemplate, "{tenant}", "placement")}
		}
		var err error
		if dsns, err = placement.DefaultServers(tenantDSNs); err != nil {
			return err
		}
	}
	store, err := placement.Open(dsns, tlsCfg)
	if err != nil {
		return err
	}
	w := placement.NewWatcher(store, a.clients.pools, a.Config.MySQL.PlacementPoll,
		a.Log.With().Str("module", "placement").Logger(), a.Registry)
	sctx, cancel := context.WithTimeout(ctx, placementSyncTimeout)
	defer cancel()
	if err := w.Sync(sctx); err != nil {
		a.Log.Warn().Err(err).Msg("placement records not readable at start; following the configured DSNs until they are")
	}
	w.ExportTenants(a.clients.pools.IDs())
	a.clients.placed, a.clients.placement = store, w
	return nil
}
