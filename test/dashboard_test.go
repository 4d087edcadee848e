package test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestDashboard: docs/dashboard.json parses, offers the job, instance and
// tenant variables, and every panel has one unit (no second axis of another
// unit) and queries only metrics imshard exports, each filtered by the
// selected job and instance.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(repoFile("docs/dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID          int    `json:"id"`
			Type        string `json:"type"`
			Title       string `json:"title"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
				Overrides []json.RawMessage `json:"overrides"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/dashboard.json: %v", err)
	}
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
			for _, loc := range metricRef.FindAllStringIndex(tg.Expr, -1) {
				if !strings.HasPrefix(tg.Expr[loc[1]:], filter) {
					t.Errorf("panel %q: %s is not filtered by %s…}", p.Title, tg.Expr[loc[0]:loc[1]], filter)
				}
			}
		}
	}
	if graphs == 0 {
		t.Fatal("docs/dashboard.json has no panel")
	}
}
