package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/test/harness"
)

// TestCtrlCStopsAtOnce: `imshard all` on config.example.yaml stops at
// once on Ctrl-C (SIGINT) — no load balancer waits at a terminal — while
// SIGTERM, what systemd sends, keeps the http.shutdown_delay drain
// (TestExampleConfigServesAndDrainsOnSIGTERM).
func TestCtrlCStopsAtOnce(t *testing.T) {
	t.Parallel()
	example, env, opsAddr := exampleConfig(t)
	p := faultsStart(t, env, "all", "--config", example)
	waitReadyz(t, p, opsAddr)
	start := time.Now()
	p.signal(t, os.Interrupt)
	if err := p.wait(t, 40*time.Second); err != nil {
		t.Fatalf("Ctrl-C: %v\n%s", err, p.out.String())
	}
	// the example's shutdown_delay is 5 s
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Ctrl-C took %v to stop: it waited for the load-balancer drain\n%s", d, p.out.String())
	}
}

// TestMakeRunInstallsOnlyTheService: `make run` brings up what the service
// runs on (MariaDB, Redis) and nothing only the tests use (promtool,
// systemd-analyze, the OpenAPI linter), which test/run.sh asks for; README says how long the
// test command takes.
func TestMakeRunInstallsOnlyTheService(t *testing.T) {
	plan, err := exec.Command("make", "-n", "-C", repoFile("."), "run").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, plan)
	}
	if !strings.Contains(string(plan), "test/services.sh") || strings.Contains(string(plan), "--test-tools") {
		t.Fatalf("make run must bring up the services without the test tools:\n%s", plan)
	}
	out, err := exec.Command("bash", repoFile("test/services.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("test/services.sh: %v\n%s", err, out)
	}
	for _, tool := range []string{"promtool", "systemd-analyze", "openapi-lint"} {
		if strings.Contains(string(out), tool) {
			t.Errorf("test/services.sh without --test-tools deals with %s:\n%s", tool, out)
		}
	}
	if run, err := os.ReadFile(repoFile("test/run.sh")); err != nil || !strings.Contains(string(run), "test/services.sh --test-tools") {
		t.Errorf("test/run.sh must install the test tools: %v", err)
	}
	readme, err := os.ReadFile(repoFile("README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(readme), "Run every test")
	about, _, _ := strings.Cut(after, "bash test/run.sh")
	if !strings.Contains(about, "minutes") {
		t.Errorf("README does not say how long the test command takes")
	}
}

// TestWatchFollowsATopic: `imshard watch`, the WebSocket client README
// names, prints the messages above --since and then each new one as a JSON
// line, and ends at once, exit 0, on Ctrl-C; a token the topic refuses
// exits 1 naming the refusal.
func TestWatchFollowsATopic(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("room1", 7, "active")
	e.member("room1", 42, "member", time.Time{})
	alice := e.Token(42, "")
	e.mustSend(alice, "room1", sendBody("c-1", "hello world"))
	p := faultsStart(t, nil, "watch", "--api="+e.BaseURL, "--topic=room1", "--token="+alice, "--since=0")
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(p.out.String(), "hello world") })
	e.mustSend(alice, "room1", sendBody("c-2", "second"))
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(p.out.String(), "second") })
	for _, line := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
		var f map[string]any
		if err := json.Unmarshal([]byte(line), &f); err != nil || f["type"] == "ping" {
			t.Fatalf("not a JSON frame (or a ping) per line: %q\n%s", line, p.out.String())
		}
	}
	p.signal(t, os.Interrupt)
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Ctrl-C: %v\n%s", err, p.out.String())
	}
	code, out := runCLI(t, nil, "watch", "--api="+e.BaseURL, "--topic=room1", "--token="+e.Token(43, ""))
	if code != 1 || !strings.Contains(out, "403") {
		t.Fatalf("a non-member: exit %d, want 1 naming 403\n%s", code, out)
	}
}
