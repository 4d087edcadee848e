package app

import (
	"fmt"
	"strings"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// Token signs a credential for user sub of tenant with the tenant's
// configured jwt_secret (`imshard token`): claims tid, sub, iat, exp = now
// + ttl, and role unless the user is a plain one (role ""). Every error is
// about the arguments.
func Token(cfg *config.Config, tenant string, sub int64, role string, ttl time.Duration) (string, error) {
	if sub <= 0 {
		return "", fmt.Errorf("sub must be a positive user id, got %d", sub)
	}
	switch role {
	case httpapi.RoleUser, httpapi.RoleService, httpapi.RoleAdmin:
	default:
		return "", fmt.Errorf("role must be %s or %s (or none for a plain user), got %q", httpapi.RoleService, httpapi.RoleAdmin, role)
	}
	if ttl <= 0 || ttl > cfg.Auth.MaxTokenTTL {
		// a longer lifetime is refused by the API (auth.max_token_ttl)
		return "", fmt.Errorf("ttl must be positive and at most auth.max_token_ttl (%s), got %s", cfg.Auth.MaxTokenTTL, ttl)
	}
	var ids []string
	for _, t := range cfg.Tenants {
		if t.ID == tenant {
			return httpapi.Sign([]byte(t.JWTSecret), tenant, sub, role, ttl)
		}
		ids = append(ids, t.ID)
	}
	return "", fmt.Errorf("tenant %q is not configured (configured: %s)", tenant, strings.Join(ids, ", "))
}
