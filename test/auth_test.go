package test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// The Authorization scheme is matched in any letter case; a token's claims
// are strict: exp a JSON number, a lifetime within auth.max_token_ttl, sub a
// canonical positive decimal.
func TestAuthSchemeCaseAndStrictClaims(t *testing.T) {
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.Auth.MaxTokenTTL = time.Hour }})
	e.group("room", 1, "active")
	e.member("room", 100, "member", time.Time{})
	now := time.Now()
	token := func(claims jwt.MapClaims) string {
		c := jwt.MapClaims{"tid": e.Tenant, "sub": "100", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		for k, v := range claims {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(e.Secret)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	n := 0
	send := func(header string) int {
		n++
		raw, _ := json.Marshal(sendBody(string(rune('a'+n)), "hi"))
		req, err := http.NewRequest("POST", e.BaseURL+"/v1/topics/room/messages", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name   string
		header string
		status int
	}{
		{"Bearer", "Bearer " + token(nil), 201},
		{"bearer", "bearer " + token(nil), 201},
		{"BEARER", "BEARER " + token(nil), 201},
		{"Basic", "Basic " + token(nil), 401},
		{"exp as a string", "Bearer " + token(jwt.MapClaims{"exp": "9999999999"}), 401},
		{"exp in the year 9999", "Bearer " + token(jwt.MapClaims{"exp": time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC).Unix()}), 401},
		{"lifetime over the limit", "Bearer " + token(jwt.MapClaims{"exp": now.Add(2 * time.Hour).Unix()}), 401},
		{"no iat, exp over the limit", "Bearer " + token(jwt.MapClaims{"iat": nil, "exp": now.Add(2 * time.Hour).Unix()}), 401},
		{"no iat, exp within the limit", "Bearer " + token(jwt.MapClaims{"iat": nil}), 201},
		{"sub +100", "Bearer " + token(jwt.MapClaims{"sub": "+100"}), 401},
		{"sub 0100", "Bearer " + token(jwt.MapClaims{"sub": "0100"}), 401},
		{"sub as a number", "Bearer " + token(jwt.MapClaims{"sub": 100}), 401},
	} {
		if got := send(tc.header); got != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.status)
		}
	}
}

// reloadRefused asserts that token is refused with 401 unauthenticated by
// a read, a send, the topic list and an admin route.
func reloadRefused(t *testing.T, e *sendEnv, token, topic string) {
	t.Helper()
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/topics/" + topic + "/messages", nil},
		{"POST", "/v1/topics/" + topic + "/messages", sendBody("after-reload", "hi")},
		{"GET", "/v1/me/topics", nil},
		{"GET", "/v1/admin/shards", nil},
	} {
		code, body := e.Do(r.method, r.path, token, r.body)
		var env struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal(body, &env)
		if code != http.StatusUnauthorized || env.Error.Code != "unauthenticated" {
			t.Fatalf("%s %s after the reload: %d %s, want 401 unauthenticated", r.method, r.path, code, body)
		}
	}
}

// TestReloadSecretChangeEndsOpenSockets: a reload that changes the
// tenant's jwt_secret ends every socket opened with a token signed by the
// old one (1008 "credentials revoked"), as every HTTP route refuses that
// token from the moment the reload returns; a token of the new secret is
// served and opens sockets.
func TestReloadSecretChangeEndsOpenSockets(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("club", 7, "active")
	e.member("club", 1, "member", time.Time{})
	old := e.Token(1, "")
	single := stMustDial(t, e.Env, "/v1/topics/club/stream", old)
	single.must("live")
	many := stMustDial(t, e.Env, "/v1/stream?topics=club", old)
	many.must("live")

	e.Reload(func(c *config.Config) { c.Tenants[0].JWTSecret = "rotated-" + e.Tenant })
	reloadRefused(t, e, old, "club")
	for name, c := range map[string]*stClient{"single-topic": single, "many-topic": many} {
		if code, reason := c.closed(); code != websocket.StatusPolicyViolation || reason != "credentials revoked" {
			t.Fatalf("%s socket of the old secret closed with %d %q, want 1008 credentials revoked", name, code, reason)
		}
	}
	if _, status, err := stDial(t, e.Env, "/v1/topics/club/stream", old, 0); err == nil || status != http.StatusUnauthorized {
		t.Fatalf("a socket with the old secret's token: %d %v, want 401", status, err)
	}
	fresh := e.Token(1, "")
	if code, body := e.Do("GET", "/v1/topics/club/messages", fresh, nil); code != http.StatusOK {
		t.Fatalf("the new secret's token: %d %s", code, body)
	}
	stMustDial(t, e.Env, "/v1/topics/club/stream", fresh).must("live")
}

// TestReloadRemovedTenantRefusedAtOnce: a reload that removes a tenant
// refuses its tokens on every route (401 unauthenticated) and ends its
// open sockets (1008 "credentials revoked") before it returns; the
// tenants that stay are served as before.
func TestReloadRemovedTenantRefusedAtOnce(t *testing.T) {
	t.Parallel()
	other := testenv.NewTenant(t)
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) {
		c.Tenants = append(c.Tenants, config.Tenant{ID: other, JWTSecret: "secret-" + other})
	}})
	e.group("club", 7, "active")
	e.member("club", 1, "member", time.Time{})
	tok := e.Token(1, "")
	c := stMustDial(t, e.Env, "/v1/topics/club/stream", tok)
	c.must("live")
	if code, body := e.Do("GET", "/v1/topics/club/messages", tok, nil); code != http.StatusOK {
		t.Fatalf("before the reload: %d %s", code, body)
	}

	e.Reload(func(c *config.Config) { c.Tenants = c.Tenants[1:] })
	reloadRefused(t, e, tok, "club")
	if code, reason := c.closed(); code != websocket.StatusPolicyViolation || reason != "credentials revoked" {
		t.Fatalf("the removed tenant's socket closed with %d %q, want 1008 credentials revoked", code, reason)
	}
	otherTok, err := httpapi.Sign([]byte("secret-"+other), other, 1, "admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := e.Do("GET", "/v1/admin/shards", otherTok, nil); code != http.StatusOK {
		t.Fatalf("the tenant that stays: %d %s", code, body)
	}
}
