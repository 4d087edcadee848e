package app

import (
	"context"
	"sync"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// tenantSet is the live limits of the tenants. A reload (SIGHUP) replaces
// it.
type tenantSet struct {
	mu     sync.RWMutex
	limits map[string]config.Limits // each tenant's limits, its own over the defaults
	deflt  config.Limits            // the limits section: a tenant's not (yet) in the set
	// retention is each tenant's retention_months
	retention map[string]int
	// archiveAfter is each tenant's archive_after_months
	archiveAfter map[string]int
}

func (s *tenantSet) set(tenants []config.Tenant, defaults config.Limits) {
	l := make(map[string]config.Limits, len(tenants))
	for _, t := range tenants {
		l[t.ID] = defaults.Of(t)
	}
	r := make(map[string]int, len(tenants))
	ar := make(map[string]int, len(tenants))
	for _, t := range tenants {
		r[t.ID], ar[t.ID] = t.RetentionMonths, t.ArchiveAfterMonths
	}
	s.mu.Lock()
	s.limits, s.deflt, s.retention, s.archiveAfter = l, defaults, r, ar
	s.mu.Unlock()
}

// limitsOf is a tenant's limits in the live tenant list (the defaults for
// a tenant a reload removed while its request was under way).
func (s *tenantSet) limitsOf(tenant string) config.Limits {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if l, ok := s.limits[tenant]; ok {
		return l
	}
	return s.deflt
}

// Keys is the live key set of every tenant, which the HTTP roles verify
// tokens with: built from the configuration in New, replaced by each
// reload (so a key added or removed takes effect at once), and completed
// by the tenants' JWKS once module keys has started.
func (a *App) Keys() httpapi.KeySets { return a.keys }

// initKeys fetches the JWKS of every tenant that has a jwks_url, then
// keeps them fresh in the background until the process stops; a JWKS
// fetch that drops a key ends the sockets it verified, as a reload does.
func initKeys(ctx context.Context, a *App) (Service, error) {
	a.keys.Start(a.reload.live.Tenants)
	return holder{close: func() error { a.keys.Close(); return nil }}, nil
}

// retentionOf is a tenant's retention_months in the live tenant list (0,
// keep forever, for a tenant a reload removed).
func (s *tenantSet) retentionOf(tenant string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.retention[tenant]
}

// archiveAfterOf is a tenant's archive_after_months in the live tenant
// list (0, never automatically, for a tenant a reload removed).
func (s *tenantSet) archiveAfterOf(tenant string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.archiveAfter[tenant]
}
