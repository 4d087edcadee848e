// Package config is the one typed configuration tree of the imshard binary.
//
// Values come from built-in defaults, an optional YAML file, IMSHARD_* environment
// variables and command flags, in rising precedence (see Load). Every key has a
// default, so an empty file is a complete local setup; Validate then checks every key
// the same way, whatever roles the process runs.
package config

import (
	"regexp"
	"slices"
	"strings"
	"time"
)

// Config is the whole configuration; the mapstructure tags are the key names of
// the file, the environment (IMSHARD_ + key upper-cased, dots → _) and flags.
type Config struct {
	HTTP        HTTP     `mapstructure:"http"`
	Auth        Auth     `mapstructure:"auth"`
	Metrics     Metrics  `mapstructure:"metrics"`
	Log         Log      `mapstructure:"log"`
	MySQL       MySQL    `mapstructure:"mysql"`
	Redis       Redis    `mapstructure:"redis"`
	Kafka       Kafka    `mapstructure:"kafka"`
	Tenants     []Tenant `mapstructure:"tenants"`
	TenantsFile string   `mapstructure:"tenants_file"`
	Shard       Shard    `mapstructure:"shard"`
	Send        Send     `mapstructure:"send"`
	HotCache    HotCache `mapstructure:"hot_cache"`
	Stream      Stream   `mapstructure:"stream"`
	Persist     Persist  `mapstructure:"persist"`
	Relay       Relay    `mapstructure:"relay"`
	Migrate     Migrate  `mapstructure:"migrate"`
	Limits      Limits   `mapstructure:"limits"`
	Archive     Archive  `mapstructure:"archive"`
}

// HTTP is the API listener. On a stop signal /readyz answers 503 for
// ShutdownDelay while the API still serves, so a load balancer stops sending
// before the listener closes; in-flight requests then have ShutdownGrace.
// The timeouts bound what a slow or idle client costs (the operations
// listener uses them too); MaxConns caps the API's connections at once.
type HTTP struct {
	Addr              string        `mapstructure:"addr"`
	ShutdownDelay     time.Duration `mapstructure:"shutdown_delay"`
	ShutdownGrace     time.Duration `mapstructure:"shutdown_grace"`
	ReadHeaderTimeout time.Duration `mapstructure:"read_header_timeout"`
	ReadTimeout       time.Duration `mapstructure:"read_timeout"`
	WriteTimeout      time.Duration `mapstructure:"write_timeout"`
	IdleTimeout       time.Duration `mapstructure:"idle_timeout"`
	MaxConns          int           `mapstructure:"max_conns"`
	// MaxConnsPerClient caps the API connections of one client address (0
	// = no cap): one client cannot take every one of MaxConns. Leave it 0
	// behind a proxy, where every connection comes from the proxy.
	MaxConnsPerClient int `mapstructure:"max_conns_per_client"`
}

// Auth is how API credentials (the tenants' JWTs) are checked.
type Auth struct {
	// MaxTokenTTL is the longest lifetime a token may have: exp − iat, or
	// exp − now for a token without iat.
	MaxTokenTTL time.Duration `mapstructure:"max_token_ttl"`
	// JWKSRefreshInterval is how often each tenant's jwks_url is fetched
	// again, and the least time between two fetches a token with an unknown
	// kid may cause: a flood of unknown kids costs one fetch per interval.
	JWKSRefreshInterval time.Duration `mapstructure:"jwks_refresh_interval"`
}

// Metrics is the listener for /metrics, /healthz and /readyz, kept apart from the
// API so probes keep answering while the API drains.
type Metrics struct {
	Addr string `mapstructure:"addr"`
}

// Log selects the zerolog level and output; "auto" means console on a TTY, JSON otherwise.
type Log struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// MySQL describes the per-tenant databases.
type MySQL struct {
	DSNTemplate     string        `mapstructure:"dsn_template"`
	MaxOpenConns    int           `mapstructure:"max_open_conns"`
	MaxIdleConns    int           `mapstructure:"max_idle_conns"`
	ConnMaxIdleTime time.Duration `mapstructure:"conn_max_idle_time"`
	// MaxOpenTenants caps how many tenant pools are open at once; beyond it the least
	// recently used pool is closed, so thousands of tenants do not exhaust MySQL's
	// max_connections.
	MaxOpenTenants int `mapstructure:"max_open_tenants"`
	// TLS applies to the connections of every tenant.
	TLS TLS `mapstructure:"tls"`
	// PlacementDSNs are the servers holding the tenants' placement records
	// (config/placement.go); PlacementPoll how often every process reads them.
	PlacementDSNs []string      `mapstructure:"placement_dsns"`
	PlacementPoll time.Duration `mapstructure:"placement_poll"`
}

// Redis holds the Redis endpoints; several addresses mean Redis Cluster.
type Redis struct {
	Addrs []string `mapstructure:"addrs"` // host:port each, or one "unix:/path" (RedisSocket)
	// KeyPrefix starts every Redis key and pub/sub channel of the
	// installation, so that two installations can share one Redis; empty
	// keeps the keys as they were before the setting existed. Read at start
	// only: keys written under another prefix are not found again.
	KeyPrefix string `mapstructure:"key_prefix"`
	// Username is a Redis 6+ ACL user; empty means the default user (AUTH with
	// the password alone).
	Username    string        `mapstructure:"username"`
	Password    string        `mapstructure:"password"`
	DialTimeout time.Duration `mapstructure:"dial_timeout"`
	TLS         TLS           `mapstructure:"tls"`
}

// RedisSocket reports whether a Redis address names a Unix socket
// ("unix:/run/redis/redis.sock": a server on the same machine, reached
// without the TCP stack) and returns its path.
func RedisSocket(addr string) (path string, ok bool) { return strings.CutPrefix(addr, "unix:") }

// Kafka holds the message bus settings. No brokers means the in-process kfake
// cluster, whose log lives in DataDir.
type Kafka struct {
	Brokers  []string `mapstructure:"brokers"`
	Topic    string   `mapstructure:"topic"`
	DLQTopic string   `mapstructure:"dlq_topic"`
	// ChangesTopic is the change feed: every recall, edit and delete for
	// everyone as a change event (docs/events.md), produced by the relay.
	ChangesTopic string `mapstructure:"changes_topic"`
	Group        string `mapstructure:"group"`
	Partitions   int    `mapstructure:"partitions"`
	DataDir      string `mapstructure:"data_dir"`
	// ReplicationFactor is only used when the service creates its topics on a real
	// cluster; kfake has a single broker.
	ReplicationFactor int  `mapstructure:"replication_factor"`
	SASL              SASL `mapstructure:"sasl"`
	TLS               TLS  `mapstructure:"tls"`
}

// SASL mechanisms the Kafka client speaks.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL is the Kafka client's authentication; an empty Mechanism means none.
type SASL struct {
	Mechanism string `mapstructure:"mechanism"`
	Username  string `mapstructure:"username"`
	Password  string `mapstructure:"password"`
}

// TLS is one client's TLS settings, the same for Kafka, Redis and MySQL. The
// server's certificate is always verified: against CAFile when set, else the
// system roots.
type TLS struct {
	Enabled bool   `mapstructure:"enabled"`
	CAFile  string `mapstructure:"ca_file"`
	// CertFile and KeyFile are a client certificate, for servers that require one.
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
	// ServerName is the name the server's certificate must carry; empty means
	// the host of the address dialled.
	ServerName string `mapstructure:"server_name"`
}

// Tenant is one tenant; the yaml and json tags are the tenants_file format.
//
// A tenant's tokens are verified against its key set: JWTSecret is the one
// key without a kid (HS256), which verifies the tokens whose header names
// no kid; Keys are named keys, and the keys the tenant's identity provider
// publishes at JWKSURL are too. A token with a kid is verified by the key
// of Keys with that kid, else by the JWKS key with it; none other is tried.
type Tenant struct {
	ID        string `mapstructure:"id" yaml:"id" json:"id"`
	JWTSecret string `mapstructure:"jwt_secret" yaml:"jwt_secret" json:"jwt_secret"`
	// DSN overrides mysql.dsn_template for this tenant.
	DSN     string      `mapstructure:"dsn" yaml:"dsn,omitempty" json:"dsn,omitempty"`
	Keys    []TenantKey `mapstructure:"keys" yaml:"keys,omitempty" json:"keys,omitempty"`
	JWKSURL string      `mapstructure:"jwks_url" yaml:"jwks_url,omitempty" json:"jwks_url,omitempty"`
	// Issuer and Audience, when set, are what every token of the tenant
	// must carry as iss and among aud.
	Issuer   string `mapstructure:"issuer" yaml:"issuer,omitempty" json:"issuer,omitempty"`
	Audience string `mapstructure:"audience" yaml:"audience,omitempty" json:"audience,omitempty"`
	// Limits replace the limits section's buckets for this tenant.
	Limits TenantLimits `mapstructure:"limits" yaml:"limits,omitempty" json:"limits,omitzero"`
	// RetentionMonths: 0 keeps history forever; with N, a month older than
	// the current UTC month minus N expires (config/retention.go).
	RetentionMonths int `mapstructure:"retention_months" yaml:"retention_months,omitempty" json:"retention_months,omitempty"`
	// ArchiveAfterMonths has the shard manager archive each sealed month
	// this many months after it (0: never automatically).
	ArchiveAfterMonths int `mapstructure:"archive_after_months" yaml:"archive_after_months,omitempty" json:"archive_after_months,omitempty"`
}

// Shard drives the monthly table manager.
type Shard struct {
	MonthsAhead    int           `mapstructure:"months_ahead"`
	SealingDays    int           `mapstructure:"sealing_days"`
	PatrolInterval time.Duration `mapstructure:"patrol_interval"`
	AutoAdvance    bool          `mapstructure:"auto_advance"`
	LockTTL        time.Duration `mapstructure:"lock_ttl"`
}

// Send is the send path.
type Send struct {
	MaxBodyBytes     int64         `mapstructure:"max_body_bytes"`
	RecallWindow     time.Duration `mapstructure:"recall_window"`
	IdempotencyTTL   time.Duration `mapstructure:"idempotency_ttl"`
	SeqReserveStep   int64         `mapstructure:"seq_reserve_step"`
	ProduceTimeout   time.Duration `mapstructure:"produce_timeout"`
	MaxMentions      int           `mapstructure:"max_mentions"`
	ACLCacheTTL      time.Duration `mapstructure:"acl_cache_ttl"`
	MaxClockBackward time.Duration `mapstructure:"max_clock_backward"`
}

// HotCache is the Redis cache of recent messages per topic, and each
// query process's copy of the newest stretch of the topics it reads.
type HotCache struct {
	TTL              time.Duration `mapstructure:"ttl"`
	MaxPerTopic      int           `mapstructure:"max_per_topic"`
	LocalTopics      int           `mapstructure:"local_topics"`
	LocalMaxAge      time.Duration `mapstructure:"local_max_age"`
	LocalUsers       int           `mapstructure:"local_users"`
	RememberedMaxAge time.Duration `mapstructure:"remembered_max_age"`
	LocalRoutes      int           `mapstructure:"local_routes"`
}

// Stream is the realtime WebSocket stream the query role serves: limits
// per process and per socket, heartbeats, and how often memberships of the
// watched topics are re-checked.
type Stream struct {
	MaxConnections    int           `mapstructure:"max_connections"`
	MaxTopics         int           `mapstructure:"max_topics"`
	SendQueue         int           `mapstructure:"send_queue"`
	WriteTimeout      time.Duration `mapstructure:"write_timeout"`
	PingInterval      time.Duration `mapstructure:"ping_interval"`
	IdleTimeout       time.Duration `mapstructure:"idle_timeout"`
	ACLCheckInterval  time.Duration `mapstructure:"acl_check_interval"`
	MaxCatchups       int           `mapstructure:"max_catchups"`
	MaxCatchupChanges int           `mapstructure:"max_catchup_changes"`
	// MaxConnectionsPerUser caps one user's sockets on one process (0 = no
	// cap): past it an upgrade is refused 429.
	MaxConnectionsPerUser int `mapstructure:"max_connections_per_user"`
}

// Persist is the Kafka → MySQL writer.
type Persist struct {
	BatchSize       int           `mapstructure:"batch_size"`
	BatchLinger     time.Duration `mapstructure:"batch_linger"`
	MaxRetries      int           `mapstructure:"max_retries"`
	DedupRetention  time.Duration `mapstructure:"dedup_retention"`
	RetryBackoff    time.Duration `mapstructure:"retry_backoff"`
	RetryBackoffMax time.Duration `mapstructure:"retry_backoff_max"`
	MaxParked       int           `mapstructure:"max_parked"`
}

// Relay produces the change feed's outbox to kafka.changes_topic.
type Relay struct {
	BatchSize      int           `mapstructure:"batch_size"`
	PollInterval   time.Duration `mapstructure:"poll_interval"`
	Workers        int           `mapstructure:"workers"`
	ProduceTimeout time.Duration `mapstructure:"produce_timeout"`
}

// Migrate is the legacy-table backfill; RowsPerSecond 0 means unthrottled.
type Migrate struct {
	BatchSize     int `mapstructure:"batch_size"`
	RowsPerSecond int `mapstructure:"rows_per_second"`
}

// TenantIDPattern is what a tenant id must match: the id becomes part of database
// names and Redis keys, so it is kept to characters that need no quoting anywhere.
var TenantIDPattern = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// KeyPrefixPattern is what redis.key_prefix must match: empty, or at most 32
// letters, digits and "_.:-". No brace: the tenant's "{tenant}" after it must
// stay the key's Redis Cluster hash tag. No glob metacharacter ("*?[]\"): the
// SCAN patterns built on it must match only its own installation's keys.
var KeyPrefixPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{0,32}$`)

// DemoTenant is the built-in tenant of a local setup. It only stands in for a
// tenant list nobody gave: Load drops it when a tenants_file is set, and a
// process running anything less than every role refuses its secrets
// (ValidateServe), so it never serves a real deployment. Besides its
// jwt_secret it has one named key, so that a local setup shows a token
// carrying a kid (`imshard token --kid=demo-1`).
var DemoTenant = Tenant{ID: "demo", JWTSecret: DemoSecret, Keys: []TenantKey{{KID: "demo-1", Alg: AlgHS256, Secret: DemoKeySecret}}}

// DemoSecret is the demo tenant's jwt_secret, public in the docs.
const DemoSecret = "change-me"

// DemoKeySecret is the secret of the demo tenant's key demo-1, public in
// the docs as DemoSecret is.
const DemoKeySecret = "change-me-demo-1"

// IsDemoSecret reports whether s is one of the demo tenant's public secrets.
func IsDemoSecret(s string) bool { return s == DemoSecret || s == DemoKeySecret }

// minSecretLen is the shortest accepted jwt_secret; shorter HMAC keys are guessable.
const minSecretLen = 8

// Default returns the built-in local defaults: a single-machine setup against
// MariaDB and Redis on localhost and the in-process Kafka.
func Default() Config {
	return Config{
		HTTP: HTTP{Addr: "127.0.0.1:8080", ShutdownDelay: 5 * time.Second, ShutdownGrace: 30 * time.Second,
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
			IdleTimeout: 60 * time.Second, MaxConns: 10000},
		Auth:    Auth{MaxTokenTTL: 24 * time.Hour, JWKSRefreshInterval: 5 * time.Minute},
		Metrics: Metrics{Addr: "127.0.0.1:9090"},
		Log:     Log{Level: "info", Format: "auto"},
		MySQL: MySQL{
			DSNTemplate:     "root@tcp(127.0.0.1:3306)/imshard_{tenant}?parseTime=true&loc=UTC",
			MaxOpenConns:    16,
			MaxIdleConns:    16,
			ConnMaxIdleTime: 5 * time.Minute,
			MaxOpenTenants:  256,
			PlacementDSNs:   []string{},
			PlacementPoll:   time.Second,
		},
		Redis: Redis{Addrs: []string{"127.0.0.1:6379"}, DialTimeout: 5 * time.Second},
		Kafka: Kafka{
			// Empty but not nil, so that Default() equals a decoded "brokers: []".
			Brokers:           []string{},
			Topic:             "imshard.groupmsg",
			DLQTopic:          "imshard.groupmsg.dlq",
			ChangesTopic:      "imshard.changes",
			Group:             "imshard-persist",
			Partitions:        16,
			DataDir:           "./data/kafka",
			ReplicationFactor: 1,
		},
		// a copy of its own: a caller changing the keys changes no other
		Tenants: []Tenant{{ID: DemoTenant.ID, JWTSecret: DemoTenant.JWTSecret, Keys: slices.Clone(DemoTenant.Keys)}},
		Shard: Shard{
			MonthsAhead:    2,
			SealingDays:    7,
			PatrolInterval: 24 * time.Hour,
			AutoAdvance:    true,
			LockTTL:        30 * time.Second,
		},
		Send: Send{
			MaxBodyBytes:     65536,
			RecallWindow:     2 * time.Minute,
			IdempotencyTTL:   24 * time.Hour,
			SeqReserveStep:   1000,
			ProduceTimeout:   10 * time.Second,
			MaxMentions:      1000,
			ACLCacheTTL:      5 * time.Minute,
			MaxClockBackward: 5 * time.Second,
		},
		HotCache: HotCache{TTL: 24 * time.Hour, MaxPerTopic: 1000, LocalTopics: 1024, LocalMaxAge: 10 * time.Second, LocalUsers: 4096, RememberedMaxAge: 5 * time.Minute, LocalRoutes: 65536},
		Stream: Stream{
			MaxConnections:        10_000,
			MaxTopics:             500,
			SendQueue:             256,
			WriteTimeout:          10 * time.Second,
			PingInterval:          20 * time.Second,
			IdleTimeout:           60 * time.Second,
			ACLCheckInterval:      500 * time.Millisecond,
			MaxCatchups:           64,
			MaxCatchupChanges:     1000,
			MaxConnectionsPerUser: 16,
		},
		Persist: Persist{
			BatchSize:       500,
			BatchLinger:     20 * time.Millisecond,
			MaxRetries:      10,
			DedupRetention:  168 * time.Hour,
			RetryBackoff:    200 * time.Millisecond,
			RetryBackoffMax: 30 * time.Second,
			MaxParked:       50_000,
		},
		Relay:   Relay{BatchSize: 500, PollInterval: 200 * time.Millisecond, Workers: 4, ProduceTimeout: 30 * time.Second},
		Migrate: Migrate{BatchSize: 2000, RowsPerSecond: 0},
		Limits:  DefaultLimits(),
		Archive: DefaultArchive(),
	}
}

// TenantDSN returns the tenant's DSN: its own DSN if set, else the template with
// {tenant} replaced by the tenant id.
func (c *Config) TenantDSN(t Tenant) string {
	if t.DSN != "" {
		return t.DSN
	}
	return strings.ReplaceAll(c.MySQL.DSNTemplate, "{tenant}", t.ID)
}

// KeyError names the offending key, so an operator knows what to fix and the
// command can exit 2 ("bad config") rather than 1.
type KeyError struct {
	Key string
	Msg string
}

func (e *KeyError) Error() string { return "config: " + e.Key + ": " + e.Msg }
