package test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/persist"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
	"github.com/imshard/imshard/test/robustness"
	"github.com/imshard/imshard/test/testenv"
)

// rbProduceTimeout is send.produce_timeout of a robustness run: short, so
// that a delayed ack outlasts it within a run of seconds.
const rbProduceTimeout = time.Second

// rbCluster is the topology of a robustness run, as operators deploy it:
// two API processes (send and query), two persist processes (the second
// joins and leaves to move the consumer group's partitions), one devkafka
// process, a private redis-server (so it can be flushed and restarted) and
// the shared MariaDB with the run's own tenant database; Redis and MySQL
// are reached through in-process toxiproxy proxies so their connections can
// be delayed, reset, hung or cut mid-answer.
type rbCluster struct {
	t       *testing.T
	tenant  string
	secret  []byte
	cfg     string
	redis   *testenv.RedisServer
	rproxy  *toxiproxy.Proxy // in front of redis
	mproxy  *toxiproxy.Proxy // in front of MariaDB
	ackFile string           // testhook.AckDelayFileEnv
	env     []string         // every imshard process's hook settings
	apis    []string         // base URLs of the API processes

	mu       sync.Mutex
	persists [2]*faultsProc // [0] always runs (between faults), [1] joins and leaves
	apiProcs []*faultsProc  // the API processes, by their index in apis
	apiKills int            // API faults so far: each takes the next process in turn
	started  []*faultsProc  // every API and persist process of the run, for their logs
}

// rbStart brings the topology up; breakage (a testhook name, or "") is
// armed in every imshard process.
func rbStart(t *testing.T, breakage string) *rbCluster {
	t.Helper()
	c := &rbCluster{t: t, tenant: testenv.NewTenant(t), ackFile: filepath.Join(t.TempDir(), "ack-delay")}
	c.secret = []byte("secret-" + c.tenant)
	c.env = []string{testhook.AckDelayFileEnv + "=" + c.ackFile}
	if breakage != "" {
		c.env = append(c.env, testhook.BreakEnv+"="+breakage)
	}
	c.redis = testenv.StartRedis(t)
	toxics := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	c.rproxy = rbProxy(t, toxics, "redis", c.redis.Addr)
	shared, err := mysql.ParseDSN(testenv.MySQLAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	c.mproxy = rbProxy(t, toxics, "mysql", shared.Addr)
	// short driver timeouts: a hung connection costs a request, not the run
	mcfg := mysql.NewConfig()
	mcfg.User, mcfg.Passwd, mcfg.Net, mcfg.Addr = shared.User, shared.Passwd, "tcp", c.mproxy.Listen
	mcfg.DBName, mcfg.ParseTime, mcfg.Loc = testenv.TenantDBPrefix+"{tenant}", true, time.UTC
	mcfg.Timeout, mcfg.ReadTimeout, mcfg.WriteTimeout = 2*time.Second, 4*time.Second, 4*time.Second
	c.cfg = faultsConfigAt(t, c.tenant, faultsDevKafka(t),
		strings.Replace(mcfg.FormatDSN(), url.PathEscape("{tenant}"), "{tenant}", 1), c.rproxy.Listen, fmt.Sprintf(
			"send: {produce_timeout: %s}\nstream: {acl_check_interval: 500ms, max_connections_per_user: 0}\n", rbProduceTimeout))

	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"shard", "ensure", "--config", c.cfg, "--from", now.String()},
		{"shard", "activate", "--config", c.cfg, "--tenant", c.tenant, "--month", now.String()},
	} {
		if code, out := runCLI(t, nil, args...); code != 0 {
			t.Fatalf("%v: %d\n%s", args, code, out)
		}
	}
	for i := range 2 {
		c.apis = append(c.apis, fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)))
		c.apiProcs = append(c.apiProcs, c.startAPI(i, nil))
	}
	for i := range c.apis {
		c.waitAPI(i)
	}
	c.persists[0] = c.startPersist(nil)
	return c
}

// rbProxy starts a toxiproxy proxy to upstream on a free loopback port
// (kept across a Stop and Start, so clients reconnect to the same address).
func rbProxy(t *testing.T, server *toxiproxy.ApiServer, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	return p
}

// startAPI starts API process i (serve --roles=send,query) on its address
// with extra env.
func (c *rbCluster) startAPI(i int, extra []string) *faultsProc {
	env := []string{"IMSHARD_HTTP_ADDR=" + strings.TrimPrefix(c.apis[i], "http://"),
		fmt.Sprintf("IMSHARD_METRICS_ADDR=127.0.0.1:%d", testenv.FreePort(c.t))}
	return c.logged(faultsStart(c.t, append(append(env, c.env...), extra...), "serve", "--roles=send,query", "--config", c.cfg))
}

// logged keeps p for writeLogs and returns it (the caller holds c.mu or
// runs before the workload).
func (c *rbCluster) logged(p *faultsProc) *faultsProc {
	c.started = append(c.started, p)
	return p
}

// writeLogs writes the output of every API and persist process the run
// started into dir, one file each in the order they started, so that a
// failing run shows what the processes saw (a stall, a rebalance, an error).
func (c *rbCluster) writeLogs(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.started {
		name := fmt.Sprintf("%02d-%s.log", i, p.cmd.Args[1])
		if err := os.WriteFile(filepath.Join(dir, name), []byte(p.out.String()), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// waitAPI waits until API process i answers.
func (c *rbCluster) waitAPI(i int) {
	waitFor(c.t, 30*time.Second, faultsClient(c.t, c.apis[i], c.secret, c.tenant).ready)
}

// replaceAPI kills the next API process in turn (if it still runs) and
// starts another on its address with extra env, returning what puts a
// plain one back: every request in flight to it has no answer.
func (c *rbCluster) replaceAPI(extra []string) (lift func()) {
	c.mu.Lock()
	i := c.apiKills % len(c.apis)
	c.apiKills++
	c.apiProcs[i].kill9(c.t)
	if extra != nil {
		c.apiProcs[i] = c.startAPI(i, extra)
	}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if extra != nil {
			c.apiProcs[i].kill9(c.t)
		}
		c.apiProcs[i] = c.startAPI(i, nil)
		c.waitAPI(i)
	}
}

// startPersist starts a persist process with extra env, logging at info:
// its partition assignments and resumed tenants are what a stalled run's
// logs must show.
func (c *rbCluster) startPersist(extra []string) *faultsProc {
	env := append([]string{"IMSHARD_LOG_LEVEL=info", fmt.Sprintf("IMSHARD_METRICS_ADDR=127.0.0.1:%d", testenv.FreePort(c.t))}, c.env...)
	return c.logged(faultsStart(c.t, append(env, extra...), "persist", "--config", c.cfg))
}

// rbFault is one fault the schedule can inject: inject starts it and
// returns what lifts it (nil for a fault that is over once injected).
type rbFault struct {
	name   string
	inject func(c *rbCluster) (lift func())
}

// rbToxic is a fault adding one toxic to a proxy until lifted.
func rbToxic(name string, proxy func(*rbCluster) *toxiproxy.Proxy, typ, stream, attrs string) rbFault {
	return rbFault{name: name, inject: func(c *rbCluster) func() {
		p := proxy(c)
		body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, typ, stream, attrs)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			c.t.Errorf("toxic %s: %v", name, err)
			return nil
		}
		return func() { _ = p.Toxics.RemoveToxic(context.Background(), name) }
	}}
}

func rbRedisProxy(c *rbCluster) *toxiproxy.Proxy { return c.rproxy }
func rbMySQLProxy(c *rbCluster) *toxiproxy.Proxy { return c.mproxy }

// rbDown is a fault taking a proxy away (every connection dropped, none
// accepted) until lifted.
func rbDown(name string, proxy func(*rbCluster) *toxiproxy.Proxy) rbFault {
	return rbFault{name: name, inject: func(c *rbCluster) func() {
		p := proxy(c)
		p.Stop()
		return func() {
			if err := p.Start(); err != nil {
				c.t.Errorf("restart proxy %s: %v", p.Name, err)
			}
		}
	}}
}

// rbFaults are the faults a schedule picks from.
var rbFaults = []rbFault{
	rbToxic("mysql-latency", rbMySQLProxy, "latency", "downstream", `{"latency":300,"jitter":200}`),
	rbToxic("mysql-reset", rbMySQLProxy, "reset_peer", "upstream", `{"timeout":0}`),
	rbToxic("mysql-hang", rbMySQLProxy, "timeout", "downstream", `{"timeout":0}`),
	rbToxic("mysql-cut", rbMySQLProxy, "limit_data", "downstream", `{"bytes":2000}`),
	rbToxic("mysql-slice", rbMySQLProxy, "slicer", "downstream", `{"average_size":8,"size_variation":4,"delay":2000}`),
	rbDown("mysql-down", rbMySQLProxy),
	rbToxic("redis-latency", rbRedisProxy, "latency", "downstream", `{"latency":200,"jitter":150}`),
	rbToxic("redis-reset", rbRedisProxy, "reset_peer", "upstream", `{"timeout":0}`),
	rbToxic("redis-hang", rbRedisProxy, "timeout", "downstream", `{"timeout":0}`),
	rbToxic("redis-cut", rbRedisProxy, "limit_data", "downstream", `{"bytes":4000}`),
	rbDown("redis-down", rbRedisProxy),
	{name: "kafka-ack-delay", inject: func(c *rbCluster) func() {
		c.setAckDelay(rbProduceTimeout + 700*time.Millisecond)
		return func() { c.setAckDelay(0) }
	}},
	{name: "persist-kill9", inject: func(c *rbCluster) func() {
		c.mu.Lock()
		c.persists[0].kill9(c.t)
		c.mu.Unlock()
		return func() { c.replacePersist(nil) }
	}},
	{name: "persist-crash-after-commit", inject: func(c *rbCluster) func() {
		// the failpoint between persist's DB commit and its Redis
		// follow-ups and offset commit: the process kills itself there
		c.replacePersist([]string{persist.CrashAfterCommitEnv + "=2"})
		return func() { c.replacePersist(nil) }
	}},
	{name: "persist-rebalance", inject: func(c *rbCluster) func() {
		c.mu.Lock()
		c.persists[1] = c.startPersist(nil)
		c.mu.Unlock()
		return func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.persists[1].signal(c.t, syscall.SIGTERM)
			_ = c.persists[1].wait(c.t, 30*time.Second)
			c.persists[1] = nil
		}
	}},
	{name: "api-kill9", inject: func(c *rbCluster) func() {
		// one API process dies with its sockets and requests in flight
		// and comes back on its address when lifted
		return c.replaceAPI(nil)
	}},
	{name: "send-crash-after-ack", inject: func(c *rbCluster) func() {
		// the failpoint between Kafka's ack and the send's post-ack
		// step: the API process kills itself at its second ack there
		return c.replaceAPI([]string{testhook.CrashAfterAckEnv + "=2"})
	}},
	{name: "redis-restart", inject: func(c *rbCluster) func() {
		// it keeps nothing on disk: every key is lost
		c.redis.Kill()
		return func() { c.redis.Start() }
	}},
	{name: "redis-flush", inject: func(c *rbCluster) func() {
		rdb := testenv.RedisClient(c.t, c.redis.Addr)
		if err := rdb.Do(context.Background(), rdb.B().Flushall().Build()).Error(); err != nil {
			c.t.Errorf("flushall: %v", err)
		}
		return nil
	}},
}

// setAckDelay writes the delay every send process reads on each ack.
func (c *rbCluster) setAckDelay(d time.Duration) {
	if err := os.WriteFile(c.ackFile, []byte(d.String()), 0o600); err != nil {
		c.t.Errorf("ack delay: %v", err)
	}
}

// replacePersist kills the first persist process (if it still runs) and
// starts another with extra env in its place.
func (c *rbCluster) replacePersist(extra []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.persists[0].kill9(c.t)
	c.persists[0] = c.startPersist(extra)
}

// inject starts fault f, recording it, and returns what lifts it.
func (c *rbCluster) inject(h *robustness.History, f rbFault) func() {
	op := robustness.Op{Kind: robustness.Fault, Tenant: c.tenant, Fault: f.name, Start: time.Now()}
	id := h.Begin(op)
	lift := f.inject(c)
	if lift == nil {
		h.Finish(id, op)
		return func() {}
	}
	return func() {
		lift()
		h.Finish(id, op)
	}
}
