package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imshard/imshard/test/testenv"
)

// readOnlyCommands are the commands that only look, with the exit code
// each gives for a tenant whose database does not exist yet.
var readOnlyCommands = []struct {
	args []string
	code int
}{
	{[]string{"shard", "list"}, 1},
	{[]string{"shard", "list", "--output=json"}, 1},
	{[]string{"route", "check"}, 3},
	{[]string{"route", "check", "--output=json"}, 3},
	{[]string{"migrate", "status"}, 1},
	{[]string{"migrate", "status", "--output=json"}, 1},
	{[]string{"dlq", "list"}, 1},
	{[]string{"dlq", "list", "--output=json"}, 1},
	{[]string{"config", "check"}, 0},
	{[]string{"config", "check", "--output=json"}, 0},
}

// TestReadOnlyCommandsCreateNothing: a command that only looks (list,
// status, check without --fix, dlq list, config check) run for a tenant
// that has no database yet says what is missing and exits non-zero, and
// afterwards there is still no database, no Redis key of the tenant and no
// in-process Kafka log.
func TestReadOnlyCommandsCreateNothing(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	kafkaDir := filepath.Join(t.TempDir(), "kafka")
	cfg := tenantConfig(t, tenant, "kafka: {data_dir: "+kafkaDir+"}\n")
	for _, c := range readOnlyCommands {
		code, stdout, stderr := runCLIApart(t, nil, append([]string{"--config", cfg}, c.args...)...)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", c.args, code, c.code, stdout, stderr)
		}
		if c.code != 0 && !strings.Contains(stdout+stderr, "does not exist") {
			t.Errorf("%v: does not say what is missing:\n%s%s", c.args, stdout, stderr)
		}
	}
	admin, err := sql.Open("mysql", testenv.MySQLAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE ?", "%"+tenant+"%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("read-only commands created the tenant's database")
	}
	rdb := testenv.Redis(t)
	keys, err := rdb.Do(context.Background(), rdb.B().Keys().Pattern("*{"+tenant+"}*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("read-only commands wrote Redis keys: %v", keys)
	}
	if _, err := os.Stat(kafkaDir); err == nil {
		t.Errorf("dlq list created the in-process Kafka log %s", kafkaDir)
	}
}

// TestScriptsGetJSON: every list, status and check command prints, with
// --output=json, one JSON document on stdout with the fields
// docs/operations.md ("Output for scripts") lists, and a one-shot command
// logs nothing below a warning on stderr unless --log-level asks.
func TestScriptsGetJSON(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "kafka: {data_dir: "+t.TempDir()+"}\n")
	// log.level is the servers' setting: info here must not make a one-shot command chatty
	env := []string{"IMSHARD_LOG_LEVEL=info", "IMSHARD_LOG_FORMAT=json"}
	if code, out := runCLI(t, nil, "--config", cfg, "shard", "ensure"); code != 0 {
		t.Fatalf("shard ensure: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		top  []string // the document's keys
		item string   // a key whose value is a list of objects…
		keys []string // …each with these fields
	}{
		{[]string{"shard", "list"}, []string{"errors", "shards"}, "shards",
			[]string{"tenant", "month", "table", "status", "exists", "active", "rows", "min_created_at", "max_created_at"}},
		{[]string{"route", "check"}, []string{"tenants"}, "tenants",
			[]string{"tenant", "topics_checked", "differences", "fixed", "migration", "legacy_topics"}},
		{[]string{"migrate", "status"}, []string{"tenants"}, "tenants",
			[]string{"tenant", "state", "legacy_rows", "rows_read", "verify_differences", "differences", "locked", "last_error"}},
		{[]string{"dlq", "list"}, []string{"compensation", "dead_letters"}, "", nil},
		{[]string{"config", "check"}, []string{"http", "log", "mysql", "redis", "shard", "tenants"}, "", nil},
	} {
		code, stdout, stderr := runCLIApart(t, env, append(append([]string{"--config", cfg}, c.args...), "--output=json")...)
		if code != 0 {
			t.Errorf("%v --output=json: exit %d\n%s%s", c.args, code, stdout, stderr)
			continue
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
			t.Errorf("%v --output=json: not one JSON document: %v\n%s", c.args, err, stdout)
			continue
		}
		for _, k := range c.top {
			if _, ok := doc[k]; !ok {
				t.Errorf("%v --output=json lacks %q: %s", c.args, k, stdout)
			}
		}
		if c.item != "" {
			items, _ := doc[c.item].([]any)
			if len(items) == 0 {
				t.Errorf("%v --output=json: %q is empty: %s", c.args, c.item, stdout)
			}
			for _, it := range items {
				obj, _ := it.(map[string]any)
				for _, k := range c.keys {
					if _, ok := obj[k]; !ok {
						t.Errorf("%v --output=json: %q items lack %q: %s", c.args, c.item, k, stdout)
					}
				}
			}
		}
		if strings.Contains(stderr, `"level":"info"`) {
			t.Errorf("%v: a one-shot command logged at info without --log-level:\n%s", c.args, stderr)
		}
	}
	_, _, stderr := runCLIApart(t, env, "--config", cfg, "--log-level=info", "shard", "list")
	if !strings.Contains(stderr, `"level":"info"`) {
		t.Errorf("--log-level=info must show the info lines:\n%s", stderr)
	}
	if code, _, stderr := runCLIApart(t, nil, "--config", cfg, "shard", "list", "--output=yaml"); code != 2 || !strings.Contains(stderr, "--output") {
		t.Errorf("--output=yaml: exit %d, want 2 naming --output\n%s", code, stderr)
	}
}
