package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// restoreTool finds the first of names on PATH (the MariaDB name, then the
// MySQL one); test/services.sh installs them.
func restoreTool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Fatalf("none of %v on PATH (bash test/services.sh installs mariadb-client)", names)
	return ""
}

// restoreClientArgs are the connection flags of the client tools for the
// shared server.
func restoreClientArgs(t *testing.T) []string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(cfg.Addr, ":")
	return []string{"--protocol=tcp", "-h", host, "-P", port, "-u", cfg.User, "--password=" + cfg.Passwd}
}

// The restore drill of docs/operations.md ("Backup and restore of a
// tenant"): dump a tenant database while sends continue, restore it into a
// fresh database, flush the tenant's Redis keys, run `imshard route restore`
// — then every message that reached MySQL before the dump is readable, and
// every topic, including one created after the dump, resumes above every
// seq ever issued.
func TestRestoreDrill(t *testing.T) {
	t.Parallel()
	const step = 4 // reservations move often, so seqs issued after the dump pass the dump's
	e := writepathStart(t, harness.Options{Mutate: func(c *config.Config) { c.Send.SeqReserveStep = step }})
	topics := []string{"rst-a", "rst-b", "rst-c"}
	for i, topic := range topics {
		e.group(topic, int64(i+1), "active")
		e.member(topic, 7, "member", time.Time{})
	}
	tok := e.Token(7, "")

	var (
		mu     sync.Mutex
		issued = map[string]int64{} // topic → highest seq a send was answered with
		sent   int
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	send := func(topic, cmid string) {
		r := e.mustSend(tok, topic, sendBody(cmid, cmid))
		mu.Lock()
		issued[topic] = max(issued[topic], r.Seq)
		sent++
		mu.Unlock()
	}
	sentNow := func() int { mu.Lock(); defer mu.Unlock(); return sent }
	for w, topic := range topics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				send(topic, fmt.Sprintf("w%d-%d", w, i))
			}
		}()
	}
	// some history stored before the dump
	sendWaitFor(t, 30*time.Second, "messages stored before the dump", func() bool {
		return persistCount(persistStored(t, e.DB, e.Start)) >= 30
	})

	// Everything committed now is in the dump: --single-transaction reads
	// one snapshot taken after this point.
	before := persistStored(t, e.DB, e.Start)
	db := testenv.TenantDBPrefix + e.Tenant
	dump := filepath.Join(t.TempDir(), "tenant.sql")
	out, err := os.Create(dump)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(restoreTool(t, "mariadb-dump", "mysqldump"),
		append(restoreClientArgs(t), "--single-transaction", "--skip-lock-tables", db)...)
	cmd.Stdout = out
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("dump %s: %v\n%s", db, err, stderr.String())
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	sentAtDump := sentNow()

	// sends go on past the dump, and a topic is born that the dump never saw
	sendWaitFor(t, 30*time.Second, "sends after the dump", func() bool { return sentNow() >= sentAtDump+8*step })
	e.group("rst-new", 9, "active")
	e.member("rst-new", 7, "member", time.Time{})
	for i := range 2 * step {
		send("rst-new", fmt.Sprintf("new-%d", i))
	}
	close(stop)
	wg.Wait()
	e.Stop()

	// restore into a fresh database and point the tenant at it
	restored := db + "_r"
	admin := testenv.MySQL(t)
	if _, err := admin.Exec("CREATE DATABASE `" + restored + "`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS `" + restored + "`") })
	in, err := os.Open(dump)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	load := exec.Command(restoreTool(t, "mariadb", "mysql"), append(restoreClientArgs(t), restored)...)
	load.Stdin = in
	if b, err := load.CombinedOutput(); err != nil {
		t.Fatalf("load the dump into %s: %v\n%s", restored, err, b)
	}
	restoredDSN := strings.Replace(strings.Replace(testenv.DSNTemplate(), "{tenant}", e.Tenant, 1), "/"+db+"?", "/"+restored+"?", 1)
	ctx := context.Background()
	if err := testenv.DeleteTenantKeys(ctx, testenv.Redis(t), e.Tenant); err != nil {
		t.Fatal(err)
	}

	// the documented restore step, as an operator runs it
	cfgFile := tenantConfig(t, e.Tenant, fmt.Sprintf("kafka: {brokers: [%q], partitions: 4}\nsend: {seq_reserve_step: %d}\nshard: {auto_advance: false}\n",
		e.Config.Kafka.Brokers[0], step))
	cfgText, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	cfgText = []byte(strings.Replace(string(cfgText), `jwt_secret: "secret-`+e.Tenant+`"}`, fmt.Sprintf(`jwt_secret: "secret-%s", dsn: %q}`, e.Tenant, restoredDSN), 1))
	if err := os.WriteFile(cfgFile, cfgText, 0o600); err != nil {
		t.Fatal(err)
	}
	code, outText := runCLI(t, nil, "--config", cfgFile, "route", "restore", "--tenant="+e.Tenant)
	if code != 0 || !strings.Contains(outText, "raised the seq reservations of 4 topics") {
		t.Fatalf("route restore: exit %d\n%s", code, outText)
	}

	r := writepathStart(t, harness.Options{Tenant: e.Tenant, Brokers: e.Config.Kafka.Brokers, Mutate: func(c *config.Config) {
		c.Send.SeqReserveStep = step
		c.Tenants[0].DSN = restoredDSN
	}})
	// every message that reached MySQL before the dump is readable
	for _, topic := range topics {
		got := rpWalkBefore(t, r.Env, 7, topic, 50)
		for seq := range before[topic] {
			if !slices.Contains(got, seq) {
				t.Errorf("%s seq %d was stored before the dump and is not readable after the restore", topic, seq)
			}
		}
	}
	// the group born after the dump is not in it: its owner puts it again
	r.group("rst-new", 9, "active")
	r.member("rst-new", 7, "member", time.Time{})
	// every topic resumes above every seq ever issued; a topic fenced by
	// its re-seed takes sends once persist passed the fence (503 with
	// retry_after_ms until then, retried with the same client_msg_id)
	after := map[string]int64{}
	for _, topic := range append(topics, "rst-new") {
		var code int
		var resp sendResp
		sendWaitFor(t, 60*time.Second, "sends to "+topic+" after the restore", func() bool {
			code, resp = r.send(tok, topic, sendBody("after-restore-"+topic, "after"))
			return code != 503
		})
		if code != 201 {
			t.Fatalf("send to %s after the restore: %d %+v", topic, code, resp)
		}
		if resp.Seq <= issued[topic] {
			t.Errorf("%s: a send after the restore got seq %d, but seq %d was already issued", topic, resp.Seq, issued[topic])
		}
		after[topic] = resp.Seq
	}
	// and persist stores them in the restored database
	sendWaitFor(t, 30*time.Second, "the sends after the restore stored", func() bool {
		stored := persistStored(t, r.DB, r.Start)
		for topic, seq := range after {
			if _, ok := stored[topic][seq]; !ok {
				return false
			}
		}
		return true
	})
}

// Bad flags of `imshard route restore` exit 2 naming the flag, before
// anything is touched.
func TestRouteRestoreUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"route", "restore"}, "tenant"},
		{[]string{"route", "restore", "--tenant=demo", "--kafka-since=yesterday"}, "--kafka-since"},
		{[]string{"route", "restore", "--tenant=demo", "--seq-margin=-5"}, "--seq-margin"},
	} {
		code, out := runCLI(t, nil, tc.args...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want 2 naming %s\n%s", tc.args, code, tc.want, out)
		}
	}
}
