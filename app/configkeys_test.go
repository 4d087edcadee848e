package app

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/testenv"
)

// TestKeysReadTableIsComplete: every module has its row, every entry names
// configuration keys that exist, and every key is read by some module, so
// no change can go unannounced in every process.
func TestKeysReadTableIsComplete(t *testing.T) {
	keys := config.Keys()
	for m := range deps {
		if _, ok := keysRead[m]; !ok {
			t.Errorf("module %s has no row in keysRead", m)
		}
	}
	for m, entries := range keysRead {
		if _, ok := deps[m]; !ok {
			t.Errorf("keysRead names %s, which is no module", m)
		}
		for _, k := range entries {
			if !slices.ContainsFunc(keys, k.covers) {
				t.Errorf("keysRead[%s]: %q names no configuration key", m, k)
			}
		}
	}
	for _, k := range liveKeys {
		if !slices.ContainsFunc(keys, k.covers) {
			t.Errorf("liveKeys: %q names no configuration key", k)
		}
	}
	all, err := KeysUsed(All)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(all, keys) {
		t.Errorf("keys no module reads: %v", slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return slices.Contains(all, k) }))
	}
}

// TestKeysUsedByRole: each role reads what its modules read — the keys of
// another role's modules only where it runs them too.
func TestKeysUsedByRole(t *testing.T) {
	tests := []struct {
		role         string
		uses, ignore []string
	}{
		{Persist, []string{"persist.batch_size", "kafka.group", "kafka.brokers", "shard.auto_advance", "mysql.dsn_template", "log.format"},
			[]string{"shard.patrol_interval", "shard.months_ahead", "stream.max_topics", "http.addr", "http.max_conns", "http.shutdown_delay", "auth.max_token_ttl", "send.idempotency_ttl", "hot_cache.ttl", "migrate.batch_size"}},
		{ShardMgr, []string{"shard.patrol_interval", "shard.months_ahead", "redis.addrs", "metrics.addr"},
			[]string{"persist.batch_size", "kafka.brokers", "kafka.group", "stream.max_topics", "http.addr", "migrate.batch_size"}},
		{Send, []string{"send.idempotency_ttl", "send.recall_window", "hot_cache.ttl", "kafka.topic", "http.addr", "auth.max_token_ttl"},
			[]string{"kafka.group", "persist.batch_size", "shard.patrol_interval", "stream.max_topics", "hot_cache.local_users"}},
		{Query, []string{"stream.max_topics", "hot_cache.local_users", "hot_cache.local_topics", "http.addr", "auth.max_token_ttl"},
			[]string{"kafka.brokers", "send.idempotency_ttl", "persist.batch_size", "shard.patrol_interval"}},
		{Stream, []string{"stream.max_topics", "hot_cache.local_topics", "http.max_conns"},
			[]string{"hot_cache.local_users", "kafka.brokers", "persist.batch_size"}},
		{Migrate, []string{"migrate.batch_size", "shard.lock_ttl", "shard.sealing_days"},
			[]string{"shard.patrol_interval", "kafka.brokers", "persist.batch_size", "http.addr"}},
	}
	for _, tt := range tests {
		t.Run(tt.role, func(t *testing.T) {
			used, err := KeysUsed(tt.role)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range tt.uses {
				if !slices.Contains(used, k) {
					t.Errorf("a %s process does not read %s", tt.role, k)
				}
			}
			for _, k := range tt.ignore {
				if slices.Contains(used, k) {
					t.Errorf("a %s process reads %s", tt.role, k)
				}
			}
		})
	}
}

// TestRestartNeededOnlyForKeysTheModulesRead: of the changed keys, those
// the modules read and no reload applies need a restart; live keys and the
// keys of modules the process does not run do not.
func TestRestartNeededOnlyForKeysTheModulesRead(t *testing.T) {
	persist, err := StartOrder([]string{Persist})
	if err != nil {
		t.Fatal(err)
	}
	changed := []string{"log.level", "tenants", "tenants_file", "shard.patrol_interval", "stream.max_topics", "persist.batch_size", "kafka.group"}
	if got, want := restartNeeded(persist, changed), []string{"persist.batch_size", "kafka.group"}; !slices.Equal(got, want) {
		t.Fatalf("restartNeeded(persist) = %v, want %v", got, want)
	}
	shardmgr, err := StartOrder([]string{ShardMgr})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := restartNeeded(shardmgr, changed), []string{"shard.patrol_interval"}; !slices.Equal(got, want) {
		t.Fatalf("restartNeeded(shardmgr) = %v, want %v", got, want)
	}
}

// TestReloadWarnsRestartOnlyForKeysTheProcessUses: a shard-manager process
// told of changes only other roles read (a persist batch size, a stream
// limit) logs no "restart needed"; a change to a key it reads and cannot
// apply live (shard.patrol_interval) is logged as needing one, with the key.
func TestReloadWarnsRestartOnlyForKeysTheProcessUses(t *testing.T) {
	tenant := testenv.NewTenant(t)
	cfg := localConfig(tenant)
	cfg.Shard.PatrolInterval = time.Hour
	var log testenv.LogBuffer
	a := New(cfg, zerolog.New(&log).Level(zerolog.InfoLevel))
	if err := a.Start(context.Background(), []string{ShardMgr}); err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	others := *cfg
	others.Persist.BatchSize = cfg.Persist.BatchSize + 1
	others.Stream.MaxTopics = cfg.Stream.MaxTopics + 1
	a.Reload(&others)
	if out := log.String(); strings.Contains(out, "restart needed") {
		t.Fatalf("changes only other roles read were logged as needing a restart:\n%s", out)
	}

	own := others
	own.Shard.PatrolInterval = 2 * time.Hour
	a.Reload(&own)
	out := log.String()
	if !strings.Contains(out, `"key":"shard.patrol_interval","message":"configuration key changed: restart needed"`) {
		t.Fatalf("shard.patrol_interval, read by the shard manager, was not logged as needing a restart:\n%s", out)
	}
	if n := strings.Count(out, "restart needed"); n != 1 {
		t.Fatalf("%d keys logged as needing a restart, want only shard.patrol_interval:\n%s", n, out)
	}
}
