package httpapi

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func testSecrets(tenant string) ([]byte, bool) {
	switch tenant {
	case "acme":
		return []byte("acme-secret-123"), true
	case "other":
		return []byte("other-secret-456"), true
	}
	return nil, false
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
	auth := NewAuthenticator(testSecrets)
	exp := jwt.NewNumericDate(time.Now().Add(time.Hour))
	claims := func(tid, sub, role string, exp *jwt.NumericDate) Claims {
		return Claims{Tenant: tid, Role: role, RegisteredClaims: jwt.RegisteredClaims{Subject: sub, ExpiresAt: exp}}
	}
	good, _ := Sign([]byte("acme-secret-123"), "acme", 42, RoleService, time.Hour)
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("acme", "42", "", exp))
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"valid service token", good, true},
		{"expired", sign(t, jwt.SigningMethodHS256, []byte("acme-secret-123"), claims("acme", "42", "", jwt.NewNumericDate(time.Now().Add(-time.Hour)))), false},
		{"no exp", sign(t, jwt.SigningMethodHS256, []byte("acme-secret-123"), claims("acme", "42", "", nil)), false},
		{"forged with another secret", sign(t, jwt.SigningMethodHS256, []byte("wrong-secret"), claims("acme", "42", "", exp)), false},
		{"signed by another tenant's secret", sign(t, jwt.SigningMethodHS256, []byte("other-secret-456"), claims("acme", "42", "", exp)), false},
		{"unknown tenant", sign(t, jwt.SigningMethodHS256, []byte("acme-secret-123"), claims("nobody", "42", "", exp)), false},
		{"alg none", none, false},
		{"HS512 not allowed", sign(t, jwt.SigningMethodHS512, []byte("acme-secret-123"), claims("acme", "42", "", exp)), false},
		{"non-numeric sub", sign(t, jwt.SigningMethodHS256, []byte("acme-secret-123"), claims("acme", "bob", "", exp)), false},
		{"negative sub", sign(t, jwt.SigningMethodHS256, []byte("acme-secret-123"), claims("acme", "-1", "", exp)), false},
		{"unknown role", sign(t, jwt.SigningMethodHS256, []byte("acme-secret-123"), claims("acme", "42", "root", exp)), false},
		{"garbage", "a.b.c", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := auth.Verify(tt.token)
			if tt.ok {
				if err != nil || p.Tenant != "acme" || p.UserID != 42 || p.Role != RoleService {
					t.Fatalf("Verify = %+v, %v", p, err)
				}
				return
			}
			code, _ := Classify(err)
			if err == nil || code != CodeUnauthenticated {
				t.Fatalf("Verify = %+v, %v; want unauthenticated", p, err)
			}
		})
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
	auth := NewAuthenticator(testSecrets)
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := auth.Verify(tok)
		if err == nil && (p.Tenant == "" || p.UserID <= 0) {
			t.Fatalf("accepted %q as %+v", tok, p)
		}
	})
}
