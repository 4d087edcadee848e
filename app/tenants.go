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
