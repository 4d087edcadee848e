package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/test/testenv"
)

// TestTenantProcedureAddChangeRemove follows docs/operations.md "Adding,
// changing and removing a tenant" on a running `imshard all`: a tenant
// appended to tenants_file and reloaded gets its database, month tables and
// active month from the shard manager at once — `imshard shard list` shows
// it active and its first send answers 201, with no `imshard shard ensure`
// — a rotated secret refuses the old tokens, and a removed tenant's tokens
// are refused.
func TestTenantProcedureAddChangeRemove(t *testing.T) {
	t.Parallel()
	first, added := testenv.NewTenant(t), testenv.NewTenant(t)
	dir := t.TempDir()
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	opsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	tenantsFile := filepath.Join(dir, "tenants.yaml")
	writeTenants := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(tenantsFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	firstLine := fmt.Sprintf("- {id: %s, jwt_secret: secret-%s}", first, first)
	writeTenants(firstLine)
	cfg := faultsWriteConfig(t, fmt.Sprintf(`http: {addr: %q, shutdown_delay: 0s, shutdown_grace: 10s}
metrics: {addr: %q}
log: {level: info, format: json}
mysql: {dsn_template: %q}
redis: {addrs: [%q]}
kafka: {data_dir: %q, partitions: 4}
tenants_file: %s
`, httpAddr, opsAddr, testenv.DSNTemplate(), testenv.RedisAddr(), filepath.Join(dir, "kafka"), tenantsFile))
	p := faultsStart(t, nil, "all", "--config", cfg)
	waitReadyz(t, p, opsAddr)

	// 1. Add: append the tenant to tenants_file, reload.
	writeTenants(firstLine, fmt.Sprintf("- {id: %s, jwt_secret: secret-%s}", added, added))
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 1, "configuration reloaded")

	// 2. Check: `imshard shard list --tenant=T` shows the current month active.
	waitFor(t, 30*time.Second, func() bool {
		code, out, _ := runCLIApart(t, nil, "--config", cfg, "shard", "list", "--tenant="+added, "--output=json")
		var list struct {
			Shards []struct {
				Active bool `json:"active"`
			} `json:"shards"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
			return false
		}
		for _, s := range list.Shards {
			if s.Active {
				return true
			}
		}
		return false
	})
	api := faultsClient(t, "http://"+httpAddr, []byte("secret-"+added), added)
	api.group(t, "room1", 7, 42, 43)
	body := map[string]any{"client_msg_id": "c-1", "msg_type": "text", "content": map[string]any{"text": "hello"}}
	if code, out, err := api.do("POST", "/v1/topics/room1/messages", api.token(t, 42, ""), body); err != nil || code != 201 {
		t.Fatalf("first send of a tenant added by reload: %d %s %v, want 201\n%s", code, out, err, p.out.String())
	}

	// 3. Change: a rotated jwt_secret refuses the old tokens at once.
	old := api.token(t, 42, "")
	writeTenants(firstLine, fmt.Sprintf("- {id: %s, jwt_secret: rotated-%s}", added, added))
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 2, "configuration reloaded")
	if code, _, err := api.do("GET", "/v1/topics/room1/messages?limit=1", old, nil); err != nil || code != 401 {
		t.Fatalf("a token of the old secret after the rotation: %d %v, want 401", code, err)
	}

	// 4. Remove: take it out of tenants_file, reload; its tokens are refused.
	writeTenants(firstLine)
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 3, "configuration reloaded")
	rotated := faultsClient(t, "http://"+httpAddr, []byte("rotated-"+added), added)
	if code, _, err := rotated.do("GET", "/v1/topics/room1/messages?limit=1", rotated.token(t, 42, ""), nil); err != nil || code != 401 {
		t.Fatalf("a removed tenant's token: %d %v, want 401", code, err)
	}
	p.signal(t, syscall.SIGTERM)
	if err := p.wait(t, 30*time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.out.String())
	}
}
