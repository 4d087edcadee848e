package config

// Reasons a tenant's HS256 secret (jwt_secret, or a key's secret) is
// accepted but weak.
const (
	WeakSecretDemo  = "demo"  // a public demo secret: anyone can sign the tenant's tokens
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

// WeakSecret is one HS256 secret of a tenant that validation accepts but
// an operator must replace.
type WeakSecret struct {
	Tenant string
	KID    string // "" for jwt_secret
	Reason string // WeakSecretDemo or WeakSecretShort
}

// WeakSecrets lists the accepted but weak HS256 secrets, in the order of
// tenants and, within one, jwt_secret then keys: the public demo secret
// (which every process but `imshard all` refuses), else one shorter than
// StrongSecretLen.
func WeakSecrets(tenants []Tenant) []WeakSecret {
	var weak []WeakSecret
	for i, t := range tenants {
		for _, k := range t.HS256Keys(i) {
			switch {
			case IsDemoSecret(k.Secret):
				weak = append(weak, WeakSecret{Tenant: t.ID, KID: k.KID, Reason: WeakSecretDemo})
			case len(k.Secret) < StrongSecretLen:
				weak = append(weak, WeakSecret{Tenant: t.ID, KID: k.KID, Reason: WeakSecretShort})
			}
		}
	}
	return weak
}
