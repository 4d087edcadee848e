package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/test/testenv"
)

// TestSplitProcessWithoutBrokersExitsTwo: a process running exactly one of
// send and persist with kafka.brokers empty would start a Kafka of its own
// that the other role never shares; it refuses to start, naming the key and
// the development stand-in.
func TestSplitProcessWithoutBrokersExitsTwo(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	for _, args := range [][]string{{"serve", "--roles=send,query"}, {"serve", "--roles=send"}, {"persist"}, {"serve", "--roles=persist,shardmgr"}} {
		code, out := runCLI(t, nil, append([]string{"--config", cfg}, args...)...)
		if code != 2 || !strings.Contains(out, "kafka.brokers") || !strings.Contains(out, "imshard devkafka") {
			t.Fatalf("%v with kafka.brokers empty: exit %d, want 2 naming kafka.brokers and imshard devkafka:\n%s", args, code, out)
		}
	}
}

// TestDemoSecretRefusedOutsideAll: the built-in demo tenant's public
// secrets (jwt_secret and its key demo-1) are accepted only by `imshard all`.
func TestDemoSecretRefusedOutsideAll(t *testing.T) {
	t.Parallel()
	code, out := runCLI(t, nil, "serve", "--roles=query") // no config: the demo tenant
	if code != 2 || !strings.Contains(out, "tenants[0].jwt_secret") || !strings.Contains(out, "tenants[0].keys[0].secret") || !strings.Contains(out, `"demo"`) {
		t.Fatalf("serve --roles=query with the demo tenant: exit %d, want 2 naming tenants[0].jwt_secret and its key's tenants[0].keys[0].secret:\n%s", code, out)
	}
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	env := []string{fmt.Sprintf(`IMSHARD_TENANTS=[{"id":%q,"jwt_secret":"secret-%s"},{"id":"other","jwt_secret":"change-me"}]`, tenant, tenant)}
	code, out = runCLI(t, env, "--config", cfg, "serve", "--roles=shardmgr")
	if code != 2 || !strings.Contains(out, "tenants[1].jwt_secret") {
		t.Fatalf("serve --roles=shardmgr with a change-me tenant: exit %d, want 2 naming tenants[1].jwt_secret:\n%s", code, out)
	}
}

// TestSIGHUPReloadsAndNeverExits: `systemctl reload` sends SIGHUP. With no
// tenants_file it changes nothing and the process keeps serving; after the
// file changes, a new tenant and log.level apply at once and every other
// changed key is named as needing a restart.
func TestSIGHUPReloadsAndNeverExits(t *testing.T) {
	t.Parallel()
	tenant, added := testenv.NewTenant(t), testenv.NewTenant(t)
	dir := t.TempDir()
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	opsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfgPath := filepath.Join(dir, "imshard.yaml")
	writeConfig := func(level, grace, extra string) {
		t.Helper()
		body := fmt.Sprintf("http: {addr: %q, shutdown_delay: 0s, shutdown_grace: %s}\nmetrics: {addr: %q}\nlog: {level: %s, format: json}\n"+
			"mysql: {dsn_template: %q}\nredis: {addrs: [%q]}\ntenants: [{id: %s, jwt_secret: secret-%s}]\n%s",
			httpAddr, grace, opsAddr, level, testenv.DSNTemplate(), testenv.RedisAddr(), tenant, tenant, extra)
		if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig("info", "10s", "")
	p := faultsStart(t, nil, "serve", "--roles=query", "--config", cfgPath)
	waitReadyz(t, p, opsAddr)

	// SIGHUP with nothing changed and no tenants_file: reloaded, still serving.
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 1, "configuration reloaded")
	if !p.running() {
		t.Fatalf("SIGHUP stopped the process\n%s", p.out.String())
	}
	shards := func(id string) int {
		tok, err := httpapi.Sign([]byte("secret-"+id), id, 1, "admin", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/v1/admin/shards", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("the API stopped answering: %v\n%s", err, p.out.String())
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := shards(tenant); code != http.StatusOK {
		t.Fatalf("configured tenant: %d", code)
	}
	if code := shards(added); code != http.StatusUnauthorized {
		t.Fatalf("a tenant not configured yet: %d, want 401", code)
	}

	// Add a tenant through a new tenants_file, raise the log level, change a
	// key that only a restart applies.
	tenantsFile := filepath.Join(dir, "tenants.yaml")
	if err := os.WriteFile(tenantsFile, []byte(fmt.Sprintf("- {id: %s, jwt_secret: secret-%s}\n", added, added)), 0o600); err != nil {
		t.Fatal(err)
	}
	writeConfig("debug", "11s", "tenants_file: "+tenantsFile+"\n")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 2, "configuration reloaded")
	if code := shards(added); code != http.StatusOK {
		t.Fatalf("tenant added by SIGHUP: %d, want 200\n%s", code, p.out.String())
	}
	if code := shards(tenant); code != http.StatusOK {
		t.Fatalf("the first tenant after the reload: %d", code)
	}
	log := p.out.String()
	if !strings.Contains(log, `"key":"http.shutdown_grace"`) || !strings.Contains(log, "restart needed") {
		t.Fatalf("the changed http.shutdown_grace must be logged as needing a restart:\n%s", log)
	}
	if strings.Contains(log, `"key":"log.level"`) || strings.Contains(log, `"key":"tenants_file"`) {
		t.Fatalf("live keys must not be logged as needing a restart:\n%s", log)
	}
	if strings.Count(log, `"level":"debug"`) == 0 || strings.Count(log, `"message":"configuration keys changed"`) != 1 {
		t.Fatalf("log.level debug was not applied (no debug line after the reload):\n%s", log)
	}

	// A reload that fails (an invalid value) changes nothing and does not stop.
	writeConfig("loud", "11s", "")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 1, "configuration reload failed")
	if code := shards(added); code != http.StatusOK {
		t.Fatalf("a failed reload must keep the tenants: %d", code)
	}
	// The demo secret is refused on reload as at start.
	if err := os.WriteFile(tenantsFile, []byte("- {id: sneaky, jwt_secret: change-me}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeConfig("debug", "11s", "tenants_file: "+tenantsFile+"\n")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, 2, "configuration reload failed")
	if log := p.out.String(); !strings.Contains(log, "tenants[1].jwt_secret") {
		t.Fatalf("the reload must name the tenant with the demo secret:\n%s", log)
	}
	p.signal(t, syscall.SIGTERM)
	if err := p.wait(t, 30*time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.out.String())
	}
}

// waitReadyz waits until /readyz at opsAddr answers 200, failing the test if
// the process exits first.
func waitReadyz(t *testing.T, p *faultsProc, opsAddr string) {
	t.Helper()
	waitFor(t, time.Minute, func() bool {
		if !p.running() {
			t.Fatalf("exited before ready\n%s", p.out.String())
		}
		resp, err := http.Get("http://" + opsAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// waitLog waits until the process log holds msg at least n times.
func waitLog(t *testing.T, p *faultsProc, n int, msg string) {
	t.Helper()
	waitFor(t, time.Minute, func() bool {
		if !p.running() {
			t.Fatalf("exited while waiting for %q\n%s", msg, p.out.String())
		}
		return strings.Count(p.out.String(), msg) >= n
	})
}

// TestReloadRefusedTheSameWhateverTheRole: one configuration file serves a
// persist process and a shard manager. A reload to a value only the shard
// manager reads, but no process may hold (shard.patrol_interval: 1s), is
// refused by both with the same message: each keeps the configuration it
// had (the log level raised with it does not apply), logs the refusal and
// reports it on /metrics. A valid reload then names, in each process, only
// the changed keys its own roles read as needing a restart.
func TestReloadRefusedTheSameWhateverTheRole(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	brokers := testenv.Kafka(t)
	cfgPath := filepath.Join(t.TempDir(), "imshard.yaml")
	writeConfig := func(level, shard, persist string) {
		t.Helper()
		body := fmt.Sprintf("log: {level: %s, format: json}\nmysql: {dsn_template: %q}\nredis: {addrs: [%q]}\n"+
			"kafka: {brokers: [%q], partitions: 4}\ntenants: [{id: %s, jwt_secret: secret-%s}]\nshard: {%s}\npersist: {%s}\n",
			level, testenv.DSNTemplate(), testenv.RedisAddr(), brokers[0], tenant, tenant, shard, persist)
		if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig("info", "patrol_interval: 1h", "batch_size: 500")
	type proc struct {
		name string
		p    *faultsProc
		ops  string
	}
	var procs []proc
	for _, args := range [][]string{{"persist"}, {"serve", "--roles=shardmgr"}} {
		ops := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		p := faultsStart(t, nil, append(args, "--config", cfgPath, "--metrics-addr", ops)...)
		procs = append(procs, proc{strings.Join(args, " "), p, ops})
	}
	for _, pr := range procs {
		waitReadyz(t, pr.p, pr.ops)
	}

	writeConfig("debug", "patrol_interval: 1s", "batch_size: 500")
	var refusals []string
	for _, pr := range procs {
		pr.p.signal(t, syscall.SIGHUP)
		waitLog(t, pr.p, 1, "configuration reload failed")
		lines := logLines(pr.p, "configuration reload failed; nothing changed")
		if len(lines) != 1 {
			t.Fatalf("%s: %d refusals logged, want 1\n%s", pr.name, len(lines), pr.p.out.String())
		}
		msg, _ := lines[0]["error"].(string)
		if !strings.Contains(msg, "shard.patrol_interval: must be at least 1m, got 1s") {
			t.Fatalf("%s: the refusal does not name shard.patrol_interval: %q", pr.name, msg)
		}
		refusals = append(refusals, msg)
		out := pr.p.out.String()
		if strings.Contains(out, "configuration reloaded") || strings.Contains(out, `"level":"debug"`) {
			t.Fatalf("%s: the refused reload changed something:\n%s", pr.name, out)
		}
		for _, want := range []string{"imshard_config_last_reload_successful 0", "imshard_config_reload_failures_total 1"} {
			if !slices.Contains(strings.Split(opsMetrics(t, "http://"+pr.ops), "\n"), want) {
				t.Fatalf("%s: /metrics lacks %q after the refused reload", pr.name, want)
			}
		}
	}
	if refusals[0] != refusals[1] {
		t.Fatalf("the roles refuse the same file differently:\n%s: %s\n%s: %s", procs[0].name, refusals[0], procs[1].name, refusals[1])
	}

	writeConfig("info", "patrol_interval: 2h", "batch_size: 100")
	for i, pr := range procs {
		pr.p.signal(t, syscall.SIGHUP)
		waitLog(t, pr.p, 1, "configuration reloaded")
		var restart []string
		for _, l := range logLines(pr.p, "configuration key changed: restart needed") {
			key, _ := l["key"].(string)
			restart = append(restart, key)
		}
		want := [][]string{{"persist.batch_size"}, {"shard.patrol_interval"}}[i]
		if !slices.Equal(restart, want) {
			t.Fatalf("%s: keys logged as needing a restart %v, want %v\n%s", pr.name, restart, want, pr.p.out.String())
		}
		if !slices.Contains(strings.Split(opsMetrics(t, "http://"+pr.ops), "\n"), "imshard_config_last_reload_successful 1") {
			t.Fatalf("%s: /metrics does not show the valid reload as successful", pr.name)
		}
	}
	for _, pr := range procs {
		pr.p.signal(t, syscall.SIGTERM)
		if err := pr.p.wait(t, 30*time.Second); err != nil {
			t.Fatalf("%s: SIGTERM: %v\n%s", pr.name, err, pr.p.out.String())
		}
	}
}

// logLines are the JSON log lines of p whose message is msg.
func logLines(p *faultsProc, msg string) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(p.out.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}
