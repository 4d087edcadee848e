package httpapi

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/keyset"
)

// testTenants are acme and other, each with a jwt_secret only.
var testTenants = []config.Tenant{{ID: "acme", JWTSecret: "acme-secret-123"}, {ID: "other", JWTSecret: "other-secret-456"}}

// testKeys is the key set registry of tenants, with metrics of its own.
func testKeys(tenants ...config.Tenant) *keyset.Registry {
	if len(tenants) == 0 {
		tenants = testTenants
	}
	return keyset.New(keyset.Params{Log: zerolog.Nop(), Registerer: prometheus.NewRegistry(), RefreshInterval: time.Minute}, tenants)
}

func sign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.Claims) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestVerify(t *testing.T) {
	auth := NewAuthenticator(testKeys(), 24*time.Hour)
	now := time.Now()
	auth.now = func() time.Time { return now }
	key := []byte("acme-secret-123")
	exp := now.Add(time.Hour).Unix()
	// claims are the claims of a good user token with the given changes
	// (a nil value removes the claim)
	claims := func(changes ...any) jwt.MapClaims {
		c := jwt.MapClaims{"tid": "acme", "sub": "42", "role": "service", "exp": exp, "iat": now.Unix()}
		for i := 0; i < len(changes); i += 2 {
			if changes[i+1] == nil {
				delete(c, changes[i].(string))
			} else {
				c[changes[i].(string)] = changes[i+1]
			}
		}
		return c
	}
	hs256 := func(changes ...any) string { return sign(t, jwt.SigningMethodHS256, key, claims(changes...)) }
	good, _ := Sign(key, "acme", 42, RoleService, time.Hour)
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims())
	day := 24 * time.Hour
	tests := []struct {
		name  string
		token string
		uid   int64 // 0: refused
	}{
		{"valid service token", good, 42},
		{"valid, claims written by hand", hs256(), 42},
		{"no iat: exp - now within the limit", hs256("iat", nil), 42},
		{"lifetime exactly the limit", hs256("iat", now.Unix(), "exp", now.Add(day).Unix()), 42},
		{"lifetime over the limit by the leeway", hs256("iat", now.Unix(), "exp", now.Add(day+Leeway+time.Second).Unix()), 0},
		{"old token, lifetime the limit", hs256("iat", now.Add(-day+time.Minute).Unix(), "exp", now.Add(time.Minute).Unix()), 42},
		{"no iat, exp a year away", hs256("iat", nil, "exp", now.Add(365*day).Unix()), 0},
		{"exp in the year 9999", hs256("exp", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC).Unix()), 0},
		{"exp with a fraction", hs256("exp", float64(exp)+0.5), 42},
		{"exp as a string", hs256("exp", strconv.FormatInt(exp, 10)), 0},
		{"iat as a string", hs256("iat", strconv.FormatInt(now.Unix(), 10)), 0},
		{"exp null", hs256("exp", json.RawMessage("null")), 0},
		{"iat in the future, exp within the limit of it", hs256("iat", now.Add(10*day).Unix(), "exp", now.Add(10*day+time.Hour).Unix()), 0},
		{"expired", hs256("exp", now.Add(-time.Hour).Unix(), "iat", now.Add(-2*time.Hour).Unix()), 0},
		{"expired within the leeway", hs256("exp", now.Add(-Leeway/2).Unix(), "iat", now.Add(-time.Hour).Unix()), 42},
		{"no exp", hs256("exp", nil), 0},
		{"not yet valid", hs256("nbf", now.Add(time.Hour).Unix()), 0},
		{"forged with another secret", sign(t, jwt.SigningMethodHS256, []byte("wrong-secret"), claims()), 0},
		{"signed by another tenant's secret", sign(t, jwt.SigningMethodHS256, []byte("other-secret-456"), claims()), 0},
		{"unknown tenant", hs256("tid", "nobody"), 0},
		{"no tenant", hs256("tid", nil), 0},
		{"alg none", none, 0},
		{"HS512 not allowed", sign(t, jwt.SigningMethodHS512, key, claims()), 0},
		{"non-numeric sub", hs256("sub", "bob"), 0},
		{"negative sub", hs256("sub", "-1"), 0},
		{"zero sub", hs256("sub", "0"), 0},
		{"sub with a plus", hs256("sub", "+42"), 0},
		{"sub with a leading zero", hs256("sub", "042"), 0},
		{"sub with a space", hs256("sub", " 42"), 0},
		{"sub as a number", hs256("sub", 42), 0},
		{"sub of 19 digits", hs256("sub", "9223372036854775807"), 9223372036854775807},
		{"sub past int64", hs256("sub", "9223372036854775808"), 0},
		{"sub of 20 digits", hs256("sub", "10000000000000000000"), 0},
		{"unknown role", hs256("role", "root"), 0},
		{"garbage", "a.b.c", 0},
		{"empty", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// the second time answers from the token cache when the first accepted
			for range 2 {
				p, err := auth.Verify(tt.token)
				if tt.uid != 0 {
					if err != nil || p.Tenant != "acme" || p.UserID != tt.uid || p.Role != RoleService {
						t.Fatalf("Verify = %+v, %v", p, err)
					}
					continue
				}
				code, _ := Classify(err)
				if err == nil || code != CodeUnauthenticated {
					t.Fatalf("Verify = %+v, %v; want unauthenticated", p, err)
				}
			}
		})
	}
}

// TestVerifyCache: a cached token is still refused once expired, when its
// tenant's secret changes or goes, and a token refused (here for a lifetime
// past max_token_ttl) is never kept.
func TestVerifyCache(t *testing.T) {
	acme := config.Tenant{ID: "acme", JWTSecret: "acme-secret-123"}
	keys := testKeys(acme)
	auth := NewAuthenticator(keys, time.Hour)
	now := time.Now()
	auth.now = func() time.Time { return now }
	tok, err := Sign([]byte(acme.JWTSecret), "acme", 42, RoleUser, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(step string, ok bool) {
		t.Helper()
		p, err := auth.Verify(tok)
		if ok && (err != nil || p.UserID != 42 || p.Tenant != "acme") {
			t.Fatalf("%s: Verify = %+v, %v; want user 42", step, p, err)
		}
		if code, _ := Classify(err); !ok && (err == nil || code != CodeUnauthenticated) {
			t.Fatalf("%s: Verify = %+v, %v; want unauthenticated", step, p, err)
		}
	}
	expect("first use", true)
	if len(auth.cache.m) != 1 {
		t.Fatalf("cache holds %d tokens after one accepted, want 1", len(auth.cache.m))
	}
	expect("cached", true)

	keys.Apply([]config.Tenant{{ID: "acme", JWTSecret: "rotated-secret-1"}})
	expect("secret rotated", false)
	keys.Apply(nil)
	expect("tenant removed", false)
	keys.Apply([]config.Tenant{acme})
	expect("secret back", true)
	keys.Apply([]config.Tenant{{ID: "acme", JWTSecret: acme.JWTSecret, Issuer: "https://idp.example"}})
	expect("issuer now required", false)
	keys.Apply([]config.Tenant{acme})

	exp := now.Truncate(time.Second).Add(10 * time.Minute)
	now = exp.Add(Leeway - time.Millisecond)
	expect("within the leeway after exp", true)
	now = exp.Add(Leeway)
	expect("expired", false)

	// refused ones are not kept: a lifetime over max_token_ttl stays refused
	now = time.Now()
	long, err := Sign([]byte(acme.JWTSecret), "acme", 42, RoleUser, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := auth.Verify(long); err == nil {
			t.Fatal("a token living past max_token_ttl was accepted")
		}
	}
	if _, ok := auth.cache.m[long]; ok {
		t.Fatal("a refused token was cached")
	}

	// the cache stays bounded
	for i := range maxCachedTokens + 10 {
		auth.cache.put(strconv.Itoa(i), verified{until: now.Add(time.Hour)})
	}
	if n := len(auth.cache.m); n != maxCachedTokens {
		t.Fatalf("cache holds %d tokens, want at most %d", n, maxCachedTokens)
	}
}

func TestToken(t *testing.T) {
	r := httptest.NewRequest("GET", "/x?access_token=q", nil)
	if Token(r, false) != "" || Token(r, true) != "q" {
		t.Fatal("query token only where allowed")
	}
	r.Header.Set("Authorization", "Bearer h")
	if Token(r, true) != "h" {
		t.Fatal("header wins")
	}
	r.Header.Set("Authorization", "Basic h")
	if Token(r, true) != "" {
		t.Fatal("non-bearer scheme must not authenticate")
	}
	// the scheme is case-insensitive; anything else about the header is not
	for h, want := range map[string]string{
		"bearer h": "h", "BEARER h": "h", "BeArEr h": "h", "Bearer  h ": "h",
		"Bearerh": "", "Bearer": "", "Bear h": "", "Bearer\th": "",
	} {
		r.Header.Set("Authorization", h)
		if got := Token(r, false); got != want {
			t.Errorf("Authorization %q: token %q, want %q", h, got, want)
		}
	}
}

func TestClassifyAndWriteError(t *testing.T) {
	code, msg := Classify(errors.New("db exploded: password=x"))
	if code != CodeInternal || strings.Contains(msg, "password") {
		t.Fatalf("internal errors must not leak: %s %s", code, msg)
	}
	for code, status := range codeStatus {
		if Status(code) != status {
			t.Errorf("Status(%s)", code)
		}
	}
	w := httptest.NewRecorder()
	WriteError(w, httptest.NewRequest("GET", "/", nil), zerologNop(), Errorf(CodeTooLarge, "body too large"))
	if w.Code != 413 || !strings.Contains(w.Body.String(), `"code":"too_large"`) {
		t.Fatalf("envelope %d %s", w.Code, w.Body.String())
	}
}

func FuzzVerify(f *testing.F) {
	good, _ := Sign([]byte("acme-secret-123"), "acme", 42, "", time.Hour)
	for _, s := range []string{good, "a.b.c", "", "eyJhbGciOiJub25lIn0.e30."} {
		f.Add(s)
	}
	f.Add(`eyJhbGciOiJIUzI1NiJ9.eyJ0aWQiOiJhY21lIiwic3ViIjoiNDIiLCJleHAiOiIxIn0.x`)
	auth := NewAuthenticator(testKeys(), time.Hour)
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := auth.Verify(tok)
		// a second time (from the token cache when accepted) answers alike
		if p2, err2 := auth.Verify(tok); p2 != p || (err == nil) != (err2 == nil) {
			t.Fatalf("%q: %+v, %v then %+v, %v", tok, p, err, p2, err2)
		}
		if err != nil {
			if code, _ := Classify(err); code != CodeUnauthenticated {
				t.Fatalf("%q: %v", tok, err)
			}
			return
		}
		if p.Tenant == "" || p.UserID <= 0 || !subPattern.MatchString(strconv.FormatInt(p.UserID, 10)) {
			t.Fatalf("accepted %q as %+v", tok, p)
		}
		// what was accepted was signed by the tenant's key, expires, and
		// lives at most the limit
		var c Claims
		if _, _, err := jwt.NewParser().ParseUnverified(tok, &c); err != nil || c.ExpiresAt == nil ||
			time.Until(c.ExpiresAt.Time) > time.Hour+2*Leeway {
			t.Fatalf("accepted %q: %+v %v", tok, c, err)
		}
	})
}

// FuzzVerifyClaims signs whatever claims the fuzzer writes with the
// tenant's key: what Verify accepts has a numeric exp, not past, within the
// lifetime limit of a numeric iat not in the future (or of now), a
// canonical sub and a known role.
func FuzzVerifyClaims(f *testing.F) {
	now := time.Now().Unix()
	for _, c := range []string{
		fmt.Sprintf(`{"tid":"acme","sub":"42","iat":%d,"exp":%d}`, now, now+600),
		fmt.Sprintf(`{"tid":"acme","sub":"42","exp":%d,"role":"admin"}`, now+60),
		fmt.Sprintf(`{"tid":"acme","sub":"042","exp":"%d"}`, now+60),
		fmt.Sprintf(`{"tid":"acme","sub":"+42","exp":%d.5,"nbf":%d}`, now+60, now),
		`{"tid":"acme","sub":"9223372036854775807","exp":253402300800}`,
	} {
		f.Add([]byte(c))
	}
	key := []byte("acme-secret-123")
	auth := NewAuthenticator(testKeys(), time.Hour)
	f.Fuzz(func(t *testing.T, claims []byte) {
		b64 := base64.RawURLEncoding.EncodeToString
		unsigned := b64([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + b64(claims)
		sig, err := jwt.SigningMethodHS256.Sign(unsigned, key)
		if err != nil {
			t.Fatal(err)
		}
		p, err := auth.Verify(unsigned + "." + b64(sig))
		if err != nil {
			if code, _ := Classify(err); code != CodeUnauthenticated {
				t.Fatalf("%s: %v", claims, err)
			}
			return
		}
		var c struct {
			Sub  string          `json:"sub"`
			Exp  json.RawMessage `json:"exp"`
			Iat  json.RawMessage `json:"iat"`
			Role string          `json:"role"`
		}
		if err := json.Unmarshal(claims, &c); err != nil {
			t.Fatalf("%s accepted: %v", claims, err)
		}
		exp, err := strconv.ParseFloat(string(c.Exp), 64)
		if err != nil || c.Exp[0] == '"' {
			t.Fatalf("%s accepted: exp %s", claims, c.Exp)
		}
		from := float64(time.Now().Unix())
		if len(c.Iat) > 0 && string(c.Iat) != "null" {
			iat, err := strconv.ParseFloat(string(c.Iat), 64)
			if err != nil || iat > from+Leeway.Seconds()+1 {
				t.Fatalf("%s accepted: iat %s", claims, c.Iat)
			}
			from = iat
		}
		if exp-from > (time.Hour+Leeway).Seconds()+1 || exp < float64(time.Now().Unix())-Leeway.Seconds()-1 {
			t.Fatalf("%s accepted: exp %s", claims, c.Exp)
		}
		if !subPattern.MatchString(c.Sub) || strconv.FormatInt(p.UserID, 10) != c.Sub || p.Role != c.Role {
			t.Fatalf("%s accepted as %+v", claims, p)
		}
	})
}

// BenchmarkVerify: a token's first use parses it and checks the HMAC; a
// reused one (a client's every later request) is a cache lookup.
func BenchmarkVerify(b *testing.B) {
	tok, err := Sign([]byte("acme-secret-123"), "acme", 42, RoleUser, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	auth := NewAuthenticator(testKeys(), 24*time.Hour)
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := auth.verify(tok, time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := auth.Verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestVerifyRefusesRepeatedClaims signs, with the tenant's own secret, tokens
// whose header or payload repeats a key: each is refused with 401
// unauthenticated naming the repeated key, like a body repeating a key,
// whichever of the two values the JSON decoder would have kept.
func TestVerifyRefusesRepeatedClaims(t *testing.T) {
	auth := NewAuthenticator(testKeys(), 24*time.Hour)
	now := time.Now()
	auth.now = func() time.Time { return now }
	exp := now.Add(time.Hour).Unix()
	raw := func(header, payload string) string {
		enc := base64.RawURLEncoding
		signing := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload))
		sig, err := jwt.SigningMethodHS256.Sign(signing, []byte("acme-secret-123"))
		if err != nil {
			t.Fatal(err)
		}
		return signing + "." + enc.EncodeToString(sig)
	}
	const header = `{"alg":"HS256","typ":"JWT"}`
	if _, err := auth.Verify(raw(header, fmt.Sprintf(`{"tid":"acme","sub":"42","exp":%d}`, exp))); err != nil {
		t.Fatalf("the token written by hand without repeats: %v", err)
	}
	tests := []struct{ name, header, payload, key string }{
		{"two sub", header, fmt.Sprintf(`{"tid":"acme","sub":"1","sub":"42","exp":%d}`, exp), "sub"},
		{"two tid", header, fmt.Sprintf(`{"tid":"other","tid":"acme","sub":"42","exp":%d}`, exp), "tid"},
		{"two role", header, fmt.Sprintf(`{"tid":"acme","sub":"42","role":"admin","role":"","exp":%d}`, exp), "role"},
		{"two exp", header, fmt.Sprintf(`{"tid":"acme","sub":"42","exp":%d,"exp":%d}`, now.Add(-time.Hour).Unix(), exp), "exp"},
		{"a key escaped", header, fmt.Sprintf(`{"tid":"acme","sub":"1","s\u0075b":"42","exp":%d}`, exp), "sub"},
		{"two alg", `{"alg":"none","alg":"HS256"}`, fmt.Sprintf(`{"tid":"acme","sub":"42","exp":%d}`, exp), "alg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := auth.Verify(raw(tt.header, tt.payload))
			code, _ := Classify(err)
			if err == nil || code != CodeUnauthenticated || !strings.Contains(err.Error(), fmt.Sprintf("repeats the key %q", tt.key)) {
				t.Fatalf("Verify = %+v, %v; want unauthenticated naming the repeated %q", p, err, tt.key)
			}
		})
	}
}

// refusals reads imshard_auth_refused_total by "tenant/reason".
func refusals(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "imshard_auth_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["tenant"]+"/"+l["reason"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestVerifyKeySetsAndRefusals: a token's kid picks the tenant's key and
// becomes the principal's KeyID; a tenant's issuer and audience are
// required when set; and every refusal is counted by tenant and reason,
// a tid not configured as "unknown".
func TestVerifyKeySetsAndRefusals(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(rsaKey.Public())
	acme := config.Tenant{ID: "acme", JWTSecret: "acme-secret-123", Issuer: "https://idp.acme", Audience: "imshard",
		Keys: []config.TenantKey{
			{KID: "2026-12", Alg: config.AlgHS256, Secret: "acme-secret-2026-12"},
			{KID: "idp-1", Alg: config.AlgRS256, PublicKey: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))},
		}}
	reg := prometheus.NewRegistry()
	keys := keyset.New(keyset.Params{Log: zerolog.Nop(), Registerer: reg, RefreshInterval: time.Minute}, []config.Tenant{acme})
	auth := NewAuthenticator(keys, time.Hour)
	tok := func(s Signer) string {
		t.Helper()
		if s.Issuer == "-" {
			s.Issuer = ""
		} else if s.Issuer == "" {
			s.Issuer = acme.Issuer
		}
		if s.Audience == "-" {
			s.Audience = ""
		} else if s.Audience == "" {
			s.Audience = acme.Audience
		}
		tk, err := SignWith(s, "acme", 42, RoleUser, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	hs := Signer{KID: "2026-12", Alg: config.AlgHS256, Key: []byte("acme-secret-2026-12")}
	for _, c := range []struct {
		name, token string
		kid         string // the principal's KeyID when accepted
		reason      string // the refusal counted, "" when accepted
	}{
		{"jwt_secret, no kid", tok(Signer{Alg: config.AlgHS256, Key: []byte(acme.JWTSecret)}), "", ""},
		{"HS256 key by kid", tok(hs), "2026-12", ""},
		{"RS256 key by kid", tok(Signer{KID: "idp-1", Alg: config.AlgRS256, Key: rsaKey}), "idp-1", ""},
		{"kid unknown", tok(Signer{KID: "2027-01", Alg: config.AlgHS256, Key: []byte("acme-secret-2026-12")}), "", RefusedUnknownKey},
		{"HS256 naming the RS256 key", tok(Signer{KID: "idp-1", Alg: config.AlgHS256, Key: der}), "", RefusedAlgorithm},
		{"wrong secret", tok(Signer{KID: "2026-12", Alg: config.AlgHS256, Key: []byte("acme-secret-guess")}), "", RefusedSignature},
		{"no iss", tok(Signer{KID: hs.KID, Alg: hs.Alg, Key: hs.Key, Issuer: "-"}), "", RefusedIssuer},
		{"another iss", tok(Signer{KID: hs.KID, Alg: hs.Alg, Key: hs.Key, Issuer: "https://evil"}), "", RefusedIssuer},
		{"no aud", tok(Signer{KID: hs.KID, Alg: hs.Alg, Key: hs.Key, Audience: "-"}), "", RefusedAudience},
		{"another aud", tok(Signer{KID: hs.KID, Alg: hs.Alg, Key: hs.Key, Audience: "other"}), "", RefusedAudience},
		{"garbage", "a.b.c", "", RefusedMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := refusals(t, reg)["acme/"+c.reason]
			if c.reason == RefusedMalformed {
				before = refusals(t, reg)["unknown/"+c.reason]
			}
			p, err := auth.Verify(c.token)
			if c.reason == "" {
				if err != nil || p.KeyID != c.kid || p.UserID != 42 {
					t.Fatalf("Verify = %+v, %v; want user 42 by kid %q", p, err, c.kid)
				}
				return
			}
			if code, _ := Classify(err); code != CodeUnauthenticated {
				t.Fatalf("Verify = %+v, %v; want unauthenticated", p, err)
			}
			tenant := "acme"
			if c.reason == RefusedMalformed {
				tenant = "unknown"
			}
			if got := refusals(t, reg)[tenant+"/"+c.reason]; got != before+1 {
				t.Fatalf("imshard_auth_refused_total{tenant=%q,reason=%q} = %v, want %v", tenant, c.reason, got, before+1)
			}
		})
	}
	other, _ := Sign([]byte("x-secret-123"), "nobody", 1, RoleUser, time.Minute)
	if _, err := auth.Verify(other); err == nil {
		t.Fatal("a token of a tenant not configured was accepted")
	}
	if got := refusals(t, reg)["unknown/"+RefusedUnknownTenant]; got != 1 {
		t.Fatalf("refusal of a tid not configured counted as %v under unknown/unknown_tenant, want 1", got)
	}
	if _, err := auth.Authenticate(httptest.NewRequest("GET", "/", nil), false); err == nil {
		t.Fatal("a request without credentials was authenticated")
	}
	if got := refusals(t, reg)["unknown/"+RefusedMissing]; got != 1 {
		t.Fatalf("missing credentials counted %v times, want 1", got)
	}
}
