package test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/persist"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// Send and persist run as separate processes on one devkafka. While
// clients send over HTTP (with a month switch half-way), the persist process
// is killed with SIGKILL right after a DB commit (before its Redis follow-ups
// and offset commit), then again mid-stream; each restart resumes from the
// committed offsets. In the end every accepted message is stored exactly
// once in the month its answer named, the mirror counts each row once, the
// repair queue has rebuilt the Redis routes, and nothing is left behind.
func TestFaultPersistKilledBetweenCommitsAndMidStream(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	broker := faultsDevKafka(t)
	cfg := faultsConfig(t, tenant, broker, testenv.DSNTemplate(), "")
	ctx := context.Background()
	now, err := routing.NewClock(testenv.Redis(t)).Month(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := now.Prev(), now
	for _, args := range [][]string{
		{"shard", "ensure", "--config", cfg, "--from", m1.String()},
		{"shard", "activate", "--config", cfg, "--tenant", tenant, "--month", m1.String()},
	} {
		if code, out := runCLI(t, nil, args...); code != 0 {
			t.Fatalf("%v: %d\n%s", args, code, out)
		}
	}
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	sendProc := faultsStart(t, []string{"IMSHARD_HTTP_ADDR=" + api, fmt.Sprintf("IMSHARD_METRICS_ADDR=127.0.0.1:%d", testenv.FreePort(t))},
		"serve", "--roles=send", "--config", cfg)
	client := faultsClient(t, "http://"+api, []byte("secret-"+tenant), tenant)
	waitFor(t, 30*time.Second, func() bool { return client.ready() })
	topics := []string{"k0", "k1", "k2", "k3", "k4"}
	for i, tp := range topics {
		client.group(t, tp, int64(i+1), 1, 21)
	}
	persistEnv := []string{fmt.Sprintf("IMSHARD_METRICS_ADDR=127.0.0.1:%d", testenv.FreePort(t))}

	const clients, perClient = 20, 60
	sending := make(chan []faultsSent, 1)
	half := make(chan struct{})
	go func() { sending <- client.sendMany(topics, clients, perClient, half) }()

	db := testenv.OpenDB(t, strings.Replace(testenv.DSNTemplate(), "{tenant}", tenant, 1))
	count := func() int { return persistCount(persistStored(t, db, m1, m2)) }
	crashed := faultsStart(t, append(persistEnv, persist.CrashAfterCommitEnv+"=5"), "persist", "--config", cfg)
	err = crashed.wait(t, 60*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Fatalf("persist should have killed itself after its 5th commit: %v\n%s", err, crashed.out.String())
	}
	<-half
	if code, out := runCLI(t, nil, "shard", "activate", "--config", cfg, "--tenant", tenant, "--month", m2.String()); code != 0 {
		t.Fatalf("activate %s: %d\n%s", m2, code, out)
	}
	client.resume()
	afterCrash := count()
	mid := faultsStart(t, persistEnv, "persist", "--config", cfg)
	waitFor(t, 60*time.Second, func() bool { return count() >= afterCrash+clients*perClient/5 })
	mid.kill9(t)

	last := faultsStart(t, persistEnv, "persist", "--config", cfg)
	sent := <-sending
	if len(sent) != clients*perClient {
		t.Fatalf("accepted %d of %d sends\n%s", len(sent), clients*perClient, sendProc.out.String())
	}
	stored := persistWaitCountIn(t, db, len(sent), 90*time.Second, m1, m2)
	per := map[routing.Month]int{}
	for _, s := range sent {
		got := stored[s.topic][s.seq]
		if got.String() != s.month {
			t.Fatalf("%s/%d stored in %q, answered month %s", s.topic, s.seq, got, s.month)
		}
		per[got]++
	}
	if per[m1] == 0 || per[m2] == 0 {
		t.Fatalf("the switch must split the messages: %v", per)
	}
	waitFor(t, 30*time.Second, func() bool {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM im_group_message_route_repair").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	space, err := routing.NewKeySpace("") // the processes' configuration sets no redis.key_prefix
	if err != nil {
		t.Fatal(err)
	}
	persistCheckRoutesOf(t, db, routing.NewRoutes(testenv.Redis(t), space, routing.NewScripts()), tenant, stored)
	_ = last.cmd.Process.Signal(syscall.SIGTERM)
	if err := last.wait(t, 30*time.Second); err != nil {
		t.Fatalf("persist did not stop cleanly: %v\n%s", err, last.out.String())
	}
}

// MariaDB stops in the middle of a run: persist retries the batches with
// backoff and commits no offset; when MariaDB is back every event is stored,
// once, and nothing went to the dead letters.
func TestFaultMariaDBDownMidRunRetriesUntilBack(t *testing.T) {
	mdb := testenv.StartMariaDB(t)
	env := persistOnly(t, func(c *config.Config) { c.MySQL.DSNTemplate = mdb.DSNTemplate })
	var evs []message.Event
	for i := 0; i < 400; i++ {
		evs = append(evs, persistEvent(env.Tenant, fmt.Sprintf("d%d", i%4), int64(i/4+1), env.Start, 3, fmt.Sprint(i)))
	}
	persistProduce(t, env, evs[:100]...)
	persistWaitCount(t, env, 100, 30*time.Second, env.Start)
	mdb.Stop()
	persistProduce(t, env, evs[100:]...)
	waitFor(t, 30*time.Second, func() bool {
		return persistMetric(t, env, "imshard_persist_retries_total", `reason="transient"`) >= 3
	})
	mdb.Start()
	stored := persistWaitCount(t, env, len(evs), 60*time.Second, env.Start)
	if n := persistMetric(t, env, "group_message_dead_letter_total"); n != 0 {
		t.Fatalf("dead letters while MariaDB was down: %v", n)
	}
	persistCheckRoutes(t, env, stored)
}
