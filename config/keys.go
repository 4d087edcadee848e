package config

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/url"
	"regexp"

	"github.com/golang-jwt/jwt/v5"
)

// Algorithms a tenant key is pinned to; a token naming any other (above all
// "none") is refused.
const (
	AlgHS256 = "HS256" // HMAC with SHA-256: a shared secret
	AlgRS256 = "RS256" // RSA PKCS #1 v1.5 with SHA-256, 2048 bits or more
	AlgES256 = "ES256" // ECDSA on P-256 with SHA-256
	AlgEdDSA = "EdDSA" // Ed25519
)

// Algorithms lists the algorithms a key may have, HS256 first.
var Algorithms = []string{AlgHS256, AlgRS256, AlgES256, AlgEdDSA}

// minRSABits is the shortest RSA modulus taken: shorter ones are factorable.
const minRSABits = 2048

// TenantKey is one named key of a tenant (tenants[].keys): an HS256 secret,
// or the PEM public key of an RS256, ES256 or EdDSA issuer. A token is
// checked against it only when its header names this kid and this alg.
type TenantKey struct {
	KID string `mapstructure:"kid" yaml:"kid" json:"kid"`
	Alg string `mapstructure:"alg" yaml:"alg" json:"alg"`
	// Secret is the HS256 key.
	Secret string `mapstructure:"secret" yaml:"secret,omitempty" json:"secret,omitempty"`
	// PublicKey is a PEM "PUBLIC KEY" (PKIX) block, or "RSA PUBLIC KEY" for RS256.
	PublicKey string `mapstructure:"public_key" yaml:"public_key,omitempty" json:"public_key,omitempty"`
}

// KIDPattern is what a configured kid must match: printable, no space, so
// that it shows in logs as written.
var KIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:+/=-]{1,128}$`)

// Material returns what golang-jwt verifies the key's algorithm with: the
// secret as bytes for HS256, else the parsed public key, checked to be of
// the algorithm's type.
func (k TenantKey) Material() (any, error) {
	if k.Alg == AlgHS256 {
		return []byte(k.Secret), nil
	}
	var pub crypto.PublicKey
	var err error
	switch k.Alg {
	case AlgRS256:
		pub, err = jwt.ParseRSAPublicKeyFromPEM([]byte(k.PublicKey))
	case AlgES256:
		pub, err = jwt.ParseECPublicKeyFromPEM([]byte(k.PublicKey))
	case AlgEdDSA:
		pub, err = jwt.ParseEdPublicKeyFromPEM([]byte(k.PublicKey))
	default:
		return nil, fmt.Errorf("unknown algorithm %q", k.Alg)
	}
	if err != nil {
		return nil, fmt.Errorf("not a PEM %s public key: %w", k.Alg, err)
	}
	alg, err := PublicKeyAlg(pub)
	if err != nil {
		return nil, err
	}
	if alg != k.Alg {
		return nil, fmt.Errorf("is a %s key, not %s", alg, k.Alg)
	}
	return pub, nil
}

// PublicKeyAlg is the one algorithm a public key verifies: RS256 for RSA
// of at least 2048 bits, ES256 for ECDSA on P-256, EdDSA for Ed25519. Any
// other key verifies nothing, so a key from a JWKS is never used with an
// algorithm a token picked for it.
func PublicKeyAlg(pub crypto.PublicKey) (string, error) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return "", fmt.Errorf("RSA key of %d bits: at least %d needed", k.N.BitLen(), minRSABits)
		}
		return AlgRS256, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", fmt.Errorf("ECDSA key on %s: only P-256 (ES256) is taken", k.Curve.Params().Name)
		}
		return AlgES256, nil
	case ed25519.PublicKey:
		return AlgEdDSA, nil
	}
	return "", fmt.Errorf("unsupported public key type %T", pub)
}

// HS256Key is one HS256 secret of a tenant, where the configuration holds it.
type HS256Key struct {
	Key    string // the configuration key: tenants[i].jwt_secret or tenants[i].keys[j].secret
	KID    string // "" for jwt_secret
	Secret string
}

// HS256Keys lists the tenant's HS256 secrets, jwt_secret first when set; i
// is the tenant's index, for the configuration keys.
func (t Tenant) HS256Keys(i int) []HS256Key {
	var out []HS256Key
	if t.JWTSecret != "" {
		out = append(out, HS256Key{Key: fmt.Sprintf("tenants[%d].jwt_secret", i), Secret: t.JWTSecret})
	}
	for j, k := range t.Keys {
		if k.Alg == AlgHS256 {
			out = append(out, HS256Key{Key: fmt.Sprintf("tenants[%d].keys[%d].secret", i, j), KID: k.KID, Secret: k.Secret})
		}
	}
	return out
}

// keyProblems checks a tenant's key set apart from its secrets' lengths and
// sharing (tenantProblems): some key to verify with, each named key's kid,
// algorithm and material, the JWKS URL.
func keyProblems(p *problems, t Tenant, key, where string) {
	if t.JWTSecret == "" && len(t.Keys) == 0 && t.JWKSURL == "" {
		// named after jwt_secret, the one key of a tenant until key sets
		p.add(key+".jwt_secret", "is empty and the tenant has neither keys nor a jwks_url%s: nothing could verify its tokens", where)
	}
	kids := map[string]int{}
	for j, k := range t.Keys {
		kk := fmt.Sprintf("%s.keys[%d]", key, j)
		switch first, dup := kids[k.KID]; {
		case !KIDPattern.MatchString(k.KID):
			p.add(kk+".kid", "must match %s%s (a key without kid is the tenant's jwt_secret)", KIDPattern, where)
		case dup:
			p.add(kk+".kid", "kid %q is the one of %s.keys[%d] too%s: a token names one key", k.KID, key, first, where)
		default:
			kids[k.KID] = j
		}
		switch k.Alg {
		case AlgHS256:
			if k.PublicKey != "" {
				p.add(kk+".public_key", "is set on an HS256 key%s: HS256 verifies with secret only", where)
			}
		case AlgRS256, AlgES256, AlgEdDSA:
			if k.Secret != "" {
				p.add(kk+".secret", "is set on an %s key%s: it verifies with public_key only", k.Alg, where)
			}
			if _, err := k.Material(); err != nil {
				p.add(kk+".public_key", "%v%s", err, where)
			}
		default:
			p.add(kk+".alg", "must be one of %v%s, got %q", Algorithms, where, k.Alg)
		}
	}
	if t.JWKSURL != "" {
		if err := checkJWKSURL(t.JWKSURL); err != nil {
			p.add(key+".jwks_url", "%v%s", err, where)
		}
	}
}

func checkJWKSURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("is not a URL")
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errors.New("must be an absolute http(s) URL")
	}
	return nil
}
