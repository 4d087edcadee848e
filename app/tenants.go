package app

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// tenantSet is the live list of tenants: JWT secrets for the HTTP roles and
// the ids/DSNs for the pools. SIGHUP re-reads tenants_file into it.
type tenantSet struct {
	mu      sync.RWMutex
	secrets map[string][]byte
}

func (s *tenantSet) set(tenants []config.Tenant) {
	m := make(map[string][]byte, len(tenants))
	for _, t := range tenants {
		m[t.ID] = []byte(t.JWTSecret)
	}
	s.mu.Lock()
	s.secrets = m
	s.mu.Unlock()
}

// Secrets looks up a tenant's JWT secret in the live tenant list; the HTTP
// roles verify tokens with it, so a reload takes effect at once.
func (a *App) Secrets() httpapi.Secrets {
	return func(tenant string) ([]byte, bool) {
		a.tenants.mu.RLock()
		defer a.tenants.mu.RUnlock()
		s, ok := a.tenants.secrets[tenant]
		return s, ok && len(s) > 0
	}
}

// ReloadTenants re-reads tenants_file and merges it over the tenants the
// process started with (a tenant added or changed in the file takes effect;
// removing a tenant needs a restart, so no in-flight request loses its DB).
func (a *App) ReloadTenants() error {
	if a.Config.TenantsFile == "" {
		return nil
	}
	extra, err := config.LoadTenantsFile(a.Config.TenantsFile)
	if err != nil {
		return err
	}
	merged, err := config.MergeTenants(a.Config.Tenants, extra)
	if err != nil {
		return err
	}
	next := *a.Config
	next.Tenants = merged
	a.tenants.set(merged)
	if a.clients.pools != nil {
		a.clients.pools.SetTenants(Tenants(&next))
	}
	a.Log.Info().Int("tenants", len(merged)).Str("file", a.Config.TenantsFile).Msg("tenants reloaded")
	return nil
}

// watchReload reloads the tenants on SIGHUP until ctx ends.
func (a *App) watchReload(ctx context.Context) {
	if a.Config.TenantsFile == "" {
		return
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := a.ReloadTenants(); err != nil {
					a.Log.Error().Err(err).Msg("tenant reload failed; keeping the current tenants")
				}
			}
		}
	}()
}
