package testenv_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/imshard/imshard/test/testenv"
)

func TestMain(m *testing.M) {
	// rueidis' cluster client may still be in the back-off sleep of a
	// topology refresh (up to 5 s) after Close; it ends on its own.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestNewTenant(t *testing.T) {
	t.Parallel()
	var id string
	t.Run("uses", func(t *testing.T) {
		id = testenv.NewTenant(t)
		if !testenv.TenantPattern.MatchString(id) || len(id) != 13 || id[0] != 't' {
			t.Fatalf("tenant id %q: want t + 12 [a-z0-9]", id)
		}
		if other := testenv.NewTenant(t); other == id {
			t.Fatalf("two tenants with the same id %q", id)
		}
		ctx := ctxT(t, 30*time.Second)
		db := testenv.MySQL(t)
		if _, err := db.ExecContext(ctx, "CREATE DATABASE `imshard_"+id+"`"); err != nil {
			t.Fatal(err)
		}
		// The DSN template reaches the tenant's database.
		tdb := testenv.OpenDB(t, strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", id))
		var name string
		if err := tdb.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil || name != "imshard_"+id {
			t.Fatalf("DATABASE() = %q, %v; want imshard_%s", name, err, id)
		}
		rc := testenv.Redis(t)
		for i := range 2500 { // more than one SCAN page
			if err := rc.Do(ctx, rc.B().Set().Key(fmt.Sprintf("im:{%s}:x%d", id, i)).Value("v").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if t.Failed() {
		return
	}
	ctx := ctxT(t, 30*time.Second)
	var n int
	if err := testenv.MySQL(t).QueryRowContext(ctx,
		"SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", "imshard_"+id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database imshard_%s still exists after cleanup", id)
	}
	rc := testenv.Redis(t)
	keys, err := rc.Do(ctx, rc.B().Keys().Pattern("im:{"+id+"}:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("%d keys of tenant %s left after cleanup, e.g. %s", len(keys), id, keys[0])
	}
}

func TestDSNTemplate(t *testing.T) {
	t.Setenv("IMSHARD_TEST_MYSQL_DSN", "")
	t.Setenv("IMSHARD_TEST_MYSQL_ADDR", "")
	if got, want := testenv.DSNTemplate(), "root@tcp(127.0.0.1:3306)/imshard_{tenant}?parseTime=true&loc=UTC"; got != want {
		t.Errorf("DSNTemplate() = %q, want %q", got, want)
	}
	if got, want := testenv.MySQLAdminDSN(), "root@tcp(127.0.0.1:3306)/?parseTime=true&loc=UTC&multiStatements=false"; got != want {
		t.Errorf("MySQLAdminDSN() = %q, want %q", got, want)
	}
	t.Setenv("IMSHARD_TEST_MYSQL_DSN", "app:s3cret@tcp(db:3307)/?parseTime=true")
	if got, want := testenv.DSNTemplate(), "app:s3cret@tcp(db:3307)/imshard_{tenant}?parseTime=true&loc=UTC"; got != want {
		t.Errorf("DSNTemplate() = %q, want %q", got, want)
	}
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	if p := testenv.FreePort(t); p <= 0 || p > 65535 {
		t.Fatalf("FreePort = %d", p)
	}
}

func TestStartRedis(t *testing.T) {
	t.Parallel()
	s := testenv.StartRedis(t)
	if s.Addr == testenv.RedisAddr() {
		t.Fatalf("private redis on the shared address %s", s.Addr)
	}
	ctx := ctxT(t, time.Minute)
	c := testenv.RedisClient(t, s.Addr)
	if err := c.Do(ctx, c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	// rueidis retries read-only commands until the context ends: keep it short.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := c.Do(short, c.B().Get().Key("k").Build()).Error()
	cancel()
	if err == nil {
		t.Fatal("GET succeeded on a killed server")
	}
	s.Start()
	for range 100 { // the client reconnects on its own
		err = c.Do(ctx, c.B().Get().Key("k").Build()).Error()
		if rueidis.IsRedisNil(err) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !rueidis.IsRedisNil(err) {
		t.Fatalf("GET after restart: %v, want nil reply (no persistence)", err)
	}
	if err := c.Do(ctx, c.B().Set().Key("k").Value("v2").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Start()
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		// one reconnect may be needed after the stop
		if err = c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			t.Fatalf("PING after Stop+Start: %v", err)
		}
	}
}

func TestStartRedisCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartRedisCluster(t, 3)
	if len(addrs) != 3 {
		t.Fatalf("got %d addrs", len(addrs))
	}
	c := testenv.RedisClient(t, addrs...)
	if len(c.Nodes()) != 3 {
		t.Fatalf("client sees %d nodes, want 3 (not in cluster mode?)", len(c.Nodes()))
	}
	ctx := ctxT(t, time.Minute)
	tenants := make([]string, 30)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("c%02d", i)
		for j := range 3 {
			key := fmt.Sprintf("im:{%s}:k%d", tenants[i], j)
			if err := c.Do(ctx, c.B().Set().Key(key).Value(key).Build()).Error(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
		}
	}
	owners := map[string]bool{}
	for _, tn := range tenants {
		for j := range 3 {
			key := fmt.Sprintf("im:{%s}:k%d", tn, j)
			v, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
			if err != nil || v != key {
				t.Fatalf("GET %s = %q, %v", key, v, err)
			}
		}
		for addr, node := range c.Nodes() {
			if n, _ := node.Do(ctx, node.B().Dbsize().Build()).AsInt64(); n > 0 {
				owners[addr] = true
			}
		}
	}
	if len(owners) != 3 {
		t.Errorf("keys landed on %d nodes, want all 3", len(owners))
	}
	// DeleteTenantKeys works through a cluster client.
	if err := testenv.DeleteTenantKeys(ctx, c, tenants[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Get().Key("im:{"+tenants[0]+"}:k0").Build()).Error(); !rueidis.IsRedisNil(err) {
		t.Errorf("key still there after DeleteTenantKeys: %v", err)
	}
	if v, err := c.Do(ctx, c.B().Get().Key("im:{"+tenants[1]+"}:k0").Build()).ToString(); err != nil || v == "" {
		t.Errorf("other tenant's key gone: %q %v", v, err)
	}
}

func TestStartMariaDB(t *testing.T) {
	t.Parallel()
	m := testenv.StartMariaDB(t)
	if !strings.Contains(m.DSNTemplate, "@tcp("+m.Addr+")/imshard_{tenant}?") {
		t.Fatalf("DSNTemplate %q", m.DSNTemplate)
	}
	ctx := ctxT(t, 3*time.Minute)
	db := testenv.OpenDB(t, m.AdminDSN)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE imshard_fault"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE imshard_fault.t (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO imshard_fault.t VALUES (1),(2)"); err != nil {
		t.Fatal(err)
	}
	m.Kill()
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("ping succeeded on a killed server")
	}
	m.Start()
	count := func() int {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM imshard_fault.t").Scan(&n); err != nil {
			t.Fatalf("after restart: %v", err)
		}
		return n
	}
	if n := count(); n != 2 {
		t.Fatalf("%d rows after kill -9 + restart, want 2", n)
	}
	m.Stop()
	m.Start()
	if n := count(); n != 2 {
		t.Fatalf("%d rows after stop + restart, want 2", n)
	}
	tdb, err := sql.Open("mysql", strings.ReplaceAll(m.DSNTemplate, "{tenant}", "fault"))
	if err != nil {
		t.Fatal(err)
	}
	defer tdb.Close()
	var n int
	if err := tdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("via DSNTemplate: %d, %v", n, err)
	}
}

func TestKafka(t *testing.T) {
	t.Parallel()
	addrs := testenv.Kafka(t)
	ctx := ctxT(t, time.Minute)
	const topic = "testenv.kafka"
	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("hello")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("no record consumed: %v", err)
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fetch %s/%d: %v", topic, p, err)
			}
		})
		var got []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r) })
		if len(got) > 0 {
			if len(got) != 1 || string(got[0].Value) != "hello" || string(got[0].Key) != "k" {
				t.Fatalf("consumed %d records, first %q=%q", len(got), got[0].Key, got[0].Value)
			}
			return
		}
	}
}
