package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
)

// repoFile is the path of a file of the repository.
func repoFile(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(filepath.Dir(file)), rel)
}

// alertRules is the part of docs/alerts.yml the checks read.
type alertRules struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, rel string, v any) {
	t.Helper()
	raw, err := os.ReadFile(repoFile(rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

// promtool is Debian's (package prometheus), which test/services.sh
// installs when it is missing; without it the alert rules are untested, so
// its absence is a failure.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed: run bash test/services.sh (it installs Debian's prometheus package, which has it)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = repoFile("docs")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules: the rules load (promtool check rules), their unit tests
// pass (promtool test rules), and every alert has a unit test that shows it
// firing, a severity, a runbook entry in docs/operations.md its runbook_url
// points at, and an expression over metrics imshard exports.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool(t, "check", "rules", "alerts.yml")
	promtool(t, "test", "rules", "alerts_test.yml")

	var rules alertRules
	readYAML(t, "docs/alerts.yml", &rules)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, "docs/alerts_test.yml", &tests)
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, at := range tc.AlertRuleTest {
			fires[at.Alertname] = fires[at.Alertname] || len(at.ExpAlerts) > 0
		}
	}
	runbook, err := os.ReadFile(repoFile("docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	known := exportedMetrics(t)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if !fires[r.Alert] {
				t.Errorf("%s: docs/alerts_test.yml has no test in which it fires", r.Alert)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			if want := "docs/operations.md#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !regexp.MustCompile(`(?m)^### ` + r.Alert + `$`).Match(runbook) {
				t.Errorf("%s: docs/operations.md has no section \"### %s\"", r.Alert, r.Alert)
			}
			checkMetrics(t, "docs/alerts.yml "+r.Alert, r.Expr, known)
		}
	}
	if n == 0 {
		t.Fatal("docs/alerts.yml holds no alert")
	}
}

// metricRef finds the metric names of imshard (and of the Go and process
// collectors) in an expression.
var metricRef = regexp.MustCompile(`\b(?:imshard|group_message|go|process)_[a-z0-9_]+\b`)

// checkMetrics reports each metric expr names that imshard does not export.
func checkMetrics(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	for _, name := range metricRef.FindAllString(expr, -1) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			t.Errorf("%s uses %s, which imshard does not export", where, name)
		}
	}
}

// exportedMetrics are the metric names a process can export: those the
// modules declare (Name: "…" in their prometheus options) and those a bare
// App registers (Go runtime, process, readiness).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	decl := regexp.MustCompile(`Name:\s+"([a-z_:][a-z0-9_:]*)"`)
	for _, dir := range []string{"app", "modules"} {
		err := filepath.WalkDir(repoFile(dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			for _, m := range decl.FindAllSubmatch(src, -1) {
				known[string(m[1])] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	def := config.Default()
	families, err := app.New(&def, zerolog.Nop()).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		known[f.GetName()] = true
	}
	return known
}

// TestLabelledCountersStartAtZero: a process exports the labelled series
// the alerts watch at 0 from its start, for every configured tenant, so the
// first increment is an increase (app's tests cover tenants a reload adds),
// and every series the dashboard or an alert uses, each label value they
// select included, so that no panel shows "No data" until a first event —
// except the few whose label values only a measurement tells
// (measuredLater).
func TestLabelledCountersStartAtZero(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	text := opsMetrics(t, env.OpsURL)
	lines := strings.Split(text, "\n")
	want := []string{
		`group_message_shard_missing_total{tenant="` + env.Tenant + `"} 0`,
		`imshard_shardmgr_ddl_failures_total{tenant="` + env.Tenant + `"} 0`,
		`group_message_dead_letter_total{reason="rejected"} 0`,
		`group_message_dead_letter_total{reason="shard_missing"} 0`,
		`imshard_persist_retries_total{reason="transient"} 0`,
		`imshard_send_total{result="unavailable"} 0`,
		`imshard_seq_reservations_total{result="error"} 0`,
		`imshard_message_changes_total{action="recall",result="internal"} 0`,
		`imshard_persist_in_flight_records 0`,
		`imshard_rate_limited_total{scope="user",tenant="` + env.Tenant + `"} 0`,
		`imshard_ready 1`,
	}
	for _, line := range want {
		if !slices.Contains(lines, line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	later := func(metric string) bool { _, ok := measuredLater[metric]; return ok || afterAMove[metric] }
	if missing := unexported(usedSeries(t), scrapeSamples(text), later); len(missing) > 0 {
		t.Errorf("series the dashboard or the alerts use that a process does not export from its start (%d):\n  %s",
			len(missing), strings.Join(missing, "\n  "))
	}
}
