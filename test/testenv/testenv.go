// Package testenv provides the shared test infrastructure of imshard's
// integration tests: the shared MariaDB and Redis (brought up by
// test/services.sh), per-test tenants that clean up after themselves, an
// in-process Kafka (kfake), and private redis-server / Redis Cluster /
// mariadbd instances for fault tests.
//
// Missing services are test failures, never skips: run `bash test/services.sh`
// (or `bash test/run.sh`) first.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/localsrv"
)

const (
	defaultMySQLAddr = "127.0.0.1:3306"
	defaultRedisAddr = "127.0.0.1:6379"
	adminDSNParams   = "?parseTime=true&loc=UTC&multiStatements=false"

	// TenantDBPrefix is the default per-tenant database name prefix.
	TenantDBPrefix = "imshard_"
)

// TenantPattern is the tenant id syntax of the product.
var TenantPattern = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// MySQLAdminDSN is the DSN, without a database, of the shared MariaDB/MySQL
// server: env IMSHARD_TEST_MYSQL_DSN, else
// "root@tcp($IMSHARD_TEST_MYSQL_ADDR)/?parseTime=true&loc=UTC&multiStatements=false"
// with the address defaulting to 127.0.0.1:3306.
func MySQLAdminDSN() string {
	if dsn := os.Getenv("IMSHARD_TEST_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	addr := os.Getenv("IMSHARD_TEST_MYSQL_ADDR")
	if addr == "" {
		addr = defaultMySQLAddr
	}
	return "root@tcp(" + addr + ")/" + adminDSNParams
}

// RedisAddr is the address of the shared Redis: env IMSHARD_TEST_REDIS_ADDR
// or 127.0.0.1:6379.
func RedisAddr() string {
	if a := os.Getenv("IMSHARD_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return defaultRedisAddr
}

// DSNTemplate is the product's DSN template for the shared server:
// "root@tcp(127.0.0.1:3306)/imshard_{tenant}?parseTime=true&loc=UTC", with
// user, password and address taken from MySQLAdminDSN.
func DSNTemplate() string {
	cfg, err := mysql.ParseDSN(MySQLAdminDSN())
	if err != nil {
		panic(fmt.Sprintf("testenv: bad IMSHARD_TEST_MYSQL_DSN: %v", err))
	}
	return dsnTemplate(cfg.User, cfg.Passwd, cfg.Net, cfg.Addr)
}

func dsnTemplate(user, pass, network, addr string) string {
	cred := user
	if pass != "" {
		cred += ":" + pass
	}
	if network == "" {
		network = "tcp"
	}
	return cred + "@" + network + "(" + addr + ")/" + TenantDBPrefix + "{tenant}?parseTime=true&loc=UTC"
}

// mysqlAddr returns the address part of a DSN (for messages).
func mysqlAddr(dsn string) string {
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		return cfg.Addr
	}
	return "?"
}

// NewTenant returns a fresh tenant id: "t" followed by 12 random [a-z0-9].
// It fails the test if the shared MariaDB or Redis does not answer, and
// registers a cleanup that drops database imshard_<id> and deletes every
// Redis key of the tenant (*im:{<id>}:*, under any redis.key_prefix) on the
// shared servers.
func NewTenant(t testing.TB) string {
	t.Helper()
	checkShared(t)
	id := randomID(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropTenantDBAt(ctx, MySQLAdminDSN(), id); err != nil {
			t.Errorf("testenv: cleanup of tenant %s: %v", id, err)
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{RedisAddr()}, DisableCache: true})
		if err != nil {
			t.Errorf("testenv: cleanup of tenant %s: connect to Redis %s: %v", id, RedisAddr(), err)
			return
		}
		defer c.Close()
		if err := DeleteTenantKeys(ctx, c, id); err != nil {
			t.Errorf("testenv: cleanup of tenant %s: %v", id, err)
		}
	})
	return id
}

func randomID(t testing.TB) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random tenant id: %v", err)
	}
	id := make([]byte, 0, 13)
	id = append(id, 't')
	for _, c := range b {
		id = append(id, alphabet[int(c)%len(alphabet)])
	}
	return string(id)
}

var (
	sharedMu sync.Mutex
	sharedOK = map[string]bool{} // by Redis addr + MySQL DSN
)

// checkShared fails the test unless both shared servers answer. A success is
// remembered for the rest of the process.
func checkShared(t testing.TB) {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	key := RedisAddr() + "\x00" + MySQLAdminDSN()
	if sharedOK[key] {
		return
	}
	var problems []string
	if pong, err := respDo(RedisAddr(), 5*time.Second, "PING"); err != nil || pong != "PONG" {
		problems = append(problems, fmt.Sprintf("shared Redis at %s (IMSHARD_TEST_REDIS_ADDR) does not answer PING: %v", RedisAddr(), errOr(err, "reply "+pong)))
	}
	if err := pingMySQL(MySQLAdminDSN(), 10*time.Second); err != nil {
		problems = append(problems, fmt.Sprintf("shared MariaDB at %s (IMSHARD_TEST_MYSQL_DSN / IMSHARD_TEST_MYSQL_ADDR) is not usable: %v", mysqlAddr(MySQLAdminDSN()), err))
	}
	if len(problems) > 0 {
		t.Fatalf("testenv: %s\n(run `bash test/services.sh` to start the test services; missing services are failures, not skips)", strings.Join(problems, "\n"))
	}
	sharedOK[key] = true
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}

func pingMySQL(dsn string, timeout time.Duration) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return db.PingContext(ctx)
}

// DropTenantDB drops database imshard_<tenant> (if it exists) through db.
func DropTenantDB(ctx context.Context, db *sql.DB, tenant string) error {
	if !TenantPattern.MatchString(tenant) {
		return fmt.Errorf("bad tenant id %q", tenant)
	}
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+TenantDBPrefix+tenant+"`"); err != nil {
		return fmt.Errorf("drop database %s%s: %w", TenantDBPrefix, tenant, err)
	}
	return nil
}

func dropTenantDBAt(ctx context.Context, dsn, tenant string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return DropTenantDB(ctx, db, tenant)
}

// DeleteTenantKeys deletes every key matching *im:{<tenant>}:* — the
// tenant's keys under any installation's redis.key_prefix — with SCAN on
// every node the client knows (standalone or cluster) and UNLINK.
func DeleteTenantKeys(ctx context.Context, c rueidis.Client, tenant string) error {
	if !TenantPattern.MatchString(tenant) {
		return fmt.Errorf("bad tenant id %q", tenant)
	}
	pattern := "*im:{" + tenant + "}:*"
	for addr, node := range c.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return fmt.Errorf("scan %s on %s: %w", pattern, addr, err)
			}
			if len(e.Elements) > 0 {
				// All keys of a tenant share the hash tag, hence one slot: a
				// multi-key UNLINK is valid on a cluster too.
				if err := c.Do(ctx, c.B().Unlink().Key(e.Elements...).Build()).Error(); err != nil {
					return fmt.Errorf("unlink %d keys of %s: %w", len(e.Elements), pattern, err)
				}
			}
			cursor = e.Cursor
			if cursor == 0 {
				break
			}
		}
	}
	return nil
}

// Redis returns a client of the shared Redis, closed on cleanup.
func Redis(t testing.TB) rueidis.Client {
	t.Helper()
	return RedisClient(t, RedisAddr())
}

// RedisClient returns a rueidis client for addrs (one standalone server or
// the seed nodes of a cluster; rueidis detects which), closed on cleanup.
func RedisClient(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs})
	if err != nil {
		t.Fatalf("testenv: connect to Redis %v: %v (run `bash test/services.sh`)", addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// MySQL returns a handle on the shared server without a default database,
// closed on cleanup.
func MySQL(t testing.TB) *sql.DB {
	t.Helper()
	return OpenDB(t, MySQLAdminDSN())
}

// OpenDB opens dsn, checks the server answers (failing the test if not) and
// closes the handle on cleanup.
func OpenDB(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("testenv: open MySQL DSN for %s: %v", mysqlAddr(dsn), err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("testenv: MySQL at %s does not answer: %v (run `bash test/services.sh`)", mysqlAddr(dsn), err)
	}
	return db
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := localsrv.FreePort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return port
}

// shortTempDir makes a temp dir with a short path (unix socket paths must stay
// under 108 bytes, which t.TempDir() does not guarantee). It is removed on
// cleanup; register it before the cleanup that kills processes using it so
// that it runs after it.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ims")
	if err != nil {
		t.Fatalf("testenv: make temp dir: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("testenv: remove %s: %v", dir, err)
		}
	})
	return dir
}
