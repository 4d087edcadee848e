package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits that are easier to review as names than as literals in the checks.
const (
	maxBodyLimit   = 16 << 20 // a message body larger than this belongs in object storage
	maxPartitions  = 1024
	maxTopicLen    = 249 // Kafka's own limit on topic names
	maxMonthsAhead = 24
	maxSealingDays = 90
)

// Validate checks every key, whatever roles the process runs: a value one
// process refuses, every process refuses with the same message — at start,
// on a reload and in `imshard config check` alike — so a split deployment
// sharing one file never finds a setting accepted by the processes that
// ignore it and refused by the one that reads it. Every problem is reported
// at once as errors.Join of *KeyError.
func (c *Config) Validate() error {
	var p problems
	c.validateHTTP(&p)
	p.durRange("auth.max_token_ttl", c.Auth.MaxTokenTTL, time.Minute, 366*24*time.Hour)
	// at most half the hour after which ImshardJWKSStale fires, so one
	// failed fetch alone never raises it
	p.durRange("auth.jwks_refresh_interval", c.Auth.JWKSRefreshInterval, time.Second, 30*time.Minute)
	p.listenAddr("metrics.addr", c.Metrics.Addr)
	p.oneOf("log.level", c.Log.Level, "trace", "debug", "info", "warn", "error")
	p.oneOf("log.format", c.Log.Format, "auto", "json", "console")
	c.validateMySQL(&p)
	c.validateRedis(&p)
	c.validateKafka(&p)
	if len(c.Tenants) == 0 {
		p.add("tenants", "at least one tenant is required (in tenants or tenants_file)")
	}
	p = append(p, tenantProblems(c.Tenants, "")...)
	c.validateShard(&p)
	c.validateSend(&p)
	c.validateHotCache(&p)
	c.validateStream(&p)
	c.validatePersist(&p)
	c.validateRelay(&p)
	p.intRange("migrate.batch_size", int64(c.Migrate.BatchSize), 1, 100_000)
	p.intRange("migrate.rows_per_second", int64(c.Migrate.RowsPerSecond), 0, 1<<31-1)
	p.limits("limits", c.Limits)
	c.validateArchive(&p)
	return errors.Join(p...)
}

func (c *Config) validateHTTP(p *problems) {
	h := c.HTTP
	p.listenAddr("http.addr", h.Addr)
	p.durAtLeast("http.shutdown_delay", h.ShutdownDelay, 0)
	p.durAtLeast("http.shutdown_grace", h.ShutdownGrace, 0)
	p.durRange("http.read_header_timeout", h.ReadHeaderTimeout, 100*time.Millisecond, time.Hour)
	p.durRange("http.read_timeout", h.ReadTimeout, h.ReadHeaderTimeout, time.Hour)
	p.durRange("http.write_timeout", h.WriteTimeout, 100*time.Millisecond, time.Hour)
	p.durRange("http.idle_timeout", h.IdleTimeout, 100*time.Millisecond, time.Hour)
	p.intRange("http.max_conns", int64(h.MaxConns), 1, 1<<20)
	p.intRange("http.max_conns_per_client", int64(h.MaxConnsPerClient), 0, int64(h.MaxConns))
	// a send waits up to the produce timeout for Kafka and up to 5 s
	// more for its Redis bookkeeping before it answers
	if h.WriteTimeout < c.Send.ProduceTimeout+6*time.Second {
		p.add("http.write_timeout", "must be at least send.produce_timeout + 6s (%s), got %s",
			fmtDuration(c.Send.ProduceTimeout+6*time.Second), fmtDuration(h.WriteTimeout))
	}
}

func (c *Config) validateRedis(p *problems) {
	r := c.Redis
	if len(r.Addrs) == 0 {
		p.add("redis.addrs", "at least one address is required")
	}
	for i, a := range r.Addrs {
		key := fmt.Sprintf("redis.addrs[%d]", i)
		path, socket := RedisSocket(a)
		switch {
		case socket && !filepath.IsAbs(path):
			p.add(key, "a unix socket needs an absolute path, got %q", a)
		case socket && len(r.Addrs) > 1:
			p.add(key, "a unix socket names one server, not a member of a cluster: give it alone")
		case !socket:
			p.dialAddr(key, a)
		}
	}
	p.durAtLeast("redis.dial_timeout", r.DialTimeout, 0)
	if !KeyPrefixPattern.MatchString(r.KeyPrefix) {
		p.add("redis.key_prefix", "invalid %q: must match %s (for example \"prod:\")", r.KeyPrefix, KeyPrefixPattern)
	}
	c.validateRedisAuth(p)
}

func (c *Config) validateShard(p *problems) {
	s := c.Shard
	p.intRange("shard.months_ahead", int64(s.MonthsAhead), 0, maxMonthsAhead)
	p.intRange("shard.sealing_days", int64(s.SealingDays), 0, maxSealingDays)
	p.durAtLeast("shard.patrol_interval", s.PatrolInterval, time.Minute)
	// The lock is renewed on a timer; below a second renewal jitter alone loses it.
	p.durAtLeast("shard.lock_ttl", s.LockTTL, time.Second)
}

func (c *Config) validateSend(p *problems) {
	s := c.Send
	p.intRange("send.max_body_bytes", s.MaxBodyBytes, 1024, maxBodyLimit)
	p.durAtLeast("send.recall_window", s.RecallWindow, 0)
	// Shorter than a client's retry horizon would let a retried send be stored twice.
	p.durAtLeast("send.idempotency_ttl", s.IdempotencyTTL, time.Minute)
	p.intRange("send.seq_reserve_step", s.SeqReserveStep, 1, 1_000_000)
	p.durAbove("send.produce_timeout", s.ProduceTimeout, 0)
	p.intRange("send.max_mentions", int64(s.MaxMentions), 0, 1<<31-1)
	p.durAtLeast("send.acl_cache_ttl", s.ACLCacheTTL, 0)
	p.durAtLeast("send.max_clock_backward", s.MaxClockBackward, 0)
}

func (c *Config) validateHotCache(p *problems) {
	h := c.HotCache
	p.durAtLeast("hot_cache.ttl", h.TTL, 0)
	p.intRange("hot_cache.max_per_topic", int64(h.MaxPerTopic), 0, 1<<31-1)
	p.intRange("hot_cache.local_topics", int64(h.LocalTopics), 0, 1<<20)
	p.durAtLeast("hot_cache.local_max_age", h.LocalMaxAge, 0)
	p.intRange("hot_cache.local_users", int64(h.LocalUsers), 0, 1<<24)
	p.durAtLeast("hot_cache.remembered_max_age", h.RememberedMaxAge, 0)
	p.intRange("hot_cache.local_routes", int64(h.LocalRoutes), 0, 1<<24)
}

func (c *Config) validateStream(p *problems) {
	st := c.Stream
	p.intRange("stream.max_connections", int64(st.MaxConnections), 0, 1<<31-1)
	p.intRange("stream.max_topics", int64(st.MaxTopics), 1, 100_000)
	p.intRange("stream.send_queue", int64(st.SendQueue), 1, 1<<20)
	p.durAbove("stream.write_timeout", st.WriteTimeout, 0)
	p.durAbove("stream.ping_interval", st.PingInterval, 0)
	p.durAtLeast("stream.idle_timeout", st.IdleTimeout, st.PingInterval)
	p.durAbove("stream.acl_check_interval", st.ACLCheckInterval, 0)
	p.intRange("stream.max_catchups", int64(st.MaxCatchups), 1, 1<<20)
	p.intRange("stream.max_catchup_changes", int64(st.MaxCatchupChanges), 1, 1<<20)
	p.intRange("stream.max_connections_per_user", int64(st.MaxConnectionsPerUser), 0, 1<<20)
}

func (c *Config) validateRelay(p *problems) {
	r := c.Relay
	p.intRange("relay.batch_size", int64(r.BatchSize), 1, 10_000)
	p.durRange("relay.poll_interval", r.PollInterval, 10*time.Millisecond, time.Minute)
	p.intRange("relay.workers", int64(r.Workers), 1, 256)
	p.durRange("relay.produce_timeout", r.ProduceTimeout, time.Second, 10*time.Minute)
}

func (c *Config) validatePersist(p *problems) {
	ps := c.Persist
	p.intRange("persist.batch_size", int64(ps.BatchSize), 1, 10_000)
	p.durRange("persist.batch_linger", ps.BatchLinger, 0, 10*time.Second)
	p.intRange("persist.max_retries", int64(ps.MaxRetries), 0, 1<<31-1)
	p.durAtLeast("persist.dedup_retention", ps.DedupRetention, 0)
	p.durAtLeast("persist.retry_backoff", ps.RetryBackoff, 0)
	p.durAtLeast("persist.retry_backoff_max", ps.RetryBackoffMax, ps.RetryBackoff)
	p.intRange("persist.max_parked", int64(ps.MaxParked), 1, 1<<31-1)
}

// ValidateServe checks what only a long-running process of a split
// deployment must refuse, on top of Validate: roles are those of `serve
// --roles` ("all", or any of send, query, stream, persist, shardmgr, migrate). A process that
// runs every role (all) is the single-machine setup and passes.
//
//   - kafka.brokers empty starts an in-process Kafka private to this process:
//     a send-only process would acknowledge messages no persist process ever
//     reads, and a persist-only one would wait for events that never come.
//     With both roles in one process the private broker is the whole bus.
//   - the demo secret is public, so a tenant using it would accept anyone's
//     token.
func (c *Config) ValidateServe(roles ...string) error {
	if len(roles) == 0 || slices.Contains(roles, "all") {
		return nil
	}
	var p problems
	send, persist := slices.Contains(roles, "send"), slices.Contains(roles, "persist")
	if len(c.Kafka.Brokers) == 0 && send != persist {
		role, other := "send", "persist"
		if persist {
			role, other = "persist", "send"
		}
		p.add("kafka.brokers", "is empty, so this %s process would start an in-process Kafka of its own that no %s process shares; "+
			"list the cluster's brokers (for development, run `imshard devkafka` and point kafka.brokers at its address)", role, other)
	}
	for i, t := range c.Tenants {
		for _, k := range t.HS256Keys(i) {
			if IsDemoSecret(k.Secret) {
				p.add(k.Key, "tenant %q uses a public demo secret, accepted only by `imshard all`; give it a secret of its own", t.ID)
			}
		}
	}
	return errors.Join(p...)
}

func (c *Config) validateMySQL(p *problems) {
	m := c.MySQL
	// The template is only needed by tenants without their own DSN.
	usesTemplate := slices.ContainsFunc(c.Tenants, func(t Tenant) bool { return t.DSN == "" })
	if usesTemplate && !strings.Contains(m.DSNTemplate, "{tenant}") {
		p.add("mysql.dsn_template", "must contain {tenant} (or every tenant needs its own dsn)")
	}
	p.intRange("mysql.max_open_conns", int64(m.MaxOpenConns), 1, 1<<31-1)
	// Above max_open_conns is harmless: database/sql lowers it to that.
	p.intRange("mysql.max_idle_conns", int64(m.MaxIdleConns), 0, 1<<31-1)
	p.durAtLeast("mysql.conn_max_idle_time", m.ConnMaxIdleTime, 0)
	p.intRange("mysql.max_open_tenants", int64(m.MaxOpenTenants), 1, 1<<31-1)
	p.tlsSection("mysql.tls", m.TLS)
	c.validatePlacement(p)
	if m.TLS.Enabled {
		// One setting for every tenant: a DSN choosing its own TLS would make
		// which one applies a guess.
		dsns := []struct{ key, dsn string }{{"mysql.dsn_template", m.DSNTemplate}}
		for i, t := range c.Tenants {
			dsns = append(dsns, struct{ key, dsn string }{fmt.Sprintf("tenants[%d].dsn", i), t.DSN})
		}
		for _, d := range dsns {
			if dsnParam(d.dsn, "tls") {
				p.add(d.key, "sets tls= while mysql.tls is enabled: remove it, mysql.tls applies to every tenant")
			}
		}
	}
}

// dsnParam reports whether a go-sql-driver DSN carries the named parameter.
func dsnParam(dsn, name string) bool {
	_, query, ok := strings.Cut(dsn[strings.LastIndexByte(dsn, '/')+1:], "?")
	if !ok {
		return false
	}
	for kv := range strings.SplitSeq(query, "&") {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

func (c *Config) validateRedisAuth(p *problems) {
	r := c.Redis
	if r.Username != "" && r.Password == "" {
		p.add("redis.password", "is required with redis.username")
	}
	p.tlsSection("redis.tls", r.TLS)
	if len(r.Addrs) == 1 && r.TLS.Enabled {
		if _, socket := RedisSocket(r.Addrs[0]); socket {
			p.add("redis.tls.enabled", "a unix socket does not use TLS: disable it or give host:port addresses")
		}
	}
}

func (c *Config) validateKafka(p *problems) {
	k := c.Kafka
	for i, b := range k.Brokers {
		p.dialAddr(fmt.Sprintf("kafka.brokers[%d]", i), b)
	}
	p.topic("kafka.topic", k.Topic)
	p.topic("kafka.dlq_topic", k.DLQTopic)
	if k.Topic != "" && k.Topic == k.DLQTopic {
		// Dead letters written to the main topic would be consumed and fail again forever.
		p.add("kafka.dlq_topic", "must differ from kafka.topic")
	}
	p.topic("kafka.changes_topic", k.ChangesTopic)
	if k.ChangesTopic != "" && (k.ChangesTopic == k.Topic || k.ChangesTopic == k.DLQTopic) {
		// persist would take change events for messages and dead-letter them
		p.add("kafka.changes_topic", "must differ from kafka.topic and kafka.dlq_topic")
	}
	if k.Group == "" {
		p.add("kafka.group", "must not be empty")
	}
	p.intRange("kafka.partitions", int64(k.Partitions), 1, maxPartitions)
	p.intRange("kafka.replication_factor", int64(k.ReplicationFactor), 1, 1<<15-1)
	p.tlsSection("kafka.tls", k.TLS)
	s := k.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" {
			p.add("kafka.sasl.mechanism", "is empty but kafka.sasl.username or password is set: name the mechanism (%s|%s|%s)", SASLPlain, SASLScramSHA256, SASLScramSHA512)
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.Username == "" {
			p.add("kafka.sasl.username", "is required with kafka.sasl.mechanism %s", s.Mechanism)
		}
		if s.Password == "" {
			p.add("kafka.sasl.password", "is required with kafka.sasl.mechanism %s", s.Mechanism)
		}
		if s.Mechanism == SASLPlain && !k.TLS.Enabled {
			p.add("kafka.sasl.mechanism", "PLAIN sends the password in clear: enable kafka.tls (or use SCRAM)")
		}
	default:
		p.add("kafka.sasl.mechanism", "must be one of %s|%s|%s or empty, got %q", SASLPlain, SASLScramSHA256, SASLScramSHA512, s.Mechanism)
	}
	if len(k.Brokers) == 0 {
		// The in-process stand-in speaks no TLS and authenticates its own
		// clients only, with a secret it draws at each start.
		if k.TLS.Enabled {
			p.add("kafka.tls.enabled", "needs kafka.brokers: the in-process Kafka speaks no TLS")
		}
		if s.Mechanism != "" {
			p.add("kafka.sasl.mechanism", "needs kafka.brokers: the in-process Kafka draws its own SASL secret at each start")
		}
	}
}

// tenantProblems checks ids, uniqueness and secrets; where names the source for
// lists read from a tenants file.
func tenantProblems(list []Tenant, where string) []error {
	var p problems
	first, secretOf := map[string]int{}, map[string]int{}
	for i, t := range list {
		key := fmt.Sprintf("tenants[%d]", i)
		switch j, dup := first[t.ID]; {
		case !TenantIDPattern.MatchString(t.ID):
			p.add(key+".id", "invalid tenant id %q%s: must match %s", t.ID, where, TenantIDPattern)
		case dup:
			p.add(key+".id", "duplicate tenant id %q%s (first at tenants[%d])", t.ID, where, j)
		default:
			first[t.ID] = i
		}
		p.tenantLimits(key+".limits", t.Limits)
		p.intRange(key+".retention_months", int64(t.RetentionMonths), 0, MaxRetentionMonths)
		p.tenantArchive(key, t)
		keyProblems(&p, t, key, where)
		// The secrets are never echoed: they would end up in logs.
		for _, k := range t.HS256Keys(i) {
			if len(k.Secret) < minSecretLen {
				p.add(k.Key, "must be at least %d bytes%s", minSecretLen, where)
			}
			// Tokens are verified with the keys of the tenant they name, so
			// a secret two tenants share lets either one's issuer act in the
			// other. (A tenant listed twice is already refused as such.)
			if j, shared := secretOf[k.Secret]; shared && list[j].ID != t.ID {
				p.add(k.Key, "is the secret of tenants[%d] too%s: each tenant needs a secret of its own, or either one's tokens act in the other", j, where)
			} else if !shared {
				secretOf[k.Secret] = i
			}
		}
	}
	return p
}

// problems collects every *KeyError so one run shows an operator all of them.
type problems []error

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, &KeyError{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (p *problems) intRange(key string, v, lo, hi int64) {
	if v < lo || v > hi {
		p.add(key, "must be between %d and %d, got %d", lo, hi, v)
	}
}

func (p *problems) durAtLeast(key string, v, lo time.Duration) {
	if v < lo {
		p.add(key, "must be at least %s, got %s", fmtDuration(lo), fmtDuration(v))
	}
}

func (p *problems) durAbove(key string, v, lo time.Duration) {
	if v <= lo {
		p.add(key, "must be greater than %s, got %s", fmtDuration(lo), fmtDuration(v))
	}
}

func (p *problems) durRange(key string, v, lo, hi time.Duration) {
	if v < lo || v > hi {
		p.add(key, "must be between %s and %s, got %s", fmtDuration(lo), fmtDuration(hi), fmtDuration(v))
	}
}

func (p *problems) oneOf(key, v string, allowed ...string) {
	if !slices.Contains(allowed, v) {
		p.add(key, "must be one of %s, got %q", strings.Join(allowed, "|"), v)
	}
}

// listenAddr allows an empty host (all interfaces) and port 0 (any free port, which
// tests use).
func (p *problems) listenAddr(key, addr string) {
	if _, _, err := splitAddr(addr); err != "" {
		p.add(key, "%s", err)
	}
}

// dialAddr needs a host and a real port.
func (p *problems) dialAddr(key, addr string) {
	host, port, err := splitAddr(addr)
	switch {
	case err != "":
		p.add(key, "%s", err)
	case host == "":
		p.add(key, "must name a host, got %q", addr)
	case port == 0:
		p.add(key, "port must not be 0, got %q", addr)
	}
}

func splitAddr(addr string) (string, int, string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Sprintf("must be host:port, got %q", addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Sprintf("port must be a number 0..65535, got %q", addr)
	}
	return host, n, ""
}

// topic checks Kafka's legal topic names, so a typo fails here rather than at the
// first produce.
func (p *problems) topic(key, name string) {
	if name == "" {
		p.add(key, "must not be empty")
		return
	}
	ok := len(name) <= maxTopicLen && name != "." && name != ".."
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			ok = false
		}
	}
	if !ok {
		p.add(key, "invalid Kafka topic %q: up to %d of [a-zA-Z0-9._-]", name, maxTopicLen)
	}
}
