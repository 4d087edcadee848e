package app

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
)

// TestAddedTenants: a reload provisions the tenants it added and those it
// moved to another database — never one only its secret changed.
func TestAddedTenants(t *testing.T) {
	live := &config.Config{MySQL: config.MySQL{DSNTemplate: "root@tcp(db:3306)/im_{tenant}"}, Tenants: []config.Tenant{
		{ID: "kept", JWTSecret: "a"}, {ID: "rotated", JWTSecret: "a"}, {ID: "moved", JWTSecret: "a"}, {ID: "removed", JWTSecret: "a"},
	}}
	next := *live
	next.Tenants = []config.Tenant{
		{ID: "kept", JWTSecret: "a"}, {ID: "rotated", JWTSecret: "b"},
		{ID: "moved", JWTSecret: "a", DSN: "root@tcp(db2:3306)/im_moved"}, {ID: "new", JWTSecret: "a"},
	}
	if got, want := addedTenants(live, &next), []string{"moved", "new"}; !slices.Equal(got, want) {
		t.Fatalf("addedTenants = %v, want %v", got, want)
	}
	if got := addedTenants(live, live); got != nil {
		t.Fatalf("an unchanged tenant list provisions %v", got)
	}
}

// TestWeakSecretsWarnedAtStartAndOnReload: a tenant whose jwt_secret, or
// the secret of one of its HS256 keys, is the public demo secret or shorter
// than 32 bytes is logged and exported when a server starts, per tenant,
// kid and reason, and a reload that replaces it clears it (while a reload
// bringing a new weak one reports that one).
func TestWeakSecretsWarnedAtStartAndOnReload(t *testing.T) {
	strong := strings.Repeat("s", config.StrongSecretLen)
	cfg := config.Default()
	cfg.Tenants = []config.Tenant{
		{ID: "demo", JWTSecret: config.DemoSecret}, {ID: "acme", JWTSecret: "acme-secret-123"}, {ID: "beta", JWTSecret: strong},
	}
	var log bytes.Buffer
	a := New(&cfg, zerolog.New(&log))
	if err := a.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	weak := func() map[string]string {
		got := map[string]string{}
		mfs, err := a.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "imshard_tenant_secret_weak" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if m.GetGauge().GetValue() == 1 {
					got[strings.TrimSuffix(labels["tenant"]+"/"+labels["kid"], "/")] = labels["reason"]
				}
			}
		}
		return got
	}
	if got, want := weak(), map[string]string{"demo": config.WeakSecretDemo, "acme": config.WeakSecretShort}; !maps.Equal(got, want) {
		t.Fatalf("at start imshard_tenant_secret_weak = %v, want %v", got, want)
	}
	for _, want := range []string{`"tenant":"demo","reason":"demo"`, `"tenant":"acme","reason":"short"`} {
		if !strings.Contains(log.String(), want) {
			t.Fatalf("start log lacks a warning with %s:\n%s", want, log.String())
		}
	}
	if strings.Contains(log.String(), `"tenant":"beta"`) {
		t.Fatalf("a 32-byte secret was warned of:\n%s", log.String())
	}

	next := cfg
	next.Tenants = []config.Tenant{{ID: "acme", JWTSecret: strings.Repeat("a", config.StrongSecretLen)}, {ID: "beta", JWTSecret: "beta-secret-123"},
		{ID: "gamma", Keys: []config.TenantKey{{KID: "new", Alg: config.AlgHS256, Secret: strong + "g"}, {KID: "old", Alg: config.AlgHS256, Secret: "gamma-secret-1"}}}}
	log.Reset()
	a.Reload(&next)
	if got, want := weak(), map[string]string{"beta": config.WeakSecretShort, "gamma/old": config.WeakSecretShort}; !maps.Equal(got, want) {
		t.Fatalf("after the reload imshard_tenant_secret_weak = %v, want %v", got, want)
	}
	if !strings.Contains(log.String(), `"tenant":"beta","reason":"short"`) || strings.Contains(log.String(), `"tenant":"acme","reason"`) ||
		!strings.Contains(log.String(), `"tenant":"gamma","reason":"short","kid":"old"`) || strings.Contains(log.String(), `"kid":"new"`) {
		t.Fatalf("reload log must warn of beta and gamma's key old only:\n%s", log.String())
	}
}
