package app

import (
	"crypto"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// TokenOptions are the arguments of `imshard token`.
type TokenOptions struct {
	Tenant string
	Sub    int64
	Role   string // "" for a plain user
	TTL    time.Duration
	// KID picks the tenant's key: "" is its jwt_secret; an HS256 key of
	// tenants[].keys signs with its secret; a public key of keys, or a kid
	// of the tenant's JWKS, needs the matching private key in KeyFile.
	KID     string
	KeyFile string // a PEM private key (PKCS #8, PKCS #1 or SEC 1)
}

// Token signs a credential for user o.Sub of o.Tenant with the key o.KID
// picks (`imshard token`): claims tid, sub, iat, exp = now + ttl, role
// unless the user is a plain one (role ""), and the tenant's issuer and
// audience when it requires them; the kid header when a kid is given.
// Every error is about the arguments.
func Token(cfg *config.Config, o TokenOptions) (string, error) {
	if o.Sub <= 0 {
		return "", fmt.Errorf("sub must be a positive user id, got %d", o.Sub)
	}
	switch o.Role {
	case httpapi.RoleUser, httpapi.RoleService, httpapi.RoleAdmin:
	default:
		return "", fmt.Errorf("role must be %s or %s (or none for a plain user), got %q", httpapi.RoleService, httpapi.RoleAdmin, o.Role)
	}
	if o.TTL <= 0 || o.TTL > cfg.Auth.MaxTokenTTL {
		// a longer lifetime is refused by the API (auth.max_token_ttl)
		return "", fmt.Errorf("ttl must be positive and at most auth.max_token_ttl (%s), got %s", cfg.Auth.MaxTokenTTL, o.TTL)
	}
	var ids []string
	for _, t := range cfg.Tenants {
		if t.ID == o.Tenant {
			s, err := signer(t, o)
			if err != nil {
				return "", err
			}
			s.Issuer, s.Audience = t.Issuer, t.Audience
			return httpapi.SignWith(s, o.Tenant, o.Sub, o.Role, o.TTL)
		}
		ids = append(ids, t.ID)
	}
	return "", fmt.Errorf("tenant %q is not configured (configured: %s)", o.Tenant, strings.Join(ids, ", "))
}

// signer is the key of t that o picks.
func signer(t config.Tenant, o TokenOptions) (httpapi.Signer, error) {
	var kids []string
	for _, k := range t.Keys {
		kids = append(kids, k.KID)
	}
	if o.KID == "" {
		if o.KeyFile != "" {
			return httpapi.Signer{}, errors.New("--key-file needs --kid: the key without kid is the tenant's jwt_secret")
		}
		if t.JWTSecret == "" {
			return httpapi.Signer{}, fmt.Errorf("tenant %q has no jwt_secret: pick one of its keys with --kid (configured: %s)", t.ID, strings.Join(kids, ", "))
		}
		return httpapi.Signer{Alg: config.AlgHS256, Key: []byte(t.JWTSecret)}, nil
	}
	for _, k := range t.Keys {
		if k.KID != o.KID {
			continue
		}
		if k.Alg == config.AlgHS256 {
			if o.KeyFile != "" {
				return httpapi.Signer{}, fmt.Errorf("key %q is HS256: it signs with its configured secret, not --key-file", k.KID)
			}
			return httpapi.Signer{KID: k.KID, Alg: k.Alg, Key: []byte(k.Secret)}, nil
		}
		priv, alg, err := privateKey(o.KeyFile)
		if err != nil {
			return httpapi.Signer{}, fmt.Errorf("key %q is %s: %w", k.KID, k.Alg, err)
		}
		pub, err := k.Material()
		if err != nil {
			return httpapi.Signer{}, fmt.Errorf("key %q: %w", k.KID, err)
		}
		if alg != k.Alg || !pub.(interface{ Equal(crypto.PublicKey) bool }).Equal(priv.Public()) {
			return httpapi.Signer{}, fmt.Errorf("--key-file is not the private key of key %q", k.KID)
		}
		return httpapi.Signer{KID: k.KID, Alg: alg, Key: priv}, nil
	}
	if t.JWKSURL == "" {
		return httpapi.Signer{}, fmt.Errorf("tenant %q has no key %q (configured: %s)", t.ID, o.KID, strings.Join(kids, ", "))
	}
	// a kid of the tenant's JWKS, which only the running API fetches
	priv, alg, err := privateKey(o.KeyFile)
	if err != nil {
		return httpapi.Signer{}, fmt.Errorf("kid %q is not configured, so it is taken as one of the tenant's JWKS: %w", o.KID, err)
	}
	return httpapi.Signer{KID: o.KID, Alg: alg, Key: priv}, nil
}

// privateKey reads the PEM private key of path and the one algorithm it
// signs with (config.PublicKeyAlg of its public half).
func privateKey(path string) (crypto.Signer, string, error) {
	if path == "" {
		return nil, "", errors.New("--key-file must give its private key")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("--key-file: %w", err)
	}
	var key crypto.Signer
	if k, err := jwt.ParseRSAPrivateKeyFromPEM(b); err == nil {
		key = k
	} else if k, err := jwt.ParseECPrivateKeyFromPEM(b); err == nil {
		key = k
	} else if k, err := jwt.ParseEdPrivateKeyFromPEM(b); err == nil {
		key = k.(crypto.Signer)
	} else {
		return nil, "", fmt.Errorf("--key-file %s holds no PEM RSA, ECDSA or Ed25519 private key", path)
	}
	alg, err := config.PublicKeyAlg(key.Public())
	if err != nil {
		return nil, "", fmt.Errorf("--key-file %s: %w", path, err)
	}
	return key, alg, nil
}
