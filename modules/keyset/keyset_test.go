package keyset

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/imshard/imshard/config"
)

// Test keys, made once: an RSA key takes a while to generate.
var (
	rsaKey, _    = rsa.GenerateKey(rand.Reader, 2048)
	rsaKey2, _   = rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _     = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, edKey, _  = ed25519.GenerateKey(rand.Reader)
	testInterval = time.Hour // no background refresh within a test unless it asks
)

func pemOf(t *testing.T, pub crypto.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// sign makes a token of tenant acme signed by key with alg, naming kid
// when not empty.
func sign(t *testing.T, alg, kid string, key any) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.GetSigningMethod(alg), jwt.MapClaims{"tid": "acme", "sub": "1"})
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// check verifies tok with the registry's current set of acme, as the
// authenticator does: the parser's algorithms, the set's key.
func check(r *Registry, tok string) (Key, error) {
	set, ok := r.Set("acme")
	if !ok {
		return Key{}, errors.New("acme not configured")
	}
	var key Key
	_, err := jwt.NewParser(jwt.WithValidMethods(config.Algorithms)).Parse(tok, func(t *jwt.Token) (any, error) {
		var err error
		key, err = set.Key(t)
		return key.Material, err
	})
	return key, err
}

func newRegistry(t *testing.T, interval time.Duration, tenants ...config.Tenant) *Registry {
	t.Helper()
	return New(Params{Log: zerolog.New(zerolog.NewTestWriter(t)), Registerer: prometheus.NewRegistry(), RefreshInterval: interval}, tenants)
}

// TestConfiguredKeys: the kid picks the key and the key its algorithm; a
// token without kid is verified by jwt_secret only; no token chooses how
// it is checked (HS256 against a public key, "none", another algorithm).
func TestConfiguredKeys(t *testing.T) {
	acme := config.Tenant{ID: "acme", JWTSecret: "acme-secret-123", Keys: []config.TenantKey{
		{KID: "hs", Alg: config.AlgHS256, Secret: "acme-hs-key-456"},
		{KID: "rs", Alg: config.AlgRS256, PublicKey: pemOf(t, rsaKey.Public())},
		{KID: "es", Alg: config.AlgES256, PublicKey: pemOf(t, ecKey.Public())},
		{KID: "ed", Alg: config.AlgEdDSA, PublicKey: pemOf(t, edKey.Public())},
	}}
	r := newRegistry(t, testInterval, acme)
	rsPEM := []byte(acme.Keys[1].PublicKey)
	for _, c := range []struct {
		name, tok string
		kid       string
		want      error
	}{
		{"jwt_secret, no kid", sign(t, "HS256", "", []byte("acme-secret-123")), "", nil},
		{"HS256 key by kid", sign(t, "HS256", "hs", []byte("acme-hs-key-456")), "hs", nil},
		{"RS256 key by kid", sign(t, "RS256", "rs", rsaKey), "rs", nil},
		{"ES256 key by kid", sign(t, "ES256", "es", ecKey), "es", nil},
		{"EdDSA key by kid", sign(t, "EdDSA", "ed", edKey), "ed", nil},
		{"key's secret without its kid", sign(t, "HS256", "", []byte("acme-hs-key-456")), "", jwt.ErrTokenSignatureInvalid},
		{"jwt_secret under a kid", sign(t, "HS256", "hs", []byte("acme-secret-123")), "", jwt.ErrTokenSignatureInvalid},
		{"unknown kid", sign(t, "HS256", "nope", []byte("acme-hs-key-456")), "", ErrUnknownKey},
		{"RS256 token without kid", sign(t, "RS256", "", rsaKey), "", ErrAlgorithm},
		{"HS256 signed with the RSA public key's PEM", sign(t, "HS256", "rs", rsPEM), "", ErrAlgorithm},
		{"RS256 token naming the HS256 key", sign(t, "RS256", "hs", rsaKey), "", ErrAlgorithm},
		{"ES256 token naming the RS256 key", sign(t, "ES256", "rs", ecKey), "", ErrAlgorithm},
		{"RS256 key of another holder", sign(t, "RS256", "rs", rsaKey2), "", jwt.ErrTokenSignatureInvalid},
		{"alg none", sign(t, "none", "", jwt.UnsafeAllowNoneSignatureType), "", jwt.ErrTokenSignatureInvalid},
		{"HS512 with the secret", sign(t, "HS512", "", []byte("acme-secret-123")), "", jwt.ErrTokenSignatureInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := check(r, c.tok)
			if c.want == nil {
				if err != nil || key.KID != c.kid {
					t.Fatalf("verify = kid %q, %v; want kid %q", key.KID, err, c.kid)
				}
				if set, _ := r.Set("acme"); !set.Holds(key) {
					t.Fatal("the set does not hold the key that verified")
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("verify = %v, want %v", err, c.want)
			}
		})
	}

	// a kid that is no string, or empty, is refused as such
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"tid": "acme"})
	tok.Header["kid"] = 7
	s, _ := tok.SignedString([]byte("acme-hs-key-456"))
	if _, err := check(r, s); !errors.Is(err, ErrBadKID) {
		t.Fatalf("numeric kid: %v, want ErrBadKID", err)
	}

	// a reload dropping a key: its tokens are refused, Holds turns false;
	// one changing jwt_secret: Holds turns false for the old one
	old, _ := check(r, sign(t, "RS256", "rs", rsaKey))
	kidless, _ := check(r, sign(t, "HS256", "", []byte("acme-secret-123")))
	next := acme
	next.JWTSecret = "acme-secret-789"
	next.Keys = acme.Keys[:1]
	r.Apply([]config.Tenant{next})
	set, _ := r.Set("acme")
	if set.Holds(old) || set.Holds(kidless) {
		t.Fatal("the set still holds a removed key or the replaced jwt_secret")
	}
	if _, err := check(r, sign(t, "RS256", "rs", rsaKey)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("token of a removed key: %v, want ErrUnknownKey", err)
	}
	// a tenant with keys only refuses tokens without kid
	next.JWTSecret = ""
	r.Apply([]config.Tenant{next})
	if _, err := check(r, sign(t, "HS256", "", []byte("acme-secret-123"))); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("token without kid, tenant without jwt_secret: %v, want ErrUnknownKey", err)
	}
}

// idp is a tenant's identity provider: it publishes the public halves of
// its keys as a JWKS, counts the fetches, and fails them when told to.
type idp struct {
	mu      sync.Mutex
	keys    map[string]any // kid → key to publish (public, or a secret)
	fail    bool
	fetches atomic.Int64
	srv     *httptest.Server
}

func newIDP(t *testing.T) *idp {
	i := &idp{keys: map[string]any{}}
	i.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		i.fetches.Add(1)
		i.mu.Lock()
		defer i.mu.Unlock()
		if i.fail {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		var set jwkset.JWKSMarshal
		for kid, k := range i.keys {
			jwk, err := jwkset.NewJWKFromKey(k, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid},
				Marshal: jwkset.JWKMarshalOptions{Private: true}})
			if err != nil {
				t.Error(err)
				return
			}
			set.Keys = append(set.Keys, jwk.Marshal())
		}
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(i.srv.Close)
	return i
}

func (i *idp) publish(kid string, key any) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.keys[kid] = key
}

func (i *idp) drop(kid string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	delete(i.keys, kid)
}

func (i *idp) setFail(fail bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.fail = fail
}

// TestJWKS runs a tenant's JWKS against a provider: keys by kid, each used
// only with the algorithm of its type; a new kid fetched once; a flood of
// unknown kids costing at most that one fetch per interval; a failed fetch
// keeping the last good keys; a dropped kid reported; and nothing left
// running after Close.
func TestJWKS(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := newIDP(t)
	defer p.srv.Close() // before the leak check
	p.publish("rs1", rsaKey.Public())
	p.publish("ed1", edKey.Public())
	p.publish("sym", []byte("a-symmetric-jwk-secret"))
	acme := config.Tenant{ID: "acme", JWTSecret: "acme-secret-123", JWKSURL: p.srv.URL}
	r := newRegistry(t, testInterval, acme)
	if _, err := check(r, sign(t, "RS256", "rs1", rsaKey)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("before Start no JWKS is fetched: %v", err)
	}
	removed := make(chan struct{}, 10)
	r.OnKeysRemoved(func() { removed <- struct{}{} })
	r.Start([]config.Tenant{acme})
	defer r.Close()
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("Start fetched %d times, want 1", n)
	}
	if v := testutil.ToFloat64(r.m.lastSuccess.WithLabelValues("acme")); time.Since(time.Unix(int64(v), 0)) > time.Minute {
		t.Fatalf("imshard_jwks_last_success_timestamp_seconds = %v after a good fetch", v)
	}
	if v := testutil.ToFloat64(r.m.keys.WithLabelValues("acme")); v != 3 {
		t.Fatalf("imshard_jwks_keys = %v, want 3", v)
	}

	for _, c := range []struct {
		name, tok string
		want      error
	}{
		{"RS256 of the JWKS", sign(t, "RS256", "rs1", rsaKey), nil},
		{"EdDSA of the JWKS", sign(t, "EdDSA", "ed1", edKey), nil},
		{"jwt_secret beside the JWKS", sign(t, "HS256", "", []byte("acme-secret-123")), nil},
		{"HS256 against the RSA key's PEM", sign(t, "HS256", "rs1", []byte(pemOf(t, rsaKey.Public()))), ErrAlgorithm},
		{"ES256 naming the RSA key", sign(t, "ES256", "rs1", ecKey), ErrAlgorithm},
		{"HS256 with a symmetric JWK", sign(t, "HS256", "sym", []byte("a-symmetric-jwk-secret")), ErrAlgorithm},
		{"RS256 of another holder", sign(t, "RS256", "rs1", rsaKey2), jwt.ErrTokenSignatureInvalid},
	} {
		if _, err := check(r, c.tok); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: verify = %v, want %v", c.name, err, c.want)
		}
	}
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("verifying known kids fetched: %d fetches, want 1", n)
	}

	// the provider rotates: a token of the new kid fetches once and passes
	p.publish("rs2", rsaKey2.Public())
	if _, err := check(r, sign(t, "RS256", "rs2", rsaKey2)); err != nil {
		t.Fatalf("token of a newly published kid: %v", err)
	}
	if n := p.fetches.Load(); n != 2 {
		t.Fatalf("a new kid cost %d fetches in all, want 2", n)
	}
	// a flood of unknown kids costs nothing more within the interval
	for i := range 200 {
		if _, err := check(r, sign(t, "RS256", "flood-"+string(rune('a'+i%26)), rsaKey)); !errors.Is(err, ErrUnknownKey) {
			t.Fatalf("unknown kid: %v, want ErrUnknownKey", err)
		}
	}
	if n := p.fetches.Load(); n != 2 {
		t.Fatalf("a flood of unknown kids cost %d fetches in all, want still 2", n)
	}
	if v := testutil.ToFloat64(r.m.fetches.WithLabelValues("acme", "ok")); v != 2 {
		t.Fatalf("imshard_jwks_fetches_total{result=ok} = %v, want 2", v)
	}
}

// TestJWKSFailedFetchKeepsKeys: a provider that fails keeps the keys of the
// last good fetch in use, and the failure is counted; a fetch that drops a
// kid ends its tokens and reports the removal.
func TestJWKSFailedFetchKeepsKeys(t *testing.T) {
	p := newIDP(t)
	p.publish("rs1", rsaKey.Public())
	p.publish("rs2", rsaKey2.Public())
	acme := config.Tenant{ID: "acme", JWKSURL: p.srv.URL}
	r := newRegistry(t, 20*time.Millisecond, acme)
	removed := make(chan struct{}, 10)
	r.OnKeysRemoved(func() { removed <- struct{}{} })
	r.Start([]config.Tenant{acme})
	defer r.Close()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	p.setFail(true)
	waitFor("a failed background fetch", func() bool { return testutil.ToFloat64(r.m.fetches.WithLabelValues("acme", "error")) >= 2 })
	good := testutil.ToFloat64(r.m.lastSuccess.WithLabelValues("acme"))
	if _, err := check(r, sign(t, "RS256", "rs1", rsaKey)); err != nil {
		t.Fatalf("while the provider fails, a key of the last good fetch: %v", err)
	}
	if v := testutil.ToFloat64(r.m.lastSuccess.WithLabelValues("acme")); v != good {
		t.Fatalf("last success moved from %v to %v on failed fetches", good, v)
	}
	select {
	case <-removed:
		t.Fatal("a failed fetch reported a removed key")
	default:
	}

	p.drop("rs2")
	p.setFail(false)
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		t.Fatal("a fetch dropping rs2 was not reported")
	}
	if _, err := check(r, sign(t, "RS256", "rs2", rsaKey2)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("token of the dropped kid: %v, want ErrUnknownKey", err)
	}
	if _, err := check(r, sign(t, "RS256", "rs1", rsaKey)); err != nil {
		t.Fatalf("token of the kept kid: %v", err)
	}

	// a reload removing the jwks_url stops its fetches and drops its keys
	r.Apply([]config.Tenant{{ID: "acme", JWTSecret: "acme-secret-123"}})
	if _, err := check(r, sign(t, "RS256", "rs1", rsaKey)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("token of the JWKS after the reload removed it: %v, want ErrUnknownKey", err)
	}
	n := p.fetches.Load()
	time.Sleep(100 * time.Millisecond)
	if m := p.fetches.Load(); m != n {
		t.Fatalf("%d fetches after the reload removed the jwks_url", m-n)
	}
}

func TestKeyEqual(t *testing.T) {
	a := Key{KID: "k", Alg: config.AlgHS256, Material: []byte("secret-1")}
	for _, c := range []struct {
		b    Key
		want bool
	}{
		{Key{KID: "k", Alg: config.AlgHS256, Material: []byte("secret-1")}, true},
		{Key{KID: "k", Alg: config.AlgHS256, Material: []byte("secret-2")}, false},
		{Key{KID: "j", Alg: config.AlgHS256, Material: []byte("secret-1")}, false},
		{Key{KID: "k", Alg: config.AlgRS256, Material: rsaKey.Public()}, false},
	} {
		if got := a.Equal(c.b); got != c.want {
			t.Errorf("Equal(%+v) = %v, want %v", c.b, got, c.want)
		}
	}
	r := Key{KID: "k", Alg: config.AlgRS256, Material: rsaKey.Public()}
	if !r.Equal(Key{KID: "k", Alg: config.AlgRS256, Material: &rsaKey.PublicKey}) || r.Equal(Key{KID: "k", Alg: config.AlgRS256, Material: rsaKey2.Public()}) {
		t.Error("public keys compare by value")
	}
}
