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

// The persist process is killed with SIGKILL right after a DB commit (before
// its Redis follow-ups and offset commit), then again mid-stream; each
// restart resumes from the committed offsets. In the end every event is
// stored exactly once, the mirror counts each row once, the repair queue
// has rebuilt the Redis routes, and nothing is left behind.
func TestFaultPersistKilledBetweenCommitsAndMidStream(t *testing.T) {
	tenant := testenv.NewTenant(t)
	broker := faultsDevKafka(t)
	cfg := faultsConfig(t, tenant, broker, testenv.DSNTemplate(), "")
	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if code, out := runCLI(t, nil, "shard", "ensure", "--config", cfg, "--from", now.Prev().String()); code != 0 {
		t.Fatalf("shard ensure: %d\n%s", code, out)
	}
	const total = 3000
	evs := make([]message.Event, 0, total)
	for i := 0; i < total; i++ {
		m := now.Prev()
		if i >= total/2 {
			m = now
		}
		topic := fmt.Sprintf("k%d", i%20)
		evs = append(evs, persistEvent(tenant, topic, int64(i/20+1), m, int64(i%7), fmt.Sprintf("c%d", i)))
	}
	persistProduceTo(t, []string{broker}, config.Default().Kafka.Topic, evs...)
	db := testenv.OpenDB(t, strings.Replace(testenv.DSNTemplate(), "{tenant}", tenant, 1))
	count := func() int { return persistCount(persistStored(t, db, now.Prev(), now)) }

	crashed := faultsStart(t, []string{persist.CrashAfterCommitEnv + "=5"}, "persist", "--config", cfg)
	err = crashed.wait(t, 60*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Fatalf("persist should have killed itself after its 5th commit: %v\n%s", err, crashed.out.String())
	}
	afterCrash := count()
	if afterCrash == 0 || afterCrash == total {
		t.Fatalf("after the crash hook %d rows (want some, not all)", afterCrash)
	}

	mid := faultsStart(t, nil, "persist", "--config", cfg)
	waitFor(t, 60*time.Second, func() bool { return count() >= afterCrash+total/4 })
	mid.kill9(t)

	last := faultsStart(t, nil, "persist", "--config", cfg)
	stored := persistWaitCountIn(t, db, total, 90*time.Second, now.Prev(), now)
	for _, e := range evs {
		if stored[e.Topic][e.SeqID].String() != e.ShardMonth {
			t.Fatalf("%s/%d in %s, event says %s", e.Topic, e.SeqID, stored[e.Topic][e.SeqID], e.ShardMonth)
		}
	}
	waitFor(t, 30*time.Second, func() bool {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM im_group_message_route_repair").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	persistCheckRoutesOf(t, db, routing.NewRoutes(testenv.Redis(t), routing.NewScripts()), tenant, stored)
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
