package app

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/imshard/imshard/config"
)

// ReloadOn makes Run apply the configuration load returns each time sig
// delivers (SIGHUP in the binary: `systemctl reload`). load must read every
// source again (file, tenants_file, environment, flags) and validate the
// result as at start-up, with the same checks whatever the roles. The
// caller subscribes sig before starting, so a signal that arrives while
// modules start is applied once they run rather than killing the process.
func (a *App) ReloadOn(sig <-chan os.Signal, load func() (*config.Config, error)) {
	a.reload.sig, a.reload.load = sig, load
}

// reloader is what ReloadOn set, plus the configuration in effect: the
// start-up one with every reload's live keys applied.
type reloader struct {
	sig  <-chan os.Signal
	load func() (*config.Config, error)
	live *config.Config
	// lastOK and failures tell a monitor that a reload was refused: the
	// process runs on, on the configuration it had
	lastOK   prometheus.Gauge
	failures prometheus.Counter
	// weakSecrets is 1 per tenant, kid and reason whose HS256 secret the
	// running configuration accepts but an operator must replace
	// (reportWeakSecrets)
	weakSecrets *prometheus.GaugeVec
	// revoke are what the modules that hold credentials past their request
	// (the stream's sockets) run once a reload replaced the tenants; set
	// by Start, read by reloads, which begin only once Run does
	revoke []func()
	// provision are what the modules that prepare a tenant's storage (the
	// shard manager) run with the tenants a reload added or moved to
	// another database; set and read as revoke
	provision []func(tenants []string)
}

// newReloadMetrics registers the reload's series on reg: a process starts
// on a configuration it validated, so the last reload counts as successful.
// reportWeakSecrets warns, at start and after each applied reload, of every
// HS256 secret of a tenant — jwt_secret or a key's — that is accepted but
// weak (config.WeakSecrets), and exports exactly those as
// imshard_tenant_secret_weak.
func (a *App) reportWeakSecrets(tenants []config.Tenant) {
	a.reload.weakSecrets.Reset()
	for _, w := range config.WeakSecrets(tenants) {
		a.reload.weakSecrets.WithLabelValues(w.Tenant, w.KID, w.Reason).Set(1)
		msg := fmt.Sprintf("tenant HS256 secret is shorter than %d bytes: anyone who guesses it signs this tenant's tokens; rotate it", config.StrongSecretLen)
		if w.Reason == config.WeakSecretDemo {
			msg = "tenant HS256 secret is a public demo secret: anyone can sign this tenant's tokens; configure tenants before anyone but you can reach this process"
		}
		ev := a.Log.Warn().Str("key", "tenants").Str("tenant", w.Tenant).Str("reason", w.Reason)
		if w.KID != "" {
			ev = ev.Str("kid", w.KID)
		}
		ev.Msg(msg)
	}
}

func newReloadMetrics(reg prometheus.Registerer) (lastOK prometheus.Gauge, failures prometheus.Counter) {
	f := promauto.With(reg)
	lastOK = f.NewGauge(prometheus.GaugeOpts{Name: "imshard_config_last_reload_successful",
		Help: "1 when the process runs on the configuration last read (at start or by the last reload), 0 when the last reload was refused and the process runs on the one before it."})
	failures = f.NewCounter(prometheus.CounterOpts{Name: "imshard_config_reload_failures_total",
		Help: "Reloads (SIGHUP) refused: unreadable file or invalid value; each changed nothing."})
	lastOK.Set(1)
	return lastOK, failures
}

// onTenantsChanged registers fn to run after each reload has replaced the
// tenant list.
func (a *App) onTenantsChanged(fn func()) { a.reload.revoke = append(a.reload.revoke, fn) }

// onTenantsAdded registers fn to run after each reload that added tenants
// or changed the database (DSN) of some, with their ids.
func (a *App) onTenantsAdded(fn func(tenants []string)) {
	a.reload.provision = append(a.reload.provision, fn)
}

// watchReload applies a reload per signal until ctx ends. A reload that
// fails (unreadable file, invalid value) is logged and changes nothing: a
// reload never stops the process.
func (a *App) watchReload(ctx context.Context) {
	if a.reload.sig == nil {
		return
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-a.reload.sig:
				next, err := a.reload.load()
				if err != nil {
					a.reload.lastOK.Set(0)
					a.reload.failures.Inc()
					a.Log.Error().Err(err).Msg("configuration reload failed; nothing changed")
					continue
				}
				a.Reload(next)
			}
		}
	}()
}

// Reload applies next, the configuration as read again, before it returns:
// its tenants and their limits replace the running ones and log.level takes
// effect at once;
// every other changed key that the process's modules read (keysRead) is
// logged with "restart needed" (and again on each reload until a restart
// applies it), and a key none of them reads is only listed at debug level.
//
// The tenant list has one owner, the key sets the credentials are verified
// against: a tenant missing from next, or a key removed or changed (its
// jwt_secret, a key of keys, its jwks_url, issuer or audience), has its
// old tokens refused by every route from the moment the sets are replaced,
// its pool closed (a request of it still under way may fail), and then
// every open socket whose token no longer verifies ended. A socket admitted
// meanwhile verifies its token again once it is tracked, so none slips
// between the two.
func (a *App) Reload(next *config.Config) {
	live := a.reload.live
	for _, t := range live.Tenants {
		if !slices.ContainsFunc(next.Tenants, func(n config.Tenant) bool { return n.ID == t.ID }) {
			a.Log.Warn().Str("key", "tenants").Str("tenant", t.ID).Msg("tenant removed from the configuration: its tokens are refused and its sockets closed")
		}
	}
	applied := *live
	applied.Tenants, applied.TenantsFile, applied.Limits = next.Tenants, next.TenantsFile, next.Limits
	a.tenants.set(applied.Tenants, applied.Limits)
	a.keys.Apply(applied.Tenants)
	if a.clients.pools != nil {
		a.clients.pools.SetTenants(Tenants(&applied))
	}
	for _, revoke := range a.reload.revoke {
		revoke()
	}
	if added := addedTenants(live, &applied); len(added) > 0 {
		for _, provision := range a.reload.provision {
			provision(added)
		}
	}
	a.exportTenants(applied.Tenants)
	a.reportWeakSecrets(applied.Tenants)
	if next.Log.Level != live.Log.Level {
		SetLogLevel(next.Log.Level)
		applied.Log.Level = next.Log.Level
	}
	changed := config.Changed(live, next)
	a.Log.Debug().Strs("keys", changed).Msg("configuration keys changed")
	for _, key := range restartNeeded(a.Modules(), changed) {
		a.Log.Warn().Str("key", key).Msg("configuration key changed: restart needed")
	}
	a.reload.live = &applied
	a.reload.lastOK.Set(1)
	a.Log.Info().Int("tenants", len(applied.Tenants)).Str("log_level", applied.Log.Level).Msg("configuration reloaded")
}

// exportTenants creates the tenant-labelled series of the modules started
// for tenants a reload added, at 0, as their start did for the others.
func (a *App) exportTenants(tenants []config.Tenant) {
	ids := make([]string, 0, len(tenants))
	for _, t := range tenants {
		ids = append(ids, t.ID)
	}
	if a.clients.rmetrics != nil {
		a.clients.rmetrics.ExportTenants(ids)
	}
	if a.clients.placement != nil {
		a.clients.placement.ExportTenants(ids)
	}
	if a.clients.limits != nil {
		a.clients.limits.ExportTenants(ids)
	}
	if a.clients.shards != nil && slices.Contains(a.Modules(), ShardMgr) {
		a.clients.shards.ExportTenants(ids)
	}
	if a.clients.migrator != nil && slices.Contains(a.Modules(), Migrate) {
		a.clients.migrator.ExportTenants(ids)
	}
}

// addedTenants are the tenants of next that live lacks or knew with another
// database: those whose month tables may not exist yet.
func addedTenants(live, next *config.Config) []string {
	var out []string
	for _, t := range next.Tenants {
		i := slices.IndexFunc(live.Tenants, func(l config.Tenant) bool { return l.ID == t.ID })
		if i < 0 || live.TenantDSN(live.Tenants[i]) != next.TenantDSN(t) {
			out = append(out, t.ID)
		}
	}
	return out
}
