package app

import (
	"sync"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// tenantSet is the live list of tenants: JWT secrets for the HTTP roles and
// the ids/DSNs for the pools. A reload (SIGHUP) replaces it.
type tenantSet struct {
	mu      sync.RWMutex
	secrets map[string][]byte
	limits  map[string]config.Limits // each tenant's limits, its own over the defaults
	deflt   config.Limits            // the limits section: a tenant's not (yet) in the set
}

func (s *tenantSet) set(tenants []config.Tenant, defaults config.Limits) {
	m := make(map[string][]byte, len(tenants))
	l := make(map[string]config.Limits, len(tenants))
	for _, t := range tenants {
		m[t.ID] = []byte(t.JWTSecret)
		l[t.ID] = defaults.Of(t)
	}
	s.mu.Lock()
	s.secrets, s.limits, s.deflt = m, l, defaults
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
