package app

import (
	"slices"
	"strings"
	"testing"
)

// TestModuleGraphPerRole pins the start order of every role: dependencies
// first, the API server after the HTTP roles, deterministic.
func TestModuleGraphPerRole(t *testing.T) {
	for _, role := range append(Roles(), All) {
		t.Run(role, func(t *testing.T) {
			order, err := StartOrder([]string{role})
			if err != nil {
				t.Fatal(err)
			}
			pos := map[string]int{}
			for i, m := range order {
				pos[m] = i
			}
			if order[0] != Ops {
				t.Errorf("%s: ops must start first (and stop last): %v", role, order)
			}
			for m := range pos {
				for _, d := range deps[m] {
					if p, ok := pos[d]; !ok || p > pos[m] {
						t.Errorf("%s: %s starts before its dependency %s: %v", role, m, d, order)
					}
				}
				for _, d := range after[m] {
					if p, ok := pos[d]; ok && p > pos[m] {
						t.Errorf("%s: %s starts before %s: %v", role, m, d, order)
					}
				}
			}
			again, _ := StartOrder([]string{role})
			if !slices.Equal(order, again) {
				t.Errorf("order not deterministic: %v vs %v", order, again)
			}
			if _, ok := pos[role]; !ok {
				t.Errorf("%s missing from its own order %v", role, order)
			}
		})
	}
	order, _ := StartOrder([]string{ShardMgr})
	if want := []string{Ops, MySQL, Redis, Routing, ReadPath, ShardMgr}; !slices.Equal(order, want) {
		t.Errorf("shardmgr order = %v, want %v", order, want)
	}
	all, _ := StartOrder([]string{All})
	for _, r := range Roles() {
		if !slices.Contains(all, r) {
			t.Errorf("all lacks role %s: %v", r, all)
		}
	}
	for _, r := range httpModules {
		if slices.Contains(all, r) && slices.Index(all, API) < slices.Index(all, r) {
			t.Errorf("api must start after %s: %v", r, all)
		}
	}
}

func TestParseRoles(t *testing.T) {
	if _, err := ParseRoles("bogus"); err == nil || !strings.Contains(err.Error(), "valid:") {
		t.Fatalf("unknown role error must list the valid ones, got %v", err)
	}
	if _, err := ParseRoles(""); err == nil {
		t.Fatal("empty roles must fail")
	}
	got, err := ParseRoles(ShardMgr + "," + ShardMgr)
	if err != nil || !slices.Equal(got, []string{ShardMgr}) {
		t.Fatalf("ParseRoles dedup = %v, %v", got, err)
	}
	for _, r := range Roles() {
		if _, ok := inits[r]; !ok {
			t.Errorf("role %s has no init function", r)
		}
	}
}

// TestRolesRunTheirModules pins which modules each serving role runs: send
// the changes; query the inbox and the stream; the stream alone (memory-
// bound sockets scale apart from CPU-bound badges) neither the reads' nor
// the inbox's routes; every role serving the API the tenants' key sets
// (keys, which fetches their JWKS), persist none.
func TestRolesRunTheirModules(t *testing.T) {
	for _, c := range []struct {
		role      string
		runs, not []string
	}{
		{Send, []string{Send, Changes, ReadPath, API, Keys}, []string{Query, Inbox, Stream}},
		{Query, []string{Query, Inbox, Stream, ReadPath, API, Keys}, []string{Send, Changes, Kafka}},
		{Stream, []string{Stream, ReadPath, API, Keys}, []string{Query, Inbox, Send, Changes, Kafka}},
		{Persist, []string{Persist, Kafka}, []string{ReadPath, API, Keys}},
		// the relay needs the tenant databases and Kafka, nothing of the
		// request path
		{Relay, []string{Relay, MySQL, Kafka}, []string{Redis, Routing, API, Persist, Keys}},
	} {
		order, err := StartOrder([]string{c.role})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.runs {
			if !slices.Contains(order, m) {
				t.Errorf("%s does not run %s: %v", c.role, m, order)
			}
		}
		for _, m := range c.not {
			if slices.Contains(order, m) {
				t.Errorf("%s runs %s: %v", c.role, m, order)
			}
		}
	}
}
