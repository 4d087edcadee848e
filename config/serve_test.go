package config

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestValidateServeKafkaBrokers(t *testing.T) {
	tests := []struct {
		roles   []string
		brokers []string
		refused bool
	}{
		{[]string{"send", "query"}, nil, true},
		{[]string{"send"}, nil, true},
		{[]string{"persist"}, nil, true},
		{[]string{"persist", "shardmgr"}, nil, true},
		{[]string{"send", "persist"}, nil, false}, // the private broker is the whole bus
		{[]string{"send", "query", "persist", "shardmgr"}, nil, false},
		{[]string{"all"}, nil, false},
		{nil, nil, false},
		{[]string{"query"}, nil, false}, // never touches Kafka
		{[]string{"shardmgr"}, nil, false},
		{[]string{"query", "shardmgr"}, nil, false},
		{[]string{"send", "query"}, []string{"k1:9092"}, false},
		{[]string{"persist"}, []string{"k1:9092"}, false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.roles, ",")+"/"+strings.Join(tt.brokers, ","), func(t *testing.T) {
			c := Default()
			c.Tenants = []Tenant{{ID: "acme", JWTSecret: "acme-secret"}}
			c.Kafka.Brokers = tt.brokers
			err := c.ValidateServe(tt.roles...)
			if !tt.refused {
				if err != nil {
					t.Fatalf("ValidateServe(%v) = %v, want nil", tt.roles, err)
				}
				return
			}
			wantKeyError(t, err, "kafka.brokers", "imshard devkafka")
			if n := len(keyErrorsOf(err)); n != 1 {
				t.Fatalf("want exactly one problem, got %d: %v", n, err)
			}
		})
	}
}

func TestValidateServeDemoSecret(t *testing.T) {
	c := Default()
	c.Kafka.Brokers = []string{"k1:9092"}
	c.Tenants = []Tenant{{ID: "acme", JWTSecret: "acme-secret"}, {ID: "beta", JWTSecret: DemoSecret}}
	for _, roles := range [][]string{{"query"}, {"shardmgr"}, {"persist"}, {"send", "query"}, {"send", "query", "persist", "shardmgr"}} {
		wantKeyError(t, c.ValidateServe(roles...), "tenants[1].jwt_secret", `"beta"`)
	}
	for _, roles := range [][]string{nil, {"all"}} {
		if err := c.ValidateServe(roles...); err != nil {
			t.Fatalf("ValidateServe(%v) = %v: `imshard all` keeps the demo secret", roles, err)
		}
	}
	c.Tenants[1].JWTSecret = "beta-secret"
	if err := c.ValidateServe("query"); err != nil {
		t.Fatal(err)
	}
}

// TestDemoTenantOnlyByDefault: the demo tenant exists only when no tenant
// source is configured; a tenants_file drops it, even when the example's
// tenants list was copied beside it.
func TestDemoTenantOnlyByDefault(t *testing.T) {
	example, err := filepath.Abs(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // no ./imshard.yaml
	acme := Tenant{ID: "acme", JWTSecret: "acme-secret"}
	file := writeFile(t, "tenants.yaml", "- {id: acme, jwt_secret: acme-secret}\n")
	withFile := writeFile(t, "imshard.yaml", "tenants_file: "+file+"\n")
	inline := writeFile(t, "inline.yaml", "tenants: [{id: acme, jwt_secret: acme-secret}]\n")
	tests := []struct {
		name string
		opts LoadOptions
		want []Tenant
	}{
		{"nothing configured", LoadOptions{}, []Tenant{DemoTenant}},
		{"the example alone", LoadOptions{Path: example}, []Tenant{DemoTenant}},
		{"tenants_file in the file", LoadOptions{Path: withFile}, []Tenant{acme}},
		{"tenants_file from env", LoadOptions{Env: []string{"IMSHARD_TENANTS_FILE=" + file}}, []Tenant{acme}},
		{"the example beside a tenants_file", LoadOptions{Path: example, Env: []string{"IMSHARD_TENANTS_FILE=" + file}}, []Tenant{acme}},
		{"IMSHARD_TENANTS", LoadOptions{Env: []string{`IMSHARD_TENANTS=[{"id":"acme","jwt_secret":"acme-secret"}]`}}, []Tenant{acme}},
		{"tenants in the file", LoadOptions{Path: inline}, []Tenant{acme}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustLoad(t, tt.opts).Tenants; !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("tenants = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestChanged(t *testing.T) {
	a, b := Default(), Default()
	if got := Changed(&a, &b); len(got) != 0 {
		t.Fatalf("Changed(default, default) = %v", got)
	}
	b.Kafka.Brokers = nil // nil and empty are the same list
	b.HTTP.Addr = "127.0.0.1:1"
	b.Log.Level = "debug"
	b.Tenants = append(slices.Clone(b.Tenants), Tenant{ID: "acme", JWTSecret: "acme-secret"})
	b.Persist.BatchSize = 7
	want := []string{"http.addr", "log.level", "tenants", "persist.batch_size"}
	if got := Changed(&a, &b); !slices.Equal(got, want) {
		t.Fatalf("Changed = %v, want %v", got, want)
	}
}
