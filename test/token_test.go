package test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imshard/imshard/test/harness"
)

// TestTokenCommandSignsForTheTenant runs `imshard token` as a newcomer does
// and uses what it prints against a running send role: the service token
// manages groups, a plain user's token may not, the claims are those asked
// for, and bad arguments are bad usage (exit 2) naming what is wrong.
func TestTokenCommandSignsForTheTenant(t *testing.T) {
	env := harness.Start(t, harness.Options{Roles: []string{"send"}})
	cfg := tenantConfig(t, env.Tenant, "")
	token := func(args ...string) string {
		t.Helper()
		code, out := runCLI(t, nil, append([]string{"--config", cfg, "token", "--tenant", env.Tenant}, args...)...)
		if code != 0 {
			t.Fatalf("token %v: exit %d\n%s", args, code, out)
		}
		return strings.TrimSpace(out)
	}
	group := map[string]any{"group_id": 5, "name": "room", "status": "active"}
	svc := token("--sub=7", "--role=service", "--ttl=2h")
	if code, body := env.Do("PUT", "/v1/topics/room", svc, group); code != 200 {
		t.Fatalf("PUT group with the printed service token: %d %s", code, body)
	}
	if code, body := env.Do("PUT", "/v1/topics/room", token("--sub=8"), group); code != 403 {
		t.Fatalf("PUT group with a plain user's token: %d %s, want 403", code, body)
	}
	parts := strings.Split(svc, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", svc)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Tid, Sub, Role string
		Exp, Iat       int64
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	if claims.Tid != env.Tenant || claims.Sub != "7" || claims.Role != "service" || claims.Exp-claims.Iat != 7200 {
		t.Fatalf("claims %s, want tid %s, sub 7, role service, exp = iat + 2h", raw, env.Tenant)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--tenant", "nosuch", "--sub=1"}, `tenant "nosuch" is not configured`},
		{[]string{"--tenant", env.Tenant}, `"sub" not set`},
		{[]string{"--tenant", env.Tenant, "--sub=0"}, "sub must be a positive user id"},
		{[]string{"--tenant", env.Tenant, "--sub=1", "--role=root"}, "role must be service or admin"},
		{[]string{"--tenant", env.Tenant, "--sub=1", "--ttl=-1h"}, "ttl must be positive"},
		{[]string{"--tenant", env.Tenant, "--sub=1", "--ttl=25h"}, "at most auth.max_token_ttl (24h0m0s), got 25h0m0s"},
	} {
		code, out := runCLI(t, nil, append([]string{"--config", cfg, "token"}, c.args...)...)
		if code != 2 || !strings.Contains(out, c.says) {
			t.Errorf("token %v: exit %d %q, want 2 saying %q", c.args, code, out, c.says)
		}
	}
}

// TestTokenCommandSignsWithAKid: `imshard token --kid` signs with the
// tenant's key of that kid and names it in the header, so the API verifies
// it with that key; a kid the tenant lacks is bad usage naming the kids it
// has.
func TestTokenCommandSignsWithAKid(t *testing.T) {
	t.Parallel()
	secret := strings.Repeat("k", 40)
	tenants := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(tenants, []byte(`- {id: acme, jwt_secret: "secret-acme", keys: [{kid: "2026-12", alg: HS256, secret: "`+secret+`"}]}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := tenantConfig(t, "acme", "tenants_file: "+tenants+"\n")
	code, out := runCLI(t, nil, "--config", cfg, "token", "--tenant=acme", "--sub=7", "--kid=2026-12")
	if code != 0 {
		t.Fatalf("token --kid: exit %d\n%s", code, out)
	}
	tok, err := jwt.Parse(strings.TrimSpace(out), func(*jwt.Token) (any, error) { return []byte(secret), nil }, jwt.WithValidMethods([]string{"HS256"}))
	if err != nil || tok.Header["kid"] != "2026-12" {
		t.Fatalf("the printed token does not verify with key 2026-12, or lacks its kid: %v %v", err, tok)
	}
	code, out = runCLI(t, nil, "--config", cfg, "token", "--tenant=acme", "--sub=7", "--kid=2027-01")
	if code != 2 || !strings.Contains(out, `tenant "acme" has no key "2027-01" (configured: 2026-12)`) {
		t.Fatalf("token with an unknown kid: exit %d %q, want 2 naming the configured kids", code, out)
	}
}
