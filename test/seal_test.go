package test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/persist"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/test/harness"
)

// sealEnv runs persist with no sealing grace and a short produce timeout,
// so a month's completeness proof is decided within seconds.
func sealEnv(t *testing.T, mutate func(*config.Config)) *harness.Env {
	return persistOnly(t, func(c *config.Config) {
		c.Shard.SealingDays = 0
		c.Send.ProduceTimeout = 500 * time.Millisecond
		if mutate != nil {
			mutate(c)
		}
	})
}

// sealStatus runs one patrol of the tenant and returns m's status and, when
// it is not sealed, why (as `shard list` says it).
func sealStatus(t *testing.T, env *harness.Env, m routing.Month) (routing.Status, string) {
	t.Helper()
	ctx := context.Background()
	mg := env.App.NewShardManager()
	if res := mg.SyncTenant(ctx, env.Tenant, shardmgr.Options{MonthsAhead: -1, From: m}); res.Err != nil {
		t.Fatalf("sync: %v", res.Err)
	}
	infos, err := mg.List(ctx, env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Month == m {
			return in.Status, in.SealWait
		}
	}
	t.Fatalf("month %s not listed", m)
	return "", ""
}

// sealWaitFor patrols until m has status want, failing with the last wait reason.
func sealWaitFor(t *testing.T, env *harness.Env, m routing.Month, want routing.Status, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, why := sealStatus(t, env, m)
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("month %s is %s (%s), want %s", m, st, why, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A month past its sealing grace is sealed only once it is proven complete:
// while persist has not passed its end, or one of its events is
// dead-lettered and not stored since, or the route mirror disagrees with
// the table, it stays sealing, and `shard list` and a metric say why.
func TestSealWaitsUntilTheMonthIsProvenComplete(t *testing.T) {
	env := sealEnv(t, nil)
	ctx := context.Background()
	old := env.Start
	persistProduce(t, env, persistEvent(env.Tenant, "proof", 1, old, 1, "a"))
	persistWaitCount(t, env, 1, 20*time.Second, old)
	env.Activate(old.Next())

	// the event persist dead-lettered (noted in the tenant database) holds the seal
	lost := persistEvent(env.Tenant, "proof", 2, old, 1, "b")
	if err := routing.RecordDeadLetters(ctx, env.DB, []routing.DeadLetterRow{{Topic: "proof", Seq: 2, Month: old, Reason: "rejected"}}); err != nil {
		t.Fatal(err)
	}
	st, why := sealStatus(t, env, old)
	if st != routing.StatusSealing || why == "" {
		t.Fatalf("month %s is %s (%q), want sealing with a reason", old, st, why)
	}
	// the patrol's proof and the list's are taken a moment apart (persist
	// may pass the month's end in between): wait until both say dead_letter
	waitFor(t, 20*time.Second, func() bool {
		_, why = sealStatus(t, env, old)
		return strings.HasPrefix(why, routing.WaitDeadLetter+":") &&
			persistMetric(t, env, "imshard_shardmgr_seal_waiting_months", `reason="dead_letter"`) == 1
	})
	code, out := runCLI(t, nil, "shard", "list", "--config", tenantConfig(t, env.Tenant, "shard: {sealing_days: 0}\nsend: {produce_timeout: 500ms}\n"), "--tenant", env.Tenant)
	if code != 0 || !strings.Contains(out, "waits to seal: dead_letter") {
		t.Fatalf("shard list: %d\n%s", code, out)
	}

	// a mirror that disagrees with the table holds it too
	if _, err := env.DB.Exec("UPDATE im_group_message_topic_shards SET message_count = message_count + 1 WHERE shard_month = ?", old.String()); err != nil {
		t.Fatal(err)
	}
	// the dead letter replayed and stored resolves its row
	persistProduce(t, env, lost)
	persistWaitCount(t, env, 2, 20*time.Second, old)
	waitFor(t, 20*time.Second, func() bool {
		_, why = sealStatus(t, env, old)
		return strings.HasPrefix(why, routing.WaitRouteCheck+":")
	})
	if _, err := env.DB.Exec("UPDATE im_group_message_topic_shards SET message_count = message_count - 1 WHERE shard_month = ?", old.String()); err != nil {
		t.Fatal(err)
	}
	sealWaitFor(t, env, old, routing.StatusSealed, 20*time.Second)
	if n := persistMetric(t, env, "imshard_shardmgr_seal_waiting_months", `reason="dead_letter"`); n != 0 {
		t.Fatalf("seal_waiting_months after the seal = %v, want 0", n)
	}
}

// An event that still arrives for a sealed month is compensated and
// counted for the alert; `dlq replay --month` reopens the month, the event
// is stored in it, and the patrol seals it again once that is proven.
func TestLateEventIsAlertedAndReplayedIntoItsMonth(t *testing.T) {
	env := sealEnv(t, nil)
	ctx := context.Background()
	old := env.Start
	env.Activate(old.Next())
	sealWaitFor(t, env, old, routing.StatusSealed, 20*time.Second)
	env.App.Catalog().Invalidate(env.Tenant)

	persistProduce(t, env, persistEvent(env.Tenant, "late", 1, old, 1, "late"))
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env, "imshard_persist_late_events_total", `tenant="`+env.Tenant+`"`) == 1
	})
	st, _ := sealStatus(t, env, old)
	if st != routing.StatusSealed {
		t.Fatalf("a late event changed the month to %s", st)
	}

	tool := persistTool(t, env)
	if _, err := tool.Replay(ctx, persist.ReplayOptions{Month: old.String()}); err == nil {
		t.Fatal("replay --month without a tenant accepted")
	}
	rep, err := tool.Replay(ctx, persist.ReplayOptions{Tenant: env.Tenant, Month: old.String()})
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("replay --month: %+v %v", rep, err)
	}
	persistWaitCount(t, env, 1, 20*time.Second, old)
	sealWaitFor(t, env, old, routing.StatusSealed, 20*time.Second)
	var pending int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM im_group_message_compensation WHERE status = 'pending'").Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("pending compensation entries: %d %v", pending, err)
	}
}

// Persist notes a served tenant's dead-lettered event in its database,
// where the seal check finds it.
func TestDeadLetterIsNotedForTheSeal(t *testing.T) {
	env := sealEnv(t, func(c *config.Config) { c.Persist.MaxRetries = 0 })
	gone := env.Start.Add(-6)
	persistProduce(t, env, persistEvent(env.Tenant, "noted", 4, gone, 1, "x"))
	waitFor(t, 20*time.Second, func() bool {
		var month sql.NullString
		err := env.DB.QueryRow("SELECT shard_month FROM im_group_message_dead_letters WHERE topic = 'noted' AND seqid = 4 AND status = 'pending'").Scan(&month)
		return err == nil && month.String == gone.String()
	})
}
