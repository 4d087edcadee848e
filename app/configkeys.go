package app

import (
	"slices"
	"strings"

	"github.com/imshard/imshard/config"
)

// configKey names configuration keys as config.Keys lists them: one key
// ("shard.patrol_interval") or a section ("persist", "kafka.tls") standing
// for every key under it.
type configKey string

// covers reports whether key is k or lies under it.
func (k configKey) covers(key string) bool {
	return key == string(k) || strings.HasPrefix(key, string(k)+".")
}

// keysRead is which configuration keys each module reads; a process uses
// the keys of the modules it runs. A reload names a changed key as needing
// a restart only when the process uses it and cannot apply it live, so a
// persist process is never told to restart for a stream limit it does not
// read, nor a query process for a persist batch size.
var keysRead = map[string][]configKey{
	// Ops is in every process: its listener shares the http timeouts, and
	// the drain, the logger and the tenant set (with each tenant's limits)
	// belong to the process
	Ops:      {"metrics.addr", "log", "tenants", "tenants_file", "limits", "http.shutdown_grace", "http.read_header_timeout", "http.read_timeout", "http.write_timeout", "http.idle_timeout"},
	MySQL:    {"mysql"},
	Redis:    {"redis"},
	Kafka:    {"kafka.brokers", "kafka.topic", "kafka.dlq_topic", "kafka.changes_topic", "kafka.partitions", "kafka.data_dir", "kafka.replication_factor", "kafka.sasl", "kafka.tls"},
	Keys:     {"auth.jwks_refresh_interval"},
	Routing:  {"shard.auto_advance", "send.seq_reserve_step", "send.produce_timeout", "send.acl_cache_ttl"},
	ReadPath: {"send.acl_cache_ttl", "hot_cache.local_topics", "hot_cache.local_max_age"},
	// the archive belongs to the shard manager: `shard archive` runs with its keys
	ShardMgr: {"shard", "send.produce_timeout", "archive"},
	API:      {"http"},
	Send:     {"send", "hot_cache.ttl", "hot_cache.max_per_topic", "kafka.topic", "auth"},
	Changes:  {"send.recall_window", "send.max_body_bytes", "auth"},
	Persist:  {"persist", "kafka.topic", "kafka.dlq_topic", "kafka.group"},
	Query:    {"auth"},
	Inbox:    {"auth", "hot_cache.local_users", "hot_cache.remembered_max_age", "hot_cache.local_routes"},
	Stream:   {"auth", "stream"},
	// the migrator syncs a tenant's months through the shard manager
	Migrate: {"migrate", "shard.lock_ttl", "shard.auto_advance", "shard.sealing_days"},
	Relay:   {"relay", "kafka.changes_topic"},
	All:     nil,
}

// liveKeys are the keys a reload applies to a running process; a change to
// any other key a process uses waits for its restart.
var liveKeys = []configKey{"log.level", "tenants", "tenants_file", "limits"}

// KeysUsed lists the configuration keys a process running roles reads, in
// the order of config.Keys.
func KeysUsed(roles ...string) ([]string, error) {
	modules, err := StartOrder(roles)
	if err != nil {
		return nil, err
	}
	return usedBy(modules, config.Keys()), nil
}

// usedBy keeps the keys of keys that one of modules reads.
func usedBy(modules, keys []string) []string {
	var out []string
	for _, key := range keys {
		if slices.ContainsFunc(modules, func(m string) bool { return coversAny(keysRead[m], key) }) {
			out = append(out, key)
		}
	}
	return out
}

// restartNeeded lists the keys of changed that modules read and a reload
// cannot apply.
func restartNeeded(modules, changed []string) []string {
	var out []string
	for _, key := range usedBy(modules, changed) {
		if !coversAny(liveKeys, key) {
			out = append(out, key)
		}
	}
	return out
}

func coversAny(keys []configKey, key string) bool {
	return slices.ContainsFunc(keys, func(k configKey) bool { return k.covers(key) })
}
