package config

// Reasons a tenant's jwt_secret is accepted but weak.
const (
	WeakSecretDemo  = "demo"  // the public demo secret: anyone can sign the tenant's tokens
	WeakSecretShort = "short" // shorter than StrongSecretLen bytes
)

// StrongSecretLen is the shortest jwt_secret taken as strong: RFC 7518 §3.2
// asks an HS256 key to be at least as long as the hash's 32-byte output.
// Shorter ones (from minSecretLen on) are accepted, so that a deployment
// whose secrets predate this length keeps starting and reloading while its
// operator rotates them and reissues the tokens, and so that the built-in
// demo tenant of `imshard all` keeps its documented secret; they are
// reported instead (WeakSecrets).
const StrongSecretLen = 32

// WeakSecret is one tenant whose jwt_secret validation accepts but an
// operator must replace.
type WeakSecret struct {
	Tenant string
	Reason string // WeakSecretDemo or WeakSecretShort
}

// WeakSecrets lists the tenants with an accepted but weak jwt_secret, in
// the order of tenants: the public demo secret (which every process but
// `imshard all` refuses), else one shorter than StrongSecretLen.
func WeakSecrets(tenants []Tenant) []WeakSecret {
	var weak []WeakSecret
	for _, t := range tenants {
		switch {
		case t.JWTSecret == DemoSecret:
			weak = append(weak, WeakSecret{Tenant: t.ID, Reason: WeakSecretDemo})
		case len(t.JWTSecret) < StrongSecretLen:
			weak = append(weak, WeakSecret{Tenant: t.ID, Reason: WeakSecretShort})
		}
	}
	return weak
}
