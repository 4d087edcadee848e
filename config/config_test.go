package config

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/imshard/imshard/test/testenv"
)

const examplePath = "../config.example.yaml"

// writeFile puts content into a fresh temp dir and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// load never reads the process environment: a nil Env becomes an empty one.
func load(t *testing.T, opts LoadOptions) (*Config, error) {
	t.Helper()
	if opts.Env == nil {
		opts.Env = []string{}
	}
	return Load(opts)
}

func mustLoad(t *testing.T, opts LoadOptions) *Config {
	t.Helper()
	c, err := load(t, opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

// keyErrors lists every *KeyError inside a (joined, wrapped) error.
func keyErrorsOf(err error) []*KeyError {
	var out []*KeyError
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case nil:
		case *KeyError:
			out = append(out, x)
		case interface{ Unwrap() []error }:
			for _, c := range x.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return out
}

// wantKeyError asserts err names key, via errors.As for the first and a full walk
// for the rest, and that the message contains msg.
func wantKeyError(t *testing.T, err error, key, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one naming %q", key)
	}
	var ke *KeyError
	if !errors.As(err, &ke) {
		t.Fatalf("error %q is not a *KeyError", err)
	}
	for _, k := range keyErrorsOf(err) {
		if k.Key == key && strings.Contains(k.Msg, msg) {
			if !strings.HasPrefix(k.Error(), "config: "+key+": ") {
				t.Errorf("Error() = %q, want prefix %q", k.Error(), "config: "+key+": ")
			}
			return
		}
	}
	t.Fatalf("error %q does not name key %q with message containing %q", err, key, msg)
}

func flagSet(t *testing.T) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.String("addr", "flag-default:1", "")
	fs.StringSlice("redis-addr", nil, "")
	fs.Duration("grace", time.Second, "")
	fs.Int("months", 0, "")
	fs.String("tenants", "", "")
	return fs
}

func TestDefaultValidates(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
}

func TestNoFileGivesDefault(t *testing.T) {
	t.Chdir(t.TempDir())
	c := mustLoad(t, LoadOptions{})
	if !reflect.DeepEqual(*c, Default()) {
		t.Fatalf("Load with no file = %+v, want Default()", *c)
	}
	if err := os.WriteFile(defaultPath, []byte("log: {level: debug}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, LoadOptions{}).Log.Level; got != "debug" {
		t.Fatalf("./imshard.yaml not read: log.level = %q", got)
	}
}

func TestExampleFileIsDefault(t *testing.T) {
	c := mustLoad(t, LoadOptions{Path: examplePath})
	if !reflect.DeepEqual(*c, Default()) {
		t.Fatalf("config.example.yaml loads as\n%+v\nwant Default()\n%+v", *c, Default())
	}
}

// TestExampleDocumentsEveryKey keeps the example complete, every key
// commented, and its sections in their documented order as keys are added
// to Config.
func TestExampleDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var top []string
	for i := 0; i < len(doc.Content[0].Content); i += 2 {
		top = append(top, doc.Content[0].Content[i].Value)
	}
	want := []string{"http", "auth", "metrics", "log", "mysql", "redis", "kafka", "tenants", "tenants_file", "shard", "send", "hot_cache", "stream", "persist", "relay", "migrate", "limits", "archive"}
	if !slices.Equal(top, want) {
		t.Errorf("top-level keys %v, want %v", top, want)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, l := range leaves() {
		if _, ok := lookup(m, l.key); !ok {
			t.Errorf("config.example.yaml lacks key %s", l.key)
		}
	}
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasSuffix(trimmed, ":") || trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "- ") || strings.HasPrefix(trimmed, "jwt_secret") {
			continue
		}
		if !strings.Contains(line, " # ") {
			t.Errorf("example line without a comment: %q", line)
		}
	}
}

func TestEnvNamesAreUnique(t *testing.T) {
	seen := map[string]string{}
	for _, l := range leaves() {
		if prev, dup := seen[l.env()]; dup {
			t.Errorf("%s and %s both map to %s", prev, l.key, l.env())
		}
		seen[l.env()] = l.key
	}
	for _, want := range []string{"IMSHARD_MYSQL_DSN_TEMPLATE", "IMSHARD_SHARD_AUTO_ADVANCE", "IMSHARD_HOT_CACHE_TTL", "IMSHARD_TENANTS", "IMSHARD_TENANTS_FILE"} {
		if _, ok := seen[want]; !ok {
			t.Errorf("no key maps to %s", want)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	tests := []struct {
		name  string
		env   string
		check func(*Config) bool
	}{
		{"dsn template", "IMSHARD_MYSQL_DSN_TEMPLATE=u:p@tcp(db:3306)/x_{tenant}", func(c *Config) bool { return c.MySQL.DSNTemplate == "u:p@tcp(db:3306)/x_{tenant}" }},
		{"bool", "IMSHARD_SHARD_AUTO_ADVANCE=false", func(c *Config) bool { return !c.Shard.AutoAdvance }},
		{"duration", "IMSHARD_HTTP_SHUTDOWN_GRACE=5s", func(c *Config) bool { return c.HTTP.ShutdownGrace == 5*time.Second }},
		{"list", "IMSHARD_REDIS_ADDRS=a:1,b:2", func(c *Config) bool { return slices.Equal(c.Redis.Addrs, []string{"a:1", "b:2"}) }},
		{"list with blanks", "IMSHARD_KAFKA_BROKERS= k1:9092, k2:9092,", func(c *Config) bool { return slices.Equal(c.Kafka.Brokers, []string{"k1:9092", "k2:9092"}) }},
		{"int", "IMSHARD_KAFKA_PARTITIONS=32", func(c *Config) bool { return c.Kafka.Partitions == 32 }},
		{"int64", "IMSHARD_SEND_MAX_BODY_BYTES=2048", func(c *Config) bool { return c.Send.MaxBodyBytes == 2048 }},
		{"underscored section", "IMSHARD_HOT_CACHE_MAX_PER_TOPIC=7", func(c *Config) bool { return c.HotCache.MaxPerTopic == 7 }},
		{"tenants JSON", `IMSHARD_TENANTS=[{"id":"acme","jwt_secret":"s3cret-acme","dsn":"a@tcp(h)/acme"},{"id":"b","jwt_secret":"s3cret-bbb"}]`, func(c *Config) bool {
			return reflect.DeepEqual(c.Tenants, []Tenant{{ID: "acme", JWTSecret: "s3cret-acme", DSN: "a@tcp(h)/acme"}, {ID: "b", JWTSecret: "s3cret-bbb"}})
		}},
		{"empty means unset", "IMSHARD_HTTP_ADDR=", func(c *Config) bool { return c.HTTP.Addr == Default().HTTP.Addr }},
		{"other prefixes ignored", "HOME=/root", func(c *Config) bool { return reflect.DeepEqual(*c, Default()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, LoadOptions{Env: []string{tt.env}})
			if !tt.check(c) {
				t.Fatalf("%s not applied: %+v", tt.env, *c)
			}
		})
	}
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "c.yaml", "http: {addr: 'file:1', shutdown_grace: 7s}\nshard: {months_ahead: 3}\n")
	tests := []struct {
		name      string
		env       []string
		flags     map[string]string // flag name -> value to Set
		wantAddr  string
		wantGrace time.Duration
		wantRedis []string
	}{
		{"file beats default", nil, nil, "file:1", 7 * time.Second, []string{"127.0.0.1:6379"}},
		{"env beats file", []string{"IMSHARD_HTTP_ADDR=env:1"}, nil, "env:1", 7 * time.Second, []string{"127.0.0.1:6379"}},
		{"flag beats env", []string{"IMSHARD_HTTP_ADDR=env:1", "IMSHARD_HTTP_SHUTDOWN_GRACE=9s"}, map[string]string{"addr": "flag:1", "grace": "11s"}, "flag:1", 11 * time.Second, []string{"127.0.0.1:6379"}},
		{"unchanged flag does not override", []string{"IMSHARD_HTTP_ADDR=env:1"}, nil, "env:1", 7 * time.Second, []string{"127.0.0.1:6379"}},
		{"slice flag", []string{"IMSHARD_REDIS_ADDRS=e:1"}, map[string]string{"redis-addr": "f:1,f:2"}, "file:1", 7 * time.Second, []string{"f:1", "f:2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flagSet(t)
			for name, val := range tt.flags {
				if err := fs.Set(name, val); err != nil {
					t.Fatal(err)
				}
			}
			flags := map[string]*pflag.Flag{
				"http.addr":           fs.Lookup("addr"),
				"http.shutdown_grace": fs.Lookup("grace"),
				"redis.addrs":         fs.Lookup("redis-addr"),
				"shard.months_ahead":  fs.Lookup("months"),
			}
			c := mustLoad(t, LoadOptions{Path: file, Env: tt.env, Flags: flags})
			if c.HTTP.Addr != tt.wantAddr || c.HTTP.ShutdownGrace != tt.wantGrace || !slices.Equal(c.Redis.Addrs, tt.wantRedis) {
				t.Fatalf("got addr %q grace %s redis %v; want %q %s %v", c.HTTP.Addr, c.HTTP.ShutdownGrace, c.Redis.Addrs, tt.wantAddr, tt.wantGrace, tt.wantRedis)
			}
			if c.Shard.MonthsAhead != 3 {
				t.Fatalf("file value shadowed by an unchanged flag's default: months_ahead = %d", c.Shard.MonthsAhead)
			}
		})
	}
}

func TestFileForms(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		check func(*Config) bool
	}{
		{"empty file", "", func(c *Config) bool { return reflect.DeepEqual(*c, Default()) }},
		{"null section keeps defaults", "http:\n", func(c *Config) bool { return c.HTTP == Default().HTTP }},
		{"partial section keeps the rest", "http: {addr: ':1'}", func(c *Config) bool { return c.HTTP.Addr == ":1" && c.HTTP.ShutdownGrace == 30*time.Second }},
		{"keys are case-insensitive", "HTTP: {Addr: ':2'}", func(c *Config) bool { return c.HTTP.Addr == ":2" }},
		{"zero duration as number", "persist: {batch_linger: 0}", func(c *Config) bool { return c.Persist.BatchLinger == 0 }},
		{"whole float as int", "migrate: {batch_size: 1e3}", func(c *Config) bool { return c.Migrate.BatchSize == 1000 }},
		{"list replaces, not merges", "tenants: [{id: x, jwt_secret: 12345678x}]", func(c *Config) bool { return reflect.DeepEqual(c.Tenants, []Tenant{{ID: "x", JWTSecret: "12345678x"}}) }},
		{"empty tenants", "tenants: []", func(c *Config) bool { return len(c.Tenants) == 0 }},
		{"string list as comma string", "redis: {addrs: 'a:1,b:2'}", func(c *Config) bool { return slices.Equal(c.Redis.Addrs, []string{"a:1", "b:2"}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, LoadOptions{Path: writeFile(t, "c.yaml", tt.file)})
			if !tt.check(c) {
				t.Fatalf("unexpected config: %+v", *c)
			}
		})
	}
}

func TestLoadKeyErrors(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		env   []string
		flags map[string]string // config key -> value for the "addr" flag bound to it
		key   string
		msg   string
	}{
		{name: "unknown nested key", file: "http: {adr: x}", key: "http.adr", msg: "unknown key"},
		{name: "unknown top-level key", file: "foo: 1", key: "foo", msg: "unknown key"},
		{name: "unknown deep key", file: "kafka: {topic: t, extra: {a: 1}}", key: "kafka.extra", msg: "unknown key"},
		{name: "unknown tenant field", file: "tenants: [{id: a, jwt_secret: 12345678x, jwt: y}]", key: "tenants[0].jwt", msg: "unknown key"},
		{name: "key twice by case", file: "http: {addr: ':1', ADDR: ':2'}", key: "http.addr", msg: "more than once"},
		{name: "bad duration", file: "http: {shutdown_grace: abc}", key: "http.shutdown_grace", msg: `invalid duration "abc"`},
		{name: "duration without unit", file: "http: {shutdown_grace: 30}", key: "http.shutdown_grace", msg: "give a unit"},
		{name: "bad int", file: "mysql: {max_open_conns: many}", key: "mysql.max_open_conns", msg: `invalid integer "many"`},
		{name: "fractional int", file: "mysql: {max_open_conns: 1.5}", key: "mysql.max_open_conns", msg: "invalid integer"},
		{name: "bad bool", file: "shard: {auto_advance: maybe}", key: "shard.auto_advance", msg: `invalid boolean "maybe"`},
		{name: "number for bool", file: "shard: {auto_advance: 1}", key: "shard.auto_advance", msg: "expected true or false"},
		{name: "number for string", file: "redis: {password: 12345678}", key: "redis.password", msg: "quote the value"},
		{name: "scalar for section", file: "http: 5", key: "http", msg: "expected a mapping"},
		{name: "mapping for list", file: "redis: {addrs: {a: b}}", key: "redis.addrs", msg: "expected a list"},
		{name: "mapping for scalar", file: "log: {level: {a: b}}", key: "log.level", msg: "expected a single value"},
		{name: "bad list element", file: "redis: {addrs: [1]}", key: "redis.addrs[0]", msg: "expected a string"},
		{name: "bad tenant field type", file: "tenants: [{id: [x]}]", key: "tenants[0].id", msg: "expected a single value"},
		{name: "file error names file", file: "http: {shutdown_grace: abc}", key: "http.shutdown_grace", msg: "(from file "},
		{name: "env bad duration", env: []string{"IMSHARD_HTTP_SHUTDOWN_GRACE=abc"}, key: "http.shutdown_grace", msg: `invalid duration "abc" (from env IMSHARD_HTTP_SHUTDOWN_GRACE)`},
		{name: "env bad int", env: []string{"IMSHARD_MYSQL_MAX_OPEN_CONNS=x"}, key: "mysql.max_open_conns", msg: `invalid integer "x"`},
		{name: "env bad bool", env: []string{"IMSHARD_SHARD_AUTO_ADVANCE=maybe"}, key: "shard.auto_advance", msg: `invalid boolean "maybe"`},
		{name: "env unknown variable", env: []string{"IMSHARD_HTTP_ADR=x"}, key: "IMSHARD_HTTP_ADR", msg: "unknown environment variable"},
		{name: "env section is not a key", env: []string{"IMSHARD_HTTP=x"}, key: "IMSHARD_HTTP", msg: "unknown environment variable"},
		{name: "env tenants not JSON", env: []string{"IMSHARD_TENANTS=acme"}, key: "tenants", msg: "invalid JSON"},
		{name: "env tenants unknown field", env: []string{`IMSHARD_TENANTS=[{"id":"a","jwt":"x"}]`}, key: "tenants[0].jwt", msg: "unknown key (from env IMSHARD_TENANTS)"},
		{name: "env tenants not a list", env: []string{`IMSHARD_TENANTS={"id":"a"}`}, key: "tenants", msg: "expected a list"},
		{name: "flag bad duration", flags: map[string]string{"http.shutdown_grace": "abc"}, key: "http.shutdown_grace", msg: "(from flag --addr)"},
		{name: "flag unknown key", flags: map[string]string{"http.adr": "x"}, key: "http.adr", msg: "unknown key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := LoadOptions{Env: tt.env}
			if tt.file != "" {
				opts.Path = writeFile(t, "c.yaml", tt.file)
			}
			for key, val := range tt.flags {
				fs := flagSet(t)
				if err := fs.Set("addr", val); err != nil {
					t.Fatal(err)
				}
				opts.Flags = map[string]*pflag.Flag{key: fs.Lookup("addr")}
			}
			c, err := load(t, opts)
			if c != nil {
				t.Errorf("got a config alongside the error")
			}
			wantKeyError(t, err, tt.key, tt.msg)
		})
	}
}

// TestLoadReportsEverything: unknown keys, unknown variables and bad values from
// every source come back together, so an operator fixes them in one pass.
func TestLoadReportsEverything(t *testing.T) {
	p := writeFile(t, "c.yaml", "http: {adr: x, shutdown_grace: x}\nfoo: 1\nmysql: {max_open_conns: y}\n")
	fs := flagSet(t)
	if err := fs.Set("addr", "many"); err != nil { // a string flag bound to an int key
		t.Fatal(err)
	}
	_, err := load(t, LoadOptions{
		Path:  p,
		Env:   []string{"IMSHARD_NOPE=1", "IMSHARD_SHARD_AUTO_ADVANCE=maybe"},
		Flags: map[string]*pflag.Flag{"shard.months_ahead": fs.Lookup("addr")},
	})
	want := []string{"http.adr", "foo", "http.shutdown_grace", "mysql.max_open_conns", "IMSHARD_NOPE", "shard.auto_advance", "shard.months_ahead"}
	for _, k := range want {
		wantKeyError(t, err, k, "")
	}
	if n := len(keyErrorsOf(err)); n != len(want) {
		t.Fatalf("want %d problems, got %d: %v", len(want), n, err)
	}
}

func TestLoadFileErrors(t *testing.T) {
	tests := []struct {
		name string
		path func(t *testing.T) string
		want string
	}{
		{"missing file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.yaml") }, "nope.yaml"},
		{"bad YAML", func(t *testing.T) string { return writeFile(t, "bad.yaml", "http: [") }, "bad.yaml"},
		{"top level list", func(t *testing.T) string { return writeFile(t, "list.yaml", "- a\n- b\n") }, "list.yaml"},
		{"top level scalar", func(t *testing.T) string { return writeFile(t, "scalar.yaml", "hello\n") }, "scalar.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, LoadOptions{Path: tt.path(t)})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

func TestValidateRules(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
	}{
		{"http addr not host:port", func(c *Config) { c.HTTP.Addr = "localhost" }, "http.addr"},
		{"http addr bad port", func(c *Config) { c.HTTP.Addr = "localhost:http" }, "http.addr"},
		{"http shutdown grace negative", func(c *Config) { c.HTTP.ShutdownGrace = -time.Second }, "http.shutdown_grace"},
		{"http shutdown delay negative", func(c *Config) { c.HTTP.ShutdownDelay = -time.Second }, "http.shutdown_delay"},
		{"metrics addr", func(c *Config) { c.Metrics.Addr = "" }, "metrics.addr"},
		{"log level", func(c *Config) { c.Log.Level = "verbose" }, "log.level"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format"},
		{"dsn template without {tenant}", func(c *Config) { c.MySQL.DSNTemplate = "root@tcp(h:3306)/db" }, "mysql.dsn_template"},
		{"max open conns", func(c *Config) { c.MySQL.MaxOpenConns = 0 }, "mysql.max_open_conns"},
		{"max idle conns", func(c *Config) { c.MySQL.MaxIdleConns = -1 }, "mysql.max_idle_conns"},
		{"max open tenants", func(c *Config) { c.MySQL.MaxOpenTenants = 0 }, "mysql.max_open_tenants"},
		{"conn max idle time", func(c *Config) { c.MySQL.ConnMaxIdleTime = -1 }, "mysql.conn_max_idle_time"},
		{"redis addrs empty", func(c *Config) { c.Redis.Addrs = nil }, "redis.addrs"},
		{"redis addr no host", func(c *Config) { c.Redis.Addrs = []string{"a:1", ":6379"} }, "redis.addrs[1]"},
		{"redis addr port 0", func(c *Config) { c.Redis.Addrs = []string{"a:0"} }, "redis.addrs[0]"},
		{"redis socket relative", func(c *Config) { c.Redis.Addrs = []string{"unix:redis.sock"} }, "redis.addrs[0]"},
		{"redis socket in a cluster", func(c *Config) { c.Redis.Addrs = []string{"a:1", "unix:/run/redis.sock"} }, "redis.addrs[1]"},
		{"redis dial timeout", func(c *Config) { c.Redis.DialTimeout = -1 }, "redis.dial_timeout"},
		{"redis key prefix with a brace", func(c *Config) { c.Redis.KeyPrefix = "a{b}:" }, "redis.key_prefix"},
		{"redis key prefix with a glob", func(c *Config) { c.Redis.KeyPrefix = "prod*" }, "redis.key_prefix"},
		{"redis key prefix with a space", func(c *Config) { c.Redis.KeyPrefix = "my app:" }, "redis.key_prefix"},
		{"redis key prefix too long", func(c *Config) { c.Redis.KeyPrefix = strings.Repeat("p", 33) }, "redis.key_prefix"},
		{"kafka broker", func(c *Config) { c.Kafka.Brokers = []string{"k1"} }, "kafka.brokers[0]"},
		{"kafka topic empty", func(c *Config) { c.Kafka.Topic = "" }, "kafka.topic"},
		{"kafka topic illegal", func(c *Config) { c.Kafka.Topic = "a topic" }, "kafka.topic"},
		{"kafka dlq empty", func(c *Config) { c.Kafka.DLQTopic = "" }, "kafka.dlq_topic"},
		{"kafka dlq same as topic", func(c *Config) { c.Kafka.DLQTopic = c.Kafka.Topic }, "kafka.dlq_topic"},
		{"kafka changes topic empty", func(c *Config) { c.Kafka.ChangesTopic = "" }, "kafka.changes_topic"},
		{"kafka changes topic same as topic", func(c *Config) { c.Kafka.ChangesTopic = c.Kafka.Topic }, "kafka.changes_topic"},
		{"kafka changes topic same as dlq", func(c *Config) { c.Kafka.ChangesTopic = c.Kafka.DLQTopic }, "kafka.changes_topic"},
		{"relay batch size", func(c *Config) { c.Relay.BatchSize = 0 }, "relay.batch_size"},
		{"relay poll interval", func(c *Config) { c.Relay.PollInterval = time.Millisecond }, "relay.poll_interval"},
		{"relay workers", func(c *Config) { c.Relay.Workers = 0 }, "relay.workers"},
		{"relay produce timeout", func(c *Config) { c.Relay.ProduceTimeout = 0 }, "relay.produce_timeout"},
		{"kafka group", func(c *Config) { c.Kafka.Group = "" }, "kafka.group"},
		{"kafka partitions low", func(c *Config) { c.Kafka.Partitions = 0 }, "kafka.partitions"},
		{"kafka partitions high", func(c *Config) { c.Kafka.Partitions = 1025 }, "kafka.partitions"},
		{"kafka replication factor", func(c *Config) { c.Kafka.ReplicationFactor = 0 }, "kafka.replication_factor"},
		{"no tenants", func(c *Config) { c.Tenants = nil }, "tenants"},
		{"tenant id invalid", func(c *Config) { c.Tenants[0].ID = "Demo" }, "tenants[0].id"},
		{"tenant id too long", func(c *Config) { c.Tenants[0].ID = strings.Repeat("a", 33) }, "tenants[0].id"},
		{"tenant id duplicate", func(c *Config) { c.Tenants = append(c.Tenants, c.Tenants[0]) }, "tenants[1].id"},
		{"two tenants share a secret", func(c *Config) {
			c.Tenants = append(c.Tenants, Tenant{ID: "other", JWTSecret: c.Tenants[0].JWTSecret})
		}, "tenants[1].jwt_secret"},
		{"tenant secret empty, no keys", func(c *Config) { c.Tenants[0].JWTSecret, c.Tenants[0].Keys = "", nil }, "tenants[0].jwt_secret"},
		{"tenant secret short", func(c *Config) { c.Tenants[0].JWTSecret = "1234567" }, "tenants[0].jwt_secret"},
		{"months ahead", func(c *Config) { c.Shard.MonthsAhead = 25 }, "shard.months_ahead"},
		{"months ahead negative", func(c *Config) { c.Shard.MonthsAhead = -1 }, "shard.months_ahead"},
		{"sealing days", func(c *Config) { c.Shard.SealingDays = 91 }, "shard.sealing_days"},
		{"patrol interval", func(c *Config) { c.Shard.PatrolInterval = 59 * time.Second }, "shard.patrol_interval"},
		{"lock ttl", func(c *Config) { c.Shard.LockTTL = 999 * time.Millisecond }, "shard.lock_ttl"},
		{"read header timeout", func(c *Config) { c.HTTP.ReadHeaderTimeout = 0 }, "http.read_header_timeout"},
		{"read timeout below header timeout", func(c *Config) { c.HTTP.ReadTimeout = 5 * time.Second }, "http.read_timeout"},
		{"write timeout below produce timeout", func(c *Config) { c.HTTP.WriteTimeout = 15 * time.Second }, "http.write_timeout"},
		{"idle timeout", func(c *Config) { c.HTTP.IdleTimeout = 0 }, "http.idle_timeout"},
		{"max conns", func(c *Config) { c.HTTP.MaxConns = 0 }, "http.max_conns"},
		{"max token ttl low", func(c *Config) { c.Auth.MaxTokenTTL = 59 * time.Second }, "auth.max_token_ttl"},
		{"max token ttl high", func(c *Config) { c.Auth.MaxTokenTTL = 367 * 24 * time.Hour }, "auth.max_token_ttl"},
		{"max body low", func(c *Config) { c.Send.MaxBodyBytes = 1023 }, "send.max_body_bytes"},
		{"max body high", func(c *Config) { c.Send.MaxBodyBytes = 16<<20 + 1 }, "send.max_body_bytes"},
		{"seq reserve step low", func(c *Config) { c.Send.SeqReserveStep = 0 }, "send.seq_reserve_step"},
		{"seq reserve step high", func(c *Config) { c.Send.SeqReserveStep = 1_000_001 }, "send.seq_reserve_step"},
		{"produce timeout", func(c *Config) { c.Send.ProduceTimeout = 0 }, "send.produce_timeout"},
		{"idempotency ttl", func(c *Config) { c.Send.IdempotencyTTL = 59 * time.Second }, "send.idempotency_ttl"},
		{"recall window", func(c *Config) { c.Send.RecallWindow = -1 }, "send.recall_window"},
		{"max mentions", func(c *Config) { c.Send.MaxMentions = -1 }, "send.max_mentions"},
		{"acl cache ttl", func(c *Config) { c.Send.ACLCacheTTL = -1 }, "send.acl_cache_ttl"},
		{"max clock backward", func(c *Config) { c.Send.MaxClockBackward = -1 }, "send.max_clock_backward"},
		{"hot cache ttl", func(c *Config) { c.HotCache.TTL = -1 }, "hot_cache.ttl"},
		{"hot cache max per topic", func(c *Config) { c.HotCache.MaxPerTopic = -1 }, "hot_cache.max_per_topic"},
		{"hot cache local topics", func(c *Config) { c.HotCache.LocalTopics = -1 }, "hot_cache.local_topics"},
		{"hot cache local max age", func(c *Config) { c.HotCache.LocalMaxAge = -time.Second }, "hot_cache.local_max_age"},
		{"hot cache local users", func(c *Config) { c.HotCache.LocalUsers = -1 }, "hot_cache.local_users"},
		{"hot cache local count age", func(c *Config) { c.HotCache.RememberedMaxAge = -time.Second }, "hot_cache.remembered_max_age"},
		{"hot cache local routes", func(c *Config) { c.HotCache.LocalRoutes = -1 }, "hot_cache.local_routes"},
		{"persist batch size low", func(c *Config) { c.Persist.BatchSize = 0 }, "persist.batch_size"},
		{"persist batch size high", func(c *Config) { c.Persist.BatchSize = 10_001 }, "persist.batch_size"},
		{"persist batch linger negative", func(c *Config) { c.Persist.BatchLinger = -1 }, "persist.batch_linger"},
		{"persist batch linger high", func(c *Config) { c.Persist.BatchLinger = 11 * time.Second }, "persist.batch_linger"},
		{"persist max retries", func(c *Config) { c.Persist.MaxRetries = -1 }, "persist.max_retries"},
		{"persist dedup retention", func(c *Config) { c.Persist.DedupRetention = -1 }, "persist.dedup_retention"},
		{"persist retry backoff", func(c *Config) { c.Persist.RetryBackoff = -1 }, "persist.retry_backoff"},
		{"persist retry backoff max", func(c *Config) { c.Persist.RetryBackoffMax = c.Persist.RetryBackoff - 1 }, "persist.retry_backoff_max"},
		{"persist max parked", func(c *Config) { c.Persist.MaxParked = 0 }, "persist.max_parked"},
		{"limit rate negative", func(c *Config) { c.Limits.Send.User.PerSecond = -1 }, "limits.send.user.per_second"},
		{"limit rate below one a day", func(c *Config) { c.Limits.Reads.PerSecond = 1e-6 }, "limits.reads.per_second"},
		{"limit burst zero", func(c *Config) { c.Limits.Send.Topic.Burst = 0 }, "limits.send.topic.burst"},
		{"tenant limit burst zero", func(c *Config) { c.Tenants[0].Limits.Send.Tenant = &Rate{PerSecond: 5} }, "tenants[0].limits.send.tenant.burst"},
		{"connections per user", func(c *Config) { c.Stream.MaxConnectionsPerUser = -1 }, "stream.max_connections_per_user"},
		{"connections per client above max conns", func(c *Config) { c.HTTP.MaxConnsPerClient = c.HTTP.MaxConns + 1 }, "http.max_conns_per_client"},
		{"migrate batch size low", func(c *Config) { c.Migrate.BatchSize = 0 }, "migrate.batch_size"},
		{"migrate batch size high", func(c *Config) { c.Migrate.BatchSize = 100_001 }, "migrate.batch_size"},
		{"migrate rows per second", func(c *Config) { c.Migrate.RowsPerSecond = -1 }, "migrate.rows_per_second"},
		{"kafka sasl unknown mechanism", func(c *Config) { withSASL(c, "GSSAPI", "u", "p") }, "kafka.sasl.mechanism"},
		{"kafka sasl lower-case mechanism", func(c *Config) { withSASL(c, "scram-sha-256", "u", "p") }, "kafka.sasl.mechanism"},
		{"kafka sasl without username", func(c *Config) { withSASL(c, SASLScramSHA256, "", "p") }, "kafka.sasl.username"},
		{"kafka sasl without password", func(c *Config) { withSASL(c, SASLScramSHA512, "u", "") }, "kafka.sasl.password"},
		{"kafka sasl credentials without mechanism", func(c *Config) { withSASL(c, "", "u", "p") }, "kafka.sasl.mechanism"},
		{"kafka sasl plain in clear", func(c *Config) { withSASL(c, SASLPlain, "u", "p") }, "kafka.sasl.mechanism"},
		{"kafka sasl without brokers", func(c *Config) { withSASL(c, SASLScramSHA256, "u", "p"); c.Kafka.Brokers = nil }, "kafka.sasl.mechanism"},
		{"kafka tls without brokers", func(c *Config) { c.Kafka.TLS.Enabled = true }, "kafka.tls.enabled"},
		{"kafka tls file while off", func(c *Config) { c.Kafka.Brokers = []string{"k:9092"}; c.Kafka.TLS.CAFile = "/etc/ca.pem" }, "kafka.tls.enabled"},
		{"kafka tls server name while off", func(c *Config) { c.Kafka.TLS.ServerName = "kafka" }, "kafka.tls.enabled"},
		{"kafka tls cert without key", func(c *Config) { withKafkaTLS(c); c.Kafka.TLS.CertFile = "/etc/c.pem" }, "kafka.tls.key_file"},
		{"kafka tls ca missing", func(c *Config) { withKafkaTLS(c); c.Kafka.TLS.CAFile = "/nonexistent/ca.pem" }, "kafka.tls.ca_file"},
		{"kafka tls ca not pem", func(c *Config) { withKafkaTLS(c); c.Kafka.TLS.CAFile = examplePath }, "kafka.tls.ca_file"},
		{"kafka tls client cert unreadable", func(c *Config) {
			withKafkaTLS(c)
			c.Kafka.TLS.CertFile, c.Kafka.TLS.KeyFile = examplePath, examplePath
		}, "kafka.tls.cert_file"},
		{"redis username without password", func(c *Config) { c.Redis.Username = "imshard" }, "redis.password"},
		{"redis tls key without cert", func(c *Config) { c.Redis.TLS.Enabled = true; c.Redis.TLS.KeyFile = "/etc/k.pem" }, "redis.tls.cert_file"},
		{"redis tls over a unix socket", func(c *Config) {
			c.Redis.Addrs = []string{"unix:/run/redis/redis.sock"}
			c.Redis.TLS.Enabled = true
		}, "redis.tls.enabled"},
		{"mysql tls file while off", func(c *Config) { c.MySQL.TLS.KeyFile = "/etc/k.pem" }, "mysql.tls.enabled"},
		{"mysql tls ca missing", func(c *Config) { c.MySQL.TLS = TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"} }, "mysql.tls.ca_file"},
		{"mysql tls and a template choosing tls", func(c *Config) {
			c.MySQL.TLS.Enabled = true
			c.MySQL.DSNTemplate += "&tls=skip-verify"
		}, "mysql.dsn_template"},
		{"mysql tls and a tenant dsn choosing tls", func(c *Config) {
			c.MySQL.TLS.Enabled = true
			c.Tenants[0].DSN = "u@tcp(h:3306)/demo?tls=true"
		}, "tenants[0].dsn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(&c)
			err := c.Validate()
			wantKeyError(t, err, tt.key, "")
			if n := len(keyErrorsOf(err)); n != 1 {
				t.Errorf("want exactly one problem, got %d: %v", n, err)
			}
		})
	}
}

func withSASL(c *Config, mechanism, user, pass string) {
	c.Kafka.Brokers = []string{"k:9092"}
	c.Kafka.SASL = SASL{Mechanism: mechanism, Username: user, Password: pass}
}

func withKafkaTLS(c *Config) {
	c.Kafka.Brokers = []string{"k:9092"}
	c.Kafka.TLS.Enabled = true
}

// TestTLSClient loads a CA and a client certificate the way every client
// connects; a section that is off gives no TLS at all.
func TestTLSClient(t *testing.T) {
	pki := testenv.NewPKI(t)
	sec := TLS{Enabled: true, CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile, ServerName: "db.internal"}
	c := Default()
	c.Kafka.Brokers = []string{"k:9093"}
	c.Kafka.TLS, c.Redis.TLS, c.MySQL.TLS = sec, sec, sec
	c.Kafka.SASL = SASL{Mechanism: SASLPlain, Username: "imshard", Password: "kafka-pw"}
	c.Redis.Username, c.Redis.Password = "imshard", "redis-pw"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	tc, err := sec.Client("kafka.tls")
	if err != nil {
		t.Fatal(err)
	}
	if tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "db.internal" || tc.MinVersion != tls.VersionTLS12 || tc.InsecureSkipVerify {
		t.Fatalf("tls config = %+v", tc)
	}
	// Without a CA file the system roots verify the server.
	tc, err = TLS{Enabled: true}.Client("redis.tls")
	if err != nil || tc == nil || tc.RootCAs != nil || tc.InsecureSkipVerify {
		t.Fatalf("system roots: %+v, %v", tc, err)
	}
	if tc, err := (TLS{CAFile: pki.CAFile}).Client("mysql.tls"); tc != nil || err != nil {
		t.Fatalf("TLS off gave %+v, %v", tc, err)
	}
}

func TestValidateAcceptsEdges(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"listen on all interfaces, any port", func(c *Config) { c.HTTP.Addr = ":0"; c.Metrics.Addr = "[::1]:0" }},
		{"redis through its unix socket", func(c *Config) { c.Redis.Addrs = []string{"unix:/run/redis/redis.sock"} }},
		{"redis key prefix of every allowed character, at its longest", func(c *Config) { c.Redis.KeyPrefix = "Az09_.:-" + strings.Repeat("p", 24) }},
		{"template without {tenant} when every tenant has a dsn", func(c *Config) {
			c.MySQL.DSNTemplate = ""
			c.Tenants[0].DSN = "u@tcp(h:3306)/demo"
		}},
		{"limits inclusive", func(c *Config) {
			c.Kafka.Partitions, c.Send.MaxBodyBytes, c.Send.SeqReserveStep = 1024, 16<<20, 1_000_000
			c.Shard.MonthsAhead, c.Shard.SealingDays, c.Shard.PatrolInterval, c.Shard.LockTTL = 24, 90, time.Minute, time.Second
			c.Persist.BatchSize, c.Persist.BatchLinger, c.Migrate.BatchSize = 10_000, 10*time.Second, 100_000
			c.Tenants[0].ID, c.Tenants[0].JWTSecret = strings.Repeat("a", 32), "12345678"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(&c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestValidateJoinsErrors(t *testing.T) {
	c := Default()
	c.HTTP.Addr = "nope"
	c.Persist.BatchSize = 0
	c.Tenants[0].ID = "Bad"
	err := c.Validate()
	for _, k := range []string{"http.addr", "persist.batch_size", "tenants[0].id"} {
		wantKeyError(t, err, k, "")
	}
	if n := len(keyErrorsOf(err)); n != 3 {
		t.Fatalf("want 3 problems, got %d: %v", n, err)
	}
}

// TestValidateChecksEverySection: a bad value in any section is refused,
// whichever roles would read it — the one check every process, every reload
// and `imshard config check` go through.
func TestValidateChecksEverySection(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
	}{
		{"http", func(c *Config) { c.HTTP.Addr = "x" }, "http.addr"},
		{"http against send", func(c *Config) { c.HTTP.WriteTimeout = c.Send.ProduceTimeout }, "http.write_timeout"},
		{"auth", func(c *Config) { c.Auth.MaxTokenTTL = 0 }, "auth.max_token_ttl"},
		{"metrics", func(c *Config) { c.Metrics.Addr = "x" }, "metrics.addr"},
		{"log", func(c *Config) { c.Log.Level = "x" }, "log.level"},
		{"mysql", func(c *Config) { c.MySQL.MaxOpenConns = 0 }, "mysql.max_open_conns"},
		{"redis", func(c *Config) { c.Redis.Addrs = nil }, "redis.addrs"},
		{"kafka", func(c *Config) { c.Kafka.Group = "" }, "kafka.group"},
		{"tenants", func(c *Config) { c.Tenants = nil }, "tenants"},
		{"shard", func(c *Config) { c.Shard.PatrolInterval = time.Second }, "shard.patrol_interval"},
		{"send", func(c *Config) { c.Send.ProduceTimeout = 0 }, "send.produce_timeout"},
		{"hot_cache", func(c *Config) { c.HotCache.TTL = -1 }, "hot_cache.ttl"},
		{"stream", func(c *Config) { c.Stream.IdleTimeout = c.Stream.PingInterval - 1 }, "stream.idle_timeout"},
		{"persist", func(c *Config) { c.Persist.BatchSize = 0 }, "persist.batch_size"},
		{"migrate", func(c *Config) { c.Migrate.BatchSize = 0 }, "migrate.batch_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(&c)
			wantKeyError(t, c.Validate(), tt.key, "")
		})
	}
}

func TestMasked(t *testing.T) {
	c := Default()
	c.Redis.Password = "redis-pw-123"
	c.Kafka.SASL = SASL{Mechanism: SASLScramSHA512, Username: "imshard", Password: "kafka-pw-321"}
	c.MySQL.DSNTemplate = "app:tmpl-pw-456@tcp(db:3306)/imshard_{tenant}?parseTime=true"
	c.Tenants = []Tenant{
		{ID: "demo", JWTSecret: "jwt-secret-789"},
		{ID: "acme", JWTSecret: "jwt-secret-abc", DSN: "acme:dsn-pw-def@tcp(db2:3306)/acme"},
	}
	before := c
	before.Tenants = slices.Clone(c.Tenants)
	out, err := c.Masked()
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, secret := range []string{"redis-pw-123", "kafka-pw-321", "tmpl-pw-456", "jwt-secret-789", "jwt-secret-abc", "dsn-pw-def"} {
		if strings.Contains(s, secret) {
			t.Errorf("Masked output contains secret %q:\n%s", secret, s)
		}
	}
	for _, kept := range []string{"app:****@tcp(db:3306)/imshard_{tenant}?parseTime=true", "acme:****@tcp(db2:3306)/acme", "id: acme", "shutdown_grace: 30s", "patrol_interval: 24h", "batch_linger: 20ms", "127.0.0.1:8080", "brokers: []", "mechanism: SCRAM-SHA-512", "username: imshard"} {
		if !strings.Contains(s, kept) {
			t.Errorf("Masked output lacks %q:\n%s", kept, s)
		}
	}
	if !reflect.DeepEqual(c, before) {
		t.Errorf("Masked modified the config")
	}

	// The output is itself a valid config file with the secrets replaced.
	back := mustLoad(t, LoadOptions{Path: writeFile(t, "masked.yaml", s)})
	want := c
	want.Redis.Password = "****"
	want.Kafka.SASL.Password = "****"
	want.MySQL.DSNTemplate = "app:****@tcp(db:3306)/imshard_{tenant}?parseTime=true"
	want.Tenants = []Tenant{{ID: "demo", JWTSecret: "****"}, {ID: "acme", JWTSecret: "****", DSN: "acme:****@tcp(db2:3306)/acme"}}
	if !reflect.DeepEqual(*back, want) {
		t.Errorf("Masked output reloads as\n%+v\nwant\n%+v", *back, want)
	}

	d := Default()
	out, err = d.Masked()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `password: ""`) {
		t.Errorf("an empty password should stay visibly empty:\n%s", out)
	}
}

func TestMaskDSN(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"root@tcp(127.0.0.1:3306)/imshard_{tenant}?parseTime=true", "root@tcp(127.0.0.1:3306)/imshard_{tenant}?parseTime=true"},
		{"u:p@tcp(h:3306)/db", "u:****@tcp(h:3306)/db"},
		{"u:p@ss:w/rd@tcp(h:3306)/db?x=1", "u:****@tcp(h:3306)/db?x=1"},
		{"u:@tcp(h:3306)/db", "u:@tcp(h:3306)/db"},
		{"u:p@/db", "u:****@/db"},
		{"u:p@unix(/tmp/mysql.sock)/db", "u:****@unix(/tmp/mysql.sock)/db"},
		{"mysql://u:secret@h:3306/db", "mysql://u:%2A%2A%2A%2A@h:3306/db"},
		{"mysql://u@h:3306/db", "mysql://u@h:3306/db"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := maskDSN(tt.in); got != tt.want {
				t.Fatalf("maskDSN(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestTenantDSN(t *testing.T) {
	c := Default()
	if got, want := c.TenantDSN(Tenant{ID: "acme"}), "root@tcp(127.0.0.1:3306)/imshard_acme?parseTime=true&loc=UTC"; got != want {
		t.Errorf("TenantDSN from template = %q, want %q", got, want)
	}
	if got := c.TenantDSN(Tenant{ID: "acme", DSN: "own"}); got != "own" {
		t.Errorf("TenantDSN with own dsn = %q", got)
	}
}

func TestTenantsFile(t *testing.T) {
	yamlFile := "- id: demo\n  jwt_secret: replaced-secret\n- id: acme\n  jwt_secret: acme-secret\n  dsn: a@tcp(h:3306)/acme\n"
	jsonFile := `[{"id":"demo","jwt_secret":"replaced-secret"},{"id":"acme","jwt_secret":"acme-secret","dsn":"a@tcp(h:3306)/acme"}]`
	want := []Tenant{{ID: "demo", JWTSecret: "replaced-secret"}, {ID: "acme", JWTSecret: "acme-secret", DSN: "a@tcp(h:3306)/acme"}}
	for _, tt := range []struct{ name, file, content string }{
		{"yaml", "t.yaml", yamlFile},
		{"yml", "t.yml", yamlFile},
		{"json", "t.json", jsonFile},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, tt.file, tt.content)
			got, err := LoadTenantsFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("LoadTenantsFile = %+v, want %+v", got, want)
			}
			c := mustLoad(t, LoadOptions{Env: []string{"IMSHARD_TENANTS_FILE=" + p}})
			if !reflect.DeepEqual(c.Tenants, want) {
				t.Fatalf("Load merged tenants = %+v, want %+v", c.Tenants, want)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}

	errTests := []struct {
		name, file, content string
		key, msg            string // key "" = not a *KeyError, msg must name the file
	}{
		{"invalid id yaml", "t.yaml", "- id: Bad-ID\n  jwt_secret: 12345678x\n", "tenants[0].id", `"Bad-ID"`},
		{"invalid id json", "t.json", `[{"id":"ok","jwt_secret":"12345678x"},{"id":"Bad-ID","jwt_secret":"12345678x"}]`, "tenants[1].id", "t.json"},
		{"short secret", "t.yaml", "- id: a\n  jwt_secret: short\n", "tenants[0].jwt_secret", "at least 8"},
		{"duplicate id", "t.yaml", "- {id: a, jwt_secret: 12345678x}\n- {id: a, jwt_secret: 12345678y}\n", "tenants[1].id", "duplicate"},
		{"shared secret", "t.yaml", "- {id: a, jwt_secret: 12345678x}\n- {id: b, jwt_secret: 12345678x}\n", "tenants[1].jwt_secret", "secret of tenants[0] too"},
		{"unknown field yaml", "t.yaml", "- {id: a, jwt_secret: 12345678x, secret: y}\n", "", "t.yaml"},
		{"unknown field json", "t.json", `[{"id":"a","jwt_secret":"12345678x","secret":"y"}]`, "", "t.json"},
		{"trailing json", "t.json", `[] []`, "", "t.json"},
		{"bad extension", "t.txt", "[]", "", "t.txt"},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, tt.file, tt.content)
			_, err := LoadTenantsFile(p)
			_, lerr := load(t, LoadOptions{Env: []string{"IMSHARD_TENANTS_FILE=" + p}})
			for _, e := range []error{err, lerr} {
				if tt.key != "" {
					wantKeyError(t, e, tt.key, tt.msg)
				} else if e == nil || !strings.Contains(e.Error(), tt.msg) {
					t.Fatalf("err = %v, want one naming %s", e, tt.msg)
				}
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "none.yaml")
		_, err := load(t, LoadOptions{Env: []string{"IMSHARD_TENANTS_FILE=" + p}})
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), p) {
			t.Fatalf("err = %v, want not-exist naming %s", err, p)
		}
	})
	t.Run("empty file", func(t *testing.T) {
		got, err := LoadTenantsFile(writeFile(t, "t.yaml", ""))
		if err != nil || len(got) != 0 {
			t.Fatalf("LoadTenantsFile(empty) = %v, %v", got, err)
		}
	})
}

func TestMergeTenants(t *testing.T) {
	a := Tenant{ID: "a", JWTSecret: "secret-a1"}
	a2 := Tenant{ID: "a", JWTSecret: "secret-a2"}
	b := Tenant{ID: "b", JWTSecret: "secret-b1"}
	c := Tenant{ID: "c", JWTSecret: "secret-c1"}
	tests := []struct {
		name        string
		base, extra []Tenant
		want        []Tenant
		errKey      string
	}{
		{"extra appended in order", []Tenant{a}, []Tenant{c, b}, []Tenant{a, c, b}, ""},
		{"extra wins in place", []Tenant{a, b}, []Tenant{c, a2}, []Tenant{a2, b, c}, ""},
		{"both empty", nil, nil, nil, ""},
		{"duplicate in base", []Tenant{a, b, a2}, nil, nil, "tenants[2].id"},
		{"duplicate in extra", []Tenant{b}, []Tenant{a, a2}, nil, "tenants[1].id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := slices.Clone(tt.base)
			got, err := MergeTenants(tt.base, tt.extra)
			if tt.errKey != "" {
				wantKeyError(t, err, tt.errKey, "duplicate")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("MergeTenants = %+v, want %+v", got, tt.want)
			}
			if !reflect.DeepEqual(tt.base, base) {
				t.Fatalf("MergeTenants modified base")
			}
		})
	}
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 20 * time.Millisecond: "20ms", 30 * time.Second: "30s", 2 * time.Minute: "2m",
		90 * time.Second: "1m30s", 24 * time.Hour: "24h", 168 * time.Hour: "168h", time.Hour + time.Second: "1h0m1s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(fmtDuration(d)); err != nil || back != d {
			t.Errorf("fmtDuration(%v) does not parse back: %v %v", d, back, err)
		}
	}
}

func FuzzLoadYAML(f *testing.F) {
	if b, err := os.ReadFile(examplePath); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"", "http: {adr: x}", "foo: 1", "http: 5", "http:\n", "- a", "tenants: [{1: 2}]", "tenants: [null, {id: a}]",
		"redis: {addrs: [1, {a: b}]}", "mysql: {max_open_conns: 1e400}", "shard: {auto_advance: 1}", "{a: &x [*x]}",
		"http: {shutdown_grace: 9223372036854775807}", "tenants_file: /dev/zero", "tenants: {id: a}", "? [a]\n: b",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(LoadOptions{Path: p, Env: []string{}})
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		_ = c.Validate()
		if _, err := c.Masked(); err != nil {
			t.Fatalf("Masked: %v", err)
		}
	})
}

// TestLimitsLoad: the limits section from a file and the environment, and
// a tenant's own buckets (in the file and a tenants file) replacing the
// defaults bucket by bucket; an unknown key inside a tenant's limits is
// refused with its path.
func TestLimitsLoad(t *testing.T) {
	tenants := writeFile(t, "tenants.yaml", "- {id: b, jwt_secret: s3cret-bbb, limits: {reads: {per_second: 7, burst: 9}}}\n")
	path := writeFile(t, "imshard.yaml", `limits: {send: {user: {per_second: 2.5, burst: 5}}}
tenants:
  - {id: a, jwt_secret: s3cret-aaa, limits: {send: {topic: {per_second: 1, burst: 1}}}}
tenants_file: `+tenants+"\n")
	c := mustLoad(t, LoadOptions{Path: path, Env: []string{"IMSHARD_LIMITS_SEND_TENANT_PER_SECOND=0.5", "IMSHARD_LIMITS_SEND_TENANT_BURST=3"}})
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	def := DefaultLimits()
	a, b := c.Limits.Of(c.Tenants[0]), c.Limits.Of(c.Tenants[1])
	want := map[string][2]Rate{
		"send.tenant": {a.Send.Tenant, Rate{0.5, 3}},
		"send.user":   {a.Send.User, Rate{2.5, 5}},
		"send.topic":  {a.Send.Topic, Rate{1, 1}},
		"reads":       {a.Reads, def.Reads},
		"b reads":     {b.Reads, Rate{7, 9}},
		"b topic":     {b.Send.Topic, def.Send.Topic},
	}
	for name, w := range want {
		if w[0] != w[1] {
			t.Errorf("%s: %+v, want %+v", name, w[0], w[1])
		}
	}
	bad := writeFile(t, "bad.yaml", "tenants: [{id: a, jwt_secret: s3cret-aaa, limits: {send: {usr: {per_second: 1, burst: 1}}}}]\n")
	if _, err := Load(LoadOptions{Path: bad, Env: []string{}}); err == nil || !strings.Contains(err.Error(), "tenants[0].limits.send.usr") {
		t.Errorf("unknown key in a tenant's limits: %v", err)
	}
}

// TestRatePolicyWindow: a bucket's policy window is the time it refills
// from empty, in whole seconds, at least one.
func TestRatePolicyWindow(t *testing.T) {
	for _, c := range []struct {
		r    Rate
		want int64
	}{{Rate{10, 10}, 1}, {Rate{10, 20}, 2}, {Rate{20, 5}, 1}, {Rate{3, 10}, 4}, {Rate{0.001, 3}, 3000}} {
		if got := c.r.Window(); got != c.want {
			t.Errorf("%+v: window %d, want %d", c.r, got, c.want)
		}
	}
}
