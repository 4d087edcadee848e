// Package keyset holds the keys each tenant's tokens are verified with:
// the configured ones (jwt_secret, keys) and the ones the tenant's
// identity provider publishes at its jwks_url, fetched in the background.
// Every key is pinned to one algorithm, so a token never picks how its
// signature is checked: an HS256 token is never checked against a public
// key, and "none" matches no key.
package keyset

import (
	"crypto"
	"crypto/hmac"
	"errors"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/config"
)

// Errors of Set.Key; the authenticator counts its refusals by them.
var (
	// ErrUnknownKey: the set holds no key of the token's kid (or, for a
	// token without kid, the tenant has no jwt_secret).
	ErrUnknownKey = errors.New("no key of this kid")
	// ErrAlgorithm: the key of the token's kid is of another algorithm.
	ErrAlgorithm = errors.New("the key of this kid is of another algorithm")
	// ErrBadKID: the kid header is not a non-empty string.
	ErrBadKID = errors.New("the kid header must be a non-empty string")
)

// Key is one verification key pinned to its algorithm.
type Key struct {
	KID string // "" for the tenant's jwt_secret
	Alg string // one of config.Algorithms
	// Material is what golang-jwt verifies Alg with: []byte for HS256,
	// else *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey.
	Material any
}

// Equal reports whether o is the same key: same kid, algorithm and
// material (secrets compared in constant time).
func (k Key) Equal(o Key) bool {
	if k.KID != o.KID || k.Alg != o.Alg {
		return false
	}
	switch m := k.Material.(type) {
	case []byte:
		b, ok := o.Material.([]byte)
		return ok && hmac.Equal(m, b)
	case interface{ Equal(crypto.PublicKey) bool }:
		return m.Equal(o.Material)
	}
	return false
}

// Set is one tenant's key set at one moment: a reload builds a new one;
// only its JWKS part changes in place, as fetches replace it.
type Set struct {
	// Issuer and Audience, when not empty, are the iss and one of the aud
	// every token of the tenant must carry.
	Issuer, Audience string
	keys             map[string]Key // by kid; "" is jwt_secret
	jwks             *jwks          // nil without jwks_url, or before the registry started
}

// newSet builds t's configured keys; validation has checked them, so a
// key that does not parse is left out rather than failing a reload.
func newSet(t config.Tenant, remote *jwks) *Set {
	s := &Set{Issuer: t.Issuer, Audience: t.Audience, keys: map[string]Key{}, jwks: remote}
	if t.JWTSecret != "" {
		s.keys[""] = Key{Alg: config.AlgHS256, Material: []byte(t.JWTSecret)}
	}
	for _, k := range t.Keys {
		if m, err := k.Material(); err == nil {
			s.keys[k.KID] = Key{KID: k.KID, Alg: k.Alg, Material: m}
		}
	}
	return s
}

// Key is the key t is verified with: the one of its kid header — the
// configured key of that kid first, then the JWKS's — or, without a kid,
// the tenant's jwt_secret. The key's algorithm must be the token's.
func (s *Set) Key(t *jwt.Token) (Key, error) {
	kid := ""
	if v, ok := t.Header["kid"]; ok {
		str, isString := v.(string)
		if !isString || str == "" {
			return Key{}, ErrBadKID
		}
		kid = str
	}
	alg := t.Method.Alg()
	if k, ok := s.keys[kid]; ok {
		if k.Alg != alg {
			return Key{}, ErrAlgorithm
		}
		return k, nil
	}
	if kid == "" || s.jwks == nil {
		return Key{}, ErrUnknownKey
	}
	return s.jwks.key(t, kid, alg)
}

// Holds reports whether k, which verified a token earlier, is still the key
// the set gives the token's kid, without fetching anything.
func (s *Set) Holds(k Key) bool {
	if c, ok := s.keys[k.KID]; ok {
		return c.Equal(k)
	}
	return k.KID != "" && s.jwks != nil && s.jwks.holds(k)
}
