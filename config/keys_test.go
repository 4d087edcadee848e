package config

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"reflect"
	"strings"
	"testing"
	"time"
)

func publicPEM(t *testing.T, pub crypto.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// TestValidateTenantKeys: each named key has a kid of its own, a known
// algorithm and the material of that algorithm; a public key of another
// type, a weak RSA or ECDSA key, a secret on a public key and the reverse
// are refused; HS256 key secrets follow jwt_secret's rules (length, never
// another tenant's); a tenant needs some key; jwks_url is an http(s) URL.
func TestValidateTenantKeys(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	weakRSA, _ := rsa.GenerateKey(rand.Reader, 1024)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	rsaPEM, ecPEM, edPEM := publicPEM(t, rsaKey.Public()), publicPEM(t, ecKey.Public()), publicPEM(t, edPub)
	weakPEM, p384PEM := publicPEM(t, weakRSA.Public()), publicPEM(t, p384.Public())
	good := func() Config {
		c := Default()
		c.Tenants = []Tenant{{ID: "acme", JWTSecret: "acme-secret-123", JWKSURL: "https://idp.acme/.well-known/jwks.json",
			Issuer: "https://idp.acme", Audience: "imshard", Keys: []TenantKey{
				{KID: "2026-12", Alg: AlgHS256, Secret: "acme-key-2026-12"},
				{KID: "rs", Alg: AlgRS256, PublicKey: rsaPEM},
				{KID: "es", Alg: AlgES256, PublicKey: ecPEM},
				{KID: "ed", Alg: AlgEdDSA, PublicKey: edPEM},
			}}}
		return c
	}
	c := good()
	if err := c.Validate(); err != nil {
		t.Fatalf("a tenant with every kind of key: %v", err)
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*Tenant)
		key, msg string
	}{
		{"no key at all", func(t *Tenant) { t.JWTSecret, t.Keys, t.JWKSURL = "", nil, "" }, "tenants[0].jwt_secret", "nothing could verify"},
		{"kid empty", func(t *Tenant) { t.Keys[0].KID = "" }, "tenants[0].keys[0].kid", "must match"},
		{"kid with a space", func(t *Tenant) { t.Keys[0].KID = "a b" }, "tenants[0].keys[0].kid", "must match"},
		{"kid twice", func(t *Tenant) { t.Keys[1].KID = t.Keys[0].KID }, "tenants[0].keys[1].kid", "keys[0] too"},
		{"alg unknown", func(t *Tenant) { t.Keys[0].Alg = "HS512" }, "tenants[0].keys[0].alg", "must be one of"},
		{"alg none", func(t *Tenant) { t.Keys[0].Alg = "none" }, "tenants[0].keys[0].alg", "must be one of"},
		{"HS256 key short", func(t *Tenant) { t.Keys[0].Secret = "1234567" }, "tenants[0].keys[0].secret", "at least 8"},
		{"HS256 key with a public key", func(t *Tenant) { t.Keys[0].PublicKey = rsaPEM }, "tenants[0].keys[0].public_key", "HS256"},
		{"RS256 key with a secret", func(t *Tenant) { t.Keys[1].Secret = "acme-secret-x" }, "tenants[0].keys[1].secret", "public_key only"},
		{"RS256 key not PEM", func(t *Tenant) { t.Keys[1].PublicKey = "MIIB..." }, "tenants[0].keys[1].public_key", "not a PEM RS256"},
		{"RS256 key of 1024 bits", func(t *Tenant) { t.Keys[1].PublicKey = weakPEM }, "tenants[0].keys[1].public_key", "at least 2048"},
		{"RS256 given an EC key", func(t *Tenant) { t.Keys[1].PublicKey = ecPEM }, "tenants[0].keys[1].public_key", "not a PEM RS256"},
		{"ES256 on P-384", func(t *Tenant) { t.Keys[2].PublicKey = p384PEM }, "tenants[0].keys[2].public_key", "only P-256"},
		{"EdDSA given an RSA key", func(t *Tenant) { t.Keys[3].PublicKey = rsaPEM }, "tenants[0].keys[3].public_key", "not a PEM EdDSA"},
		{"jwks_url relative", func(t *Tenant) { t.JWKSURL = "/jwks.json" }, "tenants[0].jwks_url", "absolute http(s)"},
		{"jwks_url ftp", func(t *Tenant) { t.JWKSURL = "ftp://idp/jwks" }, "tenants[0].jwks_url", "absolute http(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.mutate(&c.Tenants[0])
			wantKeyError(t, c.Validate(), tc.key, tc.msg)
		})
	}

	// a key's secret is never another tenant's, jwt_secret or key alike
	c = good()
	c.Tenants = append(c.Tenants, Tenant{ID: "beta", Keys: []TenantKey{{KID: "k", Alg: AlgHS256, Secret: "acme-key-2026-12"}}},
		Tenant{ID: "gamma", Keys: []TenantKey{{KID: "k", Alg: AlgHS256, Secret: "acme-secret-123"}}})
	err := c.Validate()
	wantKeyError(t, err, "tenants[1].keys[0].secret", "secret of tenants[0] too")
	wantKeyError(t, err, "tenants[2].keys[0].secret", "secret of tenants[0] too")

	// keys alone, or a jwks_url alone, are enough
	c = good()
	c.Tenants[0].JWTSecret, c.Tenants[0].Keys = "", nil
	if err := c.Validate(); err != nil {
		t.Fatalf("a tenant with a jwks_url only: %v", err)
	}

	// a demo secret as a key's secret is refused outside `imshard all`
	for _, demo := range []string{DemoSecret, DemoKeySecret} {
		c = good()
		c.Tenants[0].Keys[0].Secret = demo
		wantKeyError(t, c.ValidateServe("send"), "tenants[0].keys[0].secret", "public demo secret")
	}

	c = good()
	c.Auth.JWKSRefreshInterval = 31 * time.Minute
	wantKeyError(t, c.Validate(), "auth.jwks_refresh_interval", "between")
}

// TestTenantKeysFromEveryForm: keys, jwks_url, issuer and audience read the
// same from the main file, IMSHARD_TENANTS and a tenants_file (YAML or
// JSON); secrets of keys are masked in the rendered configuration.
func TestTenantKeysFromEveryForm(t *testing.T) {
	want := []Tenant{{ID: "acme", JWKSURL: "https://idp/jwks", Issuer: "https://idp", Audience: "imshard",
		Keys: []TenantKey{{KID: "k1", Alg: AlgHS256, Secret: "acme-key-123456"}}}}
	yamlList := "- id: acme\n  jwks_url: https://idp/jwks\n  issuer: https://idp\n  audience: imshard\n  keys:\n    - {kid: k1, alg: HS256, secret: acme-key-123456}\n"
	jsonList := `[{"id":"acme","jwks_url":"https://idp/jwks","issuer":"https://idp","audience":"imshard","keys":[{"kid":"k1","alg":"HS256","secret":"acme-key-123456"}]}]`
	for _, c := range []struct {
		name string
		opts LoadOptions
	}{
		{"main file", LoadOptions{Path: writeFile(t, "c.yaml", "tenants:\n"+indent(yamlList))}},
		{"IMSHARD_TENANTS", LoadOptions{Env: []string{"IMSHARD_TENANTS=" + jsonList}}},
		{"tenants_file yaml", LoadOptions{Env: []string{"IMSHARD_TENANTS_FILE=" + writeFile(t, "t.yaml", yamlList)}}},
		{"tenants_file json", LoadOptions{Env: []string{"IMSHARD_TENANTS_FILE=" + writeFile(t, "t.json", jsonList)}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load(c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.Tenants, want) {
				t.Fatalf("tenants = %+v, want %+v", cfg.Tenants, want)
			}
			out, err := cfg.Masked()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), "acme-key-123456") || !strings.Contains(string(out), "kid: k1") {
				t.Fatalf("masked configuration shows a key's secret, or not its kid:\n%s", out)
			}
		})
	}
	_, err := Load(LoadOptions{Path: writeFile(t, "c.yaml", "tenants:\n  - {id: acme, keys: [{kid: k1, alg: HS256, secret: acme-key-123456, secrte: x}]}\n")})
	wantKeyError(t, err, "tenants[0].keys[0].secrte", "unknown key")
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n  ") + "\n"
}
