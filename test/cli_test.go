package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// runCLI runs the binary with args and extra env; it returns the exit code
// and the output, stdout then stderr.
func runCLI(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	code, stdout, stderr := runCLIApart(t, env, args...)
	return code, stdout + stderr
}

// runCLIApart is runCLI with stdout and stderr apart, for what a script
// reads (stdout) and what it logs (stderr).
func runCLIApart(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLIWithin(t, 60*time.Second, env, args...)
}

// runCLIWithin is runCLIApart for a command given limit to run (a
// benchmark's, which starts servers and processes of its own).
func runCLIWithin(t *testing.T, limit time.Duration, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	// the binary first: its one build (a minute or more on a loaded
	// machine) is not the command's time
	bin := imshardBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = t.TempDir()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatalf("run %v: %v\n%s%s", args, err, out.String(), errOut.String())
	return -1, "", ""
}

// tenantConfig writes a config file for one fresh tenant on the shared services.
func tenantConfig(t *testing.T, tenant string, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "imshard.yaml")
	body := fmt.Sprintf(`mysql:
  dsn_template: %q
redis:
  addrs: [%q]
tenants:
  - {id: %s, jwt_secret: "secret-%s"}
log: {level: warn}
%s`, testenv.DSNTemplate(), testenv.RedisAddr(), tenant, tenant, extra)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestShardCommandsEnsureListActivate(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	code, out := runCLI(t, nil, "--config", cfg, "shard", "ensure", "--months=3")
	if code != 0 {
		t.Fatalf("shard ensure: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "created 5") || !strings.Contains(out, "active "+now.String()) {
		t.Fatalf("first ensure must create prev, current and 3 ahead, and activate the current month:\n%s", out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "ensure", "--months=3")
	if code != 0 || !strings.Contains(out, "created 0") {
		t.Fatalf("second ensure must change nothing: exit %d\n%s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "list")
	if code != 0 {
		t.Fatalf("shard list: exit %d\n%s", code, out)
	}
	for m := now.Prev(); !m.After(now.Add(3)); m = m.Next() {
		tb, _ := routing.TableFor(m)
		if !strings.Contains(out, tb.Name()) {
			t.Fatalf("shard list lacks %s:\n%s", tb.Name(), out)
		}
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "activate", "--tenant", tenant, "--month", now.String())
	if code != 0 || !strings.Contains(out, "tenant "+tenant+": active month "+now.String()) {
		t.Fatalf("activating the active month is a no-op: exit %d\n%s", code, out)
	}
	for _, m := range []routing.Month{now.Next(), now.Prev()} {
		code, out = runCLI(t, nil, "--config", cfg, "shard", "activate", "--tenant", tenant, "--month", m.String())
		if code != 1 {
			t.Fatalf("activate %s: exit %d, want 1 with the reason\n%s", m, code, out)
		}
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "activate", "--tenant", tenant, "--month", "202613")
	if code != 2 || !strings.Contains(out, "202613") {
		t.Fatalf("bad month: exit %d\n%s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "seal", "--tenant", tenant, "--month", now.String())
	if code != 1 || !strings.Contains(out, "active month") {
		t.Fatalf("sealing the active month must fail: exit %d\n%s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "seal", "--tenant", tenant, "--month", now.Prev().String())
	if code != 0 || !strings.Contains(out, "tenant "+tenant+": month "+now.Prev().String()+" sealed") {
		t.Fatalf("seal: exit %d\n%s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "shard", "unseal", "--tenant", tenant, "--month", now.Prev().String())
	if code != 0 || !strings.Contains(out, "tenant "+tenant+": month "+now.Prev().String()+" unsealed") {
		t.Fatalf("unseal: exit %d\n%s", code, out)
	}
}

func TestConfigErrorsExitTwoNamingTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("http:\n  adr: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"bad duration from env", []string{"IMSHARD_HTTP_SHUTDOWN_GRACE=abc"}, []string{"config", "check"}, "http.shutdown_grace"},
		{"bad bool from env", []string{"IMSHARD_SHARD_AUTO_ADVANCE=maybe"}, []string{"config", "check"}, "shard.auto_advance"},
		{"out of range", []string{"IMSHARD_PERSIST_BATCH_SIZE=0"}, []string{"config", "check"}, "persist.batch_size"},
		{"key prefix that would move the hash tag", []string{"IMSHARD_REDIS_KEY_PREFIX=a{b}:"}, []string{"config", "check"}, "redis.key_prefix"},
		{"unknown key in file", nil, []string{"--config", unknown, "config", "check"}, "http.adr"},
		{"unknown role", nil, []string{"serve", "--roles=bogus"}, "valid:"},
		{"unknown flag", nil, []string{"shard", "ensure", "--bogus"}, "bogus"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out := runCLI(t, c.env, c.args...)
			if code != 2 || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want 2 naming %q:\n%s", code, c.want, out)
			}
		})
	}
	code, out := runCLI(t, []string{"IMSHARD_MYSQL_DSN_TEMPLATE=app:s3cret@tcp(db:3306)/im_{tenant}", "IMSHARD_SHARD_MONTHS_AHEAD=5"}, "config", "check")
	if code != 0 || !strings.Contains(out, "months_ahead: 5") || !strings.Contains(out, "db:3306") || strings.Contains(out, "s3cret") {
		t.Fatalf("config check must apply nested env overrides and mask secrets: exit %d\n%s", code, out)
	}
}

// TestExampleConfigServesAndDrainsOnSIGTERM: `imshard all` with
// config.example.yaml (ports, data dir and tenant overridden by env) answers
// /readyz 200, turns it 503 on SIGTERM for http.shutdown_delay, and exits 0.
func TestExampleConfigServesAndDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	example, env, opsAddr := exampleConfig(t)
	cmd := exec.Command(imshardBinary(t), "all", "--config", example)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	readyz := func() int {
		resp, err := http.Get("http://" + opsAddr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(60 * time.Second)
	for readyz() != http.StatusOK {
		select {
		case err := <-exited:
			t.Fatalf("imshard all exited early: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 200\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// the example's http.shutdown_delay keeps it up, not ready, for a while
	for readyz() != http.StatusServiceUnavailable {
		select {
		case err := <-exited:
			t.Fatalf("imshard all exited without answering /readyz 503 during http.shutdown_delay: %v\n%s", err, out.String())
		default:
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("imshard all did not exit 0 on SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("imshard all did not stop within its grace\n%s", out.String())
	}
	if !strings.Contains(out.String(), "imshard stopped") {
		t.Fatalf("no clean-stop log line:\n%s", out.String())
	}
}

// exampleConfig is config.example.yaml with the environment that moves its
// ports, Kafka log and tenant onto free ports, a temporary directory and a
// fresh tenant of the shared services; opsAddr serves /readyz.
func exampleConfig(t *testing.T) (path string, env []string, opsAddr string) {
	t.Helper()
	tenant := testenv.NewTenant(t)
	_, file, _, _ := runtime.Caller(0)
	path = filepath.Join(filepath.Dir(filepath.Dir(file)), "config.example.yaml")
	opsAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	return path, []string{
		fmt.Sprintf("IMSHARD_HTTP_ADDR=127.0.0.1:%d", testenv.FreePort(t)), "IMSHARD_METRICS_ADDR=" + opsAddr,
		"IMSHARD_KAFKA_DATA_DIR=" + t.TempDir(),
		"IMSHARD_MYSQL_DSN_TEMPLATE=" + testenv.DSNTemplate(),
		"IMSHARD_REDIS_ADDRS=" + testenv.RedisAddr(),
		fmt.Sprintf(`IMSHARD_TENANTS=[{"id":%q,"jwt_secret":"secret-%s"}]`, tenant, tenant),
	}, opsAddr
}
