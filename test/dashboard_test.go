package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// dashboardPanel is the part of a docs/dashboard.json panel the checks read.
type dashboardPanel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	FieldConfig struct {
		Defaults struct {
			Unit       string `json:"unit"`
			Thresholds struct {
				Steps []struct {
					Value *float64 `json:"value"`
				} `json:"steps"`
			} `json:"thresholds"`
			Custom struct {
				ThresholdsStyle struct {
					Mode string `json:"mode"`
				} `json:"thresholdsStyle"`
			} `json:"custom"`
		} `json:"defaults"`
		Overrides []json.RawMessage `json:"overrides"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboardFile struct {
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

func readDashboard(t *testing.T) dashboardFile {
	t.Helper()
	raw, err := os.ReadFile(repoFile("docs/dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboardFile
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/dashboard.json: %v", err)
	}
	return dash
}

// TestDashboard: docs/dashboard.json parses, offers the job, instance and
// tenant variables, and every panel has one unit (no second axis of another
// unit) and queries only metrics imshard exports, each filtered by the
// selected job and instance. Every alert of docs/alerts.yml has a panel
// that names it, queries every metric of its expression and draws its
// threshold, and the alert's runbook section in docs/operations.md names
// that panel. Every metric the dashboard or an alert names is exported by
// a running process (after one message went through it).
func TestDashboard(t *testing.T) {
	dash := readDashboard(t)
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"job", "instance", "tenant"} {
		if !vars[v] {
			t.Errorf("no $%s variable", v)
		}
	}
	known := exportedMetrics(t)
	filter := `{job=~"$job", instance=~"$instance"`
	ids := map[int]bool{}
	graphs := 0
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		graphs++
		if p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %q has no unit", p.Title)
		}
		for _, o := range p.FieldConfig.Overrides {
			if strings.Contains(string(o), `"unit"`) {
				t.Errorf("panel %q gives a series a unit of its own: one unit per panel", p.Title)
			}
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkMetrics(t, "docs/dashboard.json panel "+p.Title, tg.Expr, known)
			for _, loc := range seriesRef.FindAllStringIndex(tg.Expr, -1) {
				if !strings.HasPrefix(tg.Expr[loc[1]:], filter) {
					t.Errorf("panel %q: %s is not filtered by %s…}", p.Title, tg.Expr[loc[0]:loc[1]], filter)
				}
			}
		}
	}
	if graphs == 0 {
		t.Fatal("docs/dashboard.json has no panel")
	}
	checkAlertPanels(t, dash)
	checkUsedMetricsExported(t)
}

// checkAlertPanels reports every alert without a panel that names it
// ("Alert ImshardX" in its description), queries every metric of its
// expression and draws its threshold (a dashed or solid line at one of the
// values the expression compares with), and every alert whose runbook
// section does not name such a panel by its title in quotes.
func checkAlertPanels(t *testing.T, dash dashboardFile) {
	t.Helper()
	var rules alertRules
	readYAML(t, "docs/alerts.yml", &rules)
	raw, err := os.ReadFile(repoFile("docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	runbook := string(raw)
	var missing []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			var why, titles []string
			for _, p := range dash.Panels {
				if !regexp.MustCompile(`\bAlert ` + r.Alert + `\b`).MatchString(p.Description) {
					continue
				}
				if problem := alertPanelProblem(r.Expr, p); problem != "" {
					why = append(why, fmt.Sprintf("panel %q %s", p.Title, problem))
					continue
				}
				titles = append(titles, p.Title)
			}
			switch {
			case len(titles) == 0 && len(why) == 0:
				missing = append(missing, r.Alert+": no panel's description names it (\"Alert "+r.Alert+"\")")
			case len(titles) == 0:
				missing = append(missing, r.Alert+": "+strings.Join(why, "; "))
			default:
				section := runbookSection(runbook, r.Alert)
				if !slices.ContainsFunc(titles, func(title string) bool { return strings.Contains(section, `"`+title+`"`) }) {
					missing = append(missing, fmt.Sprintf("%s: its section in docs/operations.md does not name its panel (%q)", r.Alert, titles[0]))
				}
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("alerts without a panel on docs/dashboard.json (%d):\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
}

// alertPanelProblem says why p does not show the alert of expr ("" when it
// does): a metric of the expression it does not query, or no threshold
// drawn at a value the expression compares with.
func alertPanelProblem(expr string, p dashboardPanel) string {
	queried := map[string]bool{}
	for _, tg := range p.Targets {
		for _, m := range seriesRef.FindAllString(tg.Expr, -1) {
			queried[m] = true
		}
	}
	var lacks []string
	for _, m := range seriesRef.FindAllString(expr, -1) {
		if !queried[m] && !slices.Contains(lacks, m) {
			lacks = append(lacks, m)
		}
	}
	if len(lacks) > 0 {
		return "does not query " + strings.Join(lacks, ", ")
	}
	d := p.FieldConfig.Defaults
	if p.Type == "timeseries" && (d.Custom.ThresholdsStyle.Mode == "" || d.Custom.ThresholdsStyle.Mode == "off") {
		return "draws no threshold (fieldConfig.defaults.custom.thresholdsStyle.mode)"
	}
	var steps []float64
	for _, s := range d.Thresholds.Steps {
		if s.Value != nil {
			steps = append(steps, *s.Value)
		}
	}
	want := comparedValues(expr)
	if len(steps) == 0 || len(want) > 0 && !slices.ContainsFunc(steps, func(v float64) bool { return slices.Contains(want, v) }) {
		return fmt.Sprintf("has threshold steps %v, none at a value the alert compares with %v", steps, want)
	}
	return ""
}

// seriesRef finds the series an expression selects: imshard's (and the Go
// and process collectors') metrics, and Prometheus's own up.
var seriesRef = regexp.MustCompile(`\b(?:(?:imshard|group_message|go|process)_[a-z0-9_]+|up)\b`)

// comparison finds the constants an expression compares with: "> 0",
// "== bool 1", "> 26 * 3600".
var comparison = regexp.MustCompile(`(?:==|!=|>=|<=|>|<)\s*(?:bool\s+)?([0-9.]+(?:\s*\*\s*[0-9.]+)*)`)

func comparedValues(expr string) []float64 {
	var out []float64
	for _, m := range comparison.FindAllStringSubmatch(expr, -1) {
		v := 1.0
		for _, f := range strings.Split(m[1], "*") {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return nil
			}
			v *= x
		}
		out = append(out, v)
	}
	return out
}

// runbookSection is the text of "### name" in docs/operations.md, up to the
// next heading.
func runbookSection(runbook, name string) string {
	_, after, ok := strings.Cut(runbook, "\n### "+name+"\n")
	if !ok {
		return ""
	}
	if i := strings.Index(after, "\n#"); i >= 0 {
		after = after[:i]
	}
	return after
}

// seriesUse is one series selector of the dashboard or an alert: the metric
// and the label values it matches exactly (= "v", or each literal
// alternative of =~ "a|b").
type seriesUse struct {
	where  string
	metric string
	labels map[string][]string
}

var (
	selectorRef = regexp.MustCompile(`\b((?:imshard|group_message|go|process)_[a-z0-9_]+)\b(\{[^}]*\})?`)
	matcherRef  = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	literalAlts = regexp.MustCompile(`^[a-z0-9_.]+(\|[a-z0-9_.]+)*$`)
)

// usedSeries lists every series selector of docs/dashboard.json and
// docs/alerts.yml.
func usedSeries(t *testing.T) []seriesUse {
	t.Helper()
	exprs := map[string][]string{}
	for _, p := range readDashboard(t).Panels {
		for _, tg := range p.Targets {
			exprs["docs/dashboard.json panel "+p.Title] = append(exprs["docs/dashboard.json panel "+p.Title], tg.Expr)
		}
	}
	var rules alertRules
	readYAML(t, "docs/alerts.yml", &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs["docs/alerts.yml "+r.Alert] = append(exprs["docs/alerts.yml "+r.Alert], r.Expr)
		}
	}
	var out []seriesUse
	for where, list := range exprs {
		for _, expr := range list {
			for _, m := range selectorRef.FindAllStringSubmatch(expr, -1) {
				u := seriesUse{where: where, metric: m[1], labels: map[string][]string{}}
				for _, lm := range matcherRef.FindAllStringSubmatch(m[2], -1) {
					if (lm[2] == "=" || lm[2] == "=~") && literalAlts.MatchString(lm[3]) {
						u.labels[lm[1]] = strings.Split(lm[3], "|")
					}
				}
				out = append(out, u)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].where+out[i].metric < out[j].where+out[j].metric })
	return out
}

// measuredLater are the series the dashboard or an alert uses whose label
// values a process learns only from what it measures, so it cannot export
// them before: anything exported earlier would be a value nobody measured.
var measuredLater = map[string]string{
	"imshard_persist_consumer_lag":                "one series per Kafka partition, from its first fetch",
	"group_message_persist_total":                 "one series per month of the events stored",
	"group_message_route_repair_backlog":          "read from a tenant's repair queue by persist's first repair pass",
	"imshard_shardmgr_months_ready_ahead":         "measured by the shard manager's first sync",
	"imshard_shardmgr_active_month_lag":           "measured by the shard manager's first sync",
	"imshard_active_month":                        "the active month as this process last saw it",
	"imshard_auth_refused_total":                  "one series per tenant and reason, from the first token refused so",
	"imshard_jwks_last_success_timestamp_seconds": "one series per tenant with a jwks_url, from its first fetch",
}

// afterAMove are the series exported only for a tenant a move was begun
// for (a tenant that never moved has none, and no pool is opened to find
// that out): no process without a move exports them, so the checks of a
// plain process skip them; TestMoveSwitchPreChecksAndMetrics sees them
// follow a move.
var afterAMove = map[string]bool{
	"imshard_move_step":                      true,
	"imshard_move_rows_copied":               true,
	"imshard_move_bytes_copied":              true,
	"imshard_move_lag_chunks":                true,
	"imshard_move_paused":                    true,
	"imshard_move_switch_seconds":            true,
	"imshard_move_updated_timestamp_seconds": true,
}

// opsMetrics is the text a process's operations server (opsURL) answers
// on /metrics.
func opsMetrics(t *testing.T, opsURL string) string {
	t.Helper()
	resp, err := http.Get(opsURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// scrapeSamples reads the /metrics text of a process: each sample name
// with the label sets of its series.
func scrapeSamples(text string) map[string][]map[string]string {
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	out := map[string][]map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := map[string]string{}
		if n, ls, ok := strings.Cut(name, "{"); ok {
			name = n
			ls += rest // a label value may hold a space
			for _, m := range label.FindAllStringSubmatch(ls, -1) {
				labels[m[1]] = m[2]
			}
		}
		out[name] = append(out[name], labels)
	}
	return out
}

// unexported lists the uses whose metric, or one of whose exactly matched
// label values, has no series in samples; skip leaves metrics out.
func unexported(uses []seriesUse, samples map[string][]map[string]string, skip func(metric string) bool) []string {
	var out []string
	for _, u := range uses {
		if skip(u.metric) {
			continue
		}
		series := samples[u.metric]
		if len(series) == 0 {
			out = append(out, fmt.Sprintf("%s: %s has no series", u.where, u.metric))
			continue
		}
		for name, values := range u.labels {
			for _, v := range values {
				if !slices.ContainsFunc(series, func(l map[string]string) bool { return l[name] == v }) {
					out = append(out, fmt.Sprintf("%s: %s{%s=%q} has no series", u.where, u.metric, name, v))
				}
			}
		}
	}
	return slices.Compact(out)
}

// checkUsedMetricsExported: a process of every role, after one message
// went through it, exports every series the dashboard and the alerts use
// (those measured later included: the wait is bounded, and what is still
// missing then is listed).
func checkUsedMetricsExported(t *testing.T) {
	t.Helper()
	// a second tenant whose users come from their identity provider's
	// JWKS, so that the JWKS series exist
	idp := newJWKSServer(t)
	e := startSend(t, harness.Options{Roles: []string{app.All}, Mutate: func(c *config.Config) {
		c.Tenants = append(c.Tenants, config.Tenant{ID: testenv.NewTenant(t), JWKSURL: idp.srv.URL})
	}})
	e.group("room1", 7, "active")
	e.member("room1", 42, "member", time.Time{})
	e.mustSend(e.Token(42, ""), "room1", sendBody("c-1", "hello"))
	if code, _ := e.Do("GET", "/v1/topics/room1/messages", "not-a-token", nil); code != http.StatusUnauthorized {
		t.Fatalf("a request with a malformed token: %d, want 401", code)
	}
	uses := usedSeries(t)
	for i, u := range uses {
		if _, ok := measuredLater[u.metric]; ok {
			uses[i].labels = nil // which values come depends on what was measured
		}
	}
	var missing []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing = unexported(uses, scrapeSamples(opsMetrics(t, e.OpsURL)), func(m string) bool { return afterAMove[m] })
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(missing) > 0 {
		t.Errorf("series the dashboard or the alerts use that a running process does not export (%d):\n  %s",
			len(missing), strings.Join(missing, "\n  "))
	}
}
