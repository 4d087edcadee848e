package app

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/keyset"
)

// TestTokenSignsWithTheChosenKid: `imshard token` signs with jwt_secret
// without --kid, with an HS256 key's secret by its kid, and with the
// private key of --key-file for a public key of the tenant — checked to be
// that key's — or for a kid of its JWKS; each token carries the tenant's
// iss and aud and verifies as the key chosen. Every wrong combination is
// an error naming it.
func TestTokenSignsWithTheChosenKid(t *testing.T) {
	dir := t.TempDir()
	pemFile := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	es, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pubDER, _ := x509.MarshalPKIXPublicKey(es.Public())
	esFile, otherFile := pemFile("es.pem", es), pemFile("other.pem", other)
	cfg := config.Default()
	cfg.Tenants = []config.Tenant{
		{ID: "acme", JWTSecret: "acme-secret-123", Issuer: "https://idp.acme", Audience: "imshard", Keys: []config.TenantKey{
			{KID: "hs", Alg: config.AlgHS256, Secret: "acme-hs-secret-1"},
			{KID: "es", Alg: config.AlgES256, PublicKey: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))},
		}},
		{ID: "beta", JWKSURL: "https://idp.beta/jwks", Keys: []config.TenantKey{{KID: "b1", Alg: config.AlgHS256, Secret: "beta-hs-secret-1"}}},
	}
	auth := httpapi.NewAuthenticator(keyset.New(keyset.Params{Log: zerolog.Nop(), Registerer: prometheus.NewRegistry(), RefreshInterval: time.Minute}, cfg.Tenants), time.Hour)
	opts := func(tenant, kid, file string) TokenOptions {
		return TokenOptions{Tenant: tenant, Sub: 7, TTL: time.Minute, KID: kid, KeyFile: file}
	}
	for _, c := range []struct {
		name string
		o    TokenOptions
	}{
		{"jwt_secret", opts("acme", "", "")},
		{"HS256 key", opts("acme", "hs", "")},
		{"ES256 key with its private key", opts("acme", "es", esFile)},
	} {
		tok, err := Token(&cfg, c.o)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		p, err := auth.Verify(tok)
		if err != nil || p.KeyID != c.o.KID || p.UserID != 7 {
			t.Fatalf("%s: Verify = %+v, %v; want user 7 by kid %q", c.name, p, err, c.o.KID)
		}
	}

	// a kid of the tenant's JWKS: signed with --key-file, the kid in the header
	tok, err := Token(&cfg, opts("beta", "idp-9", esFile))
	if err != nil {
		t.Fatal(err)
	}
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
	if err != nil || parsed.Header["kid"] != "idp-9" || parsed.Header["alg"] != "ES256" {
		t.Fatalf("JWKS kid token header %v, %v; want kid idp-9, alg ES256", parsed.Header, err)
	}

	for _, c := range []struct {
		name string
		o    TokenOptions
		says string
	}{
		{"public key without --key-file", opts("acme", "es", ""), "--key-file must give"},
		{"another private key", opts("acme", "es", otherFile), "not the private key of key \"es\""},
		{"--key-file for an HS256 key", opts("acme", "hs", esFile), "signs with its configured secret"},
		{"--key-file without --kid", opts("acme", "", esFile), "--key-file needs --kid"},
		{"kid unknown, no JWKS", opts("acme", "nope", ""), `has no key "nope" (configured: hs, es)`},
		{"kid of the JWKS without --key-file", opts("beta", "idp-9", ""), "--key-file must give"},
		{"no jwt_secret, no kid", opts("beta", "", ""), `has no jwt_secret: pick one of its keys with --kid (configured: b1)`},
		{"key file missing", opts("acme", "es", filepath.Join(dir, "none.pem")), "no such file"},
		{"key file not a key", opts("acme", "es", notAKeyFile(t, dir)), "holds no PEM"},
	} {
		if _, err := Token(&cfg, c.o); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.says)
		}
	}
}

// notAKeyFile is a file that is PEM but no private key.
func notAKeyFile(t *testing.T, dir string) string {
	p := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
