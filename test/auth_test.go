package test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
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
