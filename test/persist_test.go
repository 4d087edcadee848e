package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/persist"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// persistOnly runs the persist role (plus what it needs) for a fresh tenant.
func persistOnly(t *testing.T, mutate func(*config.Config)) *harness.Env {
	return harness.Start(t, harness.Options{Roles: []string{app.Persist}, Mutate: func(c *config.Config) {
		c.Persist.RetryBackoff = 10 * time.Millisecond
		c.Persist.RetryBackoffMax = 50 * time.Millisecond
		if mutate != nil {
			mutate(c)
		}
	}})
}

// Events carry their month frozen at allocation: persist writes each to that
// month's table whatever the active month is when it consumes them
// (month-edge scenario 2's persist half), exactly once even when Kafka delivers
// them again, and the mirror and Redis routes agree with the tables.
func TestPersistStoresEachEventOnceInItsFrozenMonth(t *testing.T) {
	env := persistOnly(t, nil)
	old, next := env.Start, env.Start.Next()
	var evs []message.Event
	for topic := 0; topic < 5; topic++ {
		name := fmt.Sprintf("room-%d", topic)
		for seq := int64(1); seq <= 40; seq++ {
			m := old
			if seq > 25 {
				m = next
			}
			evs = append(evs, persistEvent(env.Tenant, name, seq, m, 100+seq%3, fmt.Sprintf("c-%d", seq)))
		}
	}
	persistProduce(t, env, evs...)
	env.Activate(next) // consumed "next month": the frozen month still decides
	stored := persistWaitCount(t, env, len(evs), 30*time.Second, old, next)
	for _, e := range evs {
		if got := stored[e.Topic][e.SeqID]; got.String() != e.ShardMonth {
			t.Fatalf("%s/%d stored in %s, event says %s", e.Topic, e.SeqID, got, e.ShardMonth)
		}
	}
	persistCheckRoutes(t, env, stored)

	// redelivery: the same events again change nothing
	persistProduce(t, env, evs[:60]...)
	waitFor(t, 30*time.Second, func() bool {
		return persistMetric(t, env, "group_message_persist_total", `status="replayed"`) >= 60
	})
	stored = persistWaitCount(t, env, len(evs), time.Second, old, next)
	persistCheckRoutes(t, env, stored)
}

// A client_msg_id stored in one month and retried with a new seq in the
// neighbouring month (Redis forgot the first attempt) is stored once, in
// whichever order the two events arrive; the loser's seq becomes a gap.
func TestPersistCrossMonthDuplicateStoredOnce(t *testing.T) {
	env := persistOnly(t, nil)
	m1, m2 := env.Start, env.Start.Next()
	persistProduce(t, env,
		persistEvent(env.Tenant, "dup", 1, m1, 5, "same-id"),
		persistEvent(env.Tenant, "dup", 2, m2, 5, "same-id"), // retry after the switch
	)
	persistWaitCount(t, env, 1, 20*time.Second, m1, m2)
	// the reverse order: the retry is stored first (its original waited in
	// the compensation queue), then the original arrives — after the switch
	// that let the retry into m2
	env.Activate(m2)
	persistProduce(t, env, persistEvent(env.Tenant, "dup2", 11, m2, 5, "other-id"))
	persistWaitCount(t, env, 2, 20*time.Second, m1, m2)
	persistProduce(t, env, persistEvent(env.Tenant, "dup2", 10, m1, 5, "other-id"))
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env, "group_message_dedup_hit_total") >= 2 })
	stored := persistWaitCount(t, env, 2, time.Second, m1, m2)
	if _, ok := stored["dup"][1]; !ok {
		t.Fatalf("original of dup not stored: %v", stored)
	}
	if _, ok := stored["dup2"][11]; !ok {
		t.Fatalf("first stored of dup2 lost: %v", stored)
	}
	gaps, err := env.App.Flight().Gaps(context.Background(), env.Tenant, "dup", 0, 100)
	if err != nil || len(gaps) != 1 || gaps[0] != 2 {
		t.Fatalf("duplicate seq must be a recorded gap: %v %v", gaps, err)
	}
	persistCheckRoutes(t, env, stored)
}

// Malformed events go to the dead-letter topic with their reason; the valid
// events around them are stored and nothing is skipped silently.
func TestPersistMalformedEventsAreDeadLettered(t *testing.T) {
	env := persistOnly(t, nil)
	good := persistEvent(env.Tenant, "ok", 1, env.Start, 1, "a")
	badVersion := persistEvent(env.Tenant, "ok", 2, env.Start, 1, "b")
	badVersion.V = 2
	badTopic := persistEvent(env.Tenant, "ok", 3, env.Start, 1, "c")
	badTopic.Topic = "x';DROP TABLE t;--"
	badMonth := persistEvent(env.Tenant, "ok", 4, env.Start, 1, "d")
	badMonth.ShardMonth = "999913"
	otherTenant := persistEvent("tnotconfigured", "ok", 5, env.Start, 1, "e")
	good2 := persistEvent(env.Tenant, "ok", 6, env.Start, 1, "f")
	persistProduce(t, env, good, badVersion, badTopic, badMonth, otherTenant)
	topic := env.Config.Kafka.Topic
	persistProduceRecords(t, env.Config.Kafka.Brokers,
		&kgo.Record{Topic: topic, Key: []byte(env.Tenant + "/ok"), Value: []byte(`{"v":1,`)},
		&kgo.Record{Topic: topic, Key: []byte(env.Tenant + "/ok"), Value: []byte(`null`)})
	persistProduce(t, env, good2)
	persistWaitCount(t, env, 2, 20*time.Second, env.Start)
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env, "group_message_dead_letter_total") >= 6 })
	dl := persistDeadLetters(t, env)
	reasons := map[string]int{}
	for _, r := range dl {
		reasons[persistHeader(r, persist.HeaderReason)]++
		if !strings.HasPrefix(persistHeader(r, persist.HeaderSource), topic+"/") {
			t.Fatalf("dead letter without its source: %v", r.Headers)
		}
	}
	if reasons["malformed"] != 5 || reasons["unknown_tenant"] != 1 || len(dl) != 6 {
		t.Fatalf("dead letters by reason: %v (%d)", reasons, len(dl))
	}
	// nothing written for a tenant this deployment does not serve
	keys, _ := env.App.KeySpace().Tenant("tnotconfigured")
	if n, err := env.Redis.Do(context.Background(), env.Redis.B().Exists().Key(keys.Gaps("ok")).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("a gap recorded for an unknown tenant: %d %v", n, err)
	}
}

// Month-edge scenario 11 (docs/invariants.md): an event whose month table is missing is retried with
// backoff, counted in group_message_shard_missing_total, stored once the
// table appears — and after persist.max_retries it goes to the dead-letter
// topic with the reason, never skipped.
func TestAcceptance11_MissingMonthTableRetriesAndDeadLetters(t *testing.T) {
	env := persistOnly(t, func(c *config.Config) { c.Persist.MaxRetries = 3 })
	gone := env.Start.Add(-4) // never ensured
	persistProduce(t, env, persistEvent(env.Tenant, "late", 1, gone, 1, "x"))
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env, "group_message_dead_letter_total", `reason="shard_missing"`) == 1
	})
	if n := persistMetric(t, env, "group_message_shard_missing_total"); n < 4 {
		t.Fatalf("shard_missing counted %v times, want ≥ max_retries+1", n)
	}
	dl := persistDeadLetters(t, env)
	if len(dl) != 1 || persistHeader(dl[0], persist.HeaderReason) != "shard_missing" ||
		!strings.Contains(persistHeader(dl[0], persist.HeaderError), "not registered") {
		t.Fatalf("dead letter: %v", dl)
	}

	// with retries left, the event is stored as soon as the table exists
	env2 := persistOnly(t, func(c *config.Config) { c.Persist.MaxRetries = 1 << 20 })
	missing := env2.Start.Add(-2)
	persistProduce(t, env2, persistEvent(env2.Tenant, "late", 1, missing, 1, "x"))
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env2, "group_message_shard_missing_total") >= 2 })
	res := env2.App.NewShardManager().SyncTenant(context.Background(), env2.Tenant, shardOpts(missing))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	persistWaitCount(t, env2, 1, 20*time.Second, missing)
	if n := persistMetric(t, env2, "group_message_dead_letter_total"); n != 0 {
		t.Fatalf("dead-lettered %v", n)
	}
}

// An event for a sealed month waits in the compensation queue; after
// `shard unseal`, `dlq replay` re-injects it with its frozen month and it
// is stored once (a second replay changes nothing).
func TestPersistSealedMonthCompensationAndReplay(t *testing.T) {
	env := persistOnly(t, nil)
	ctx := context.Background()
	old := env.Start
	env.Activate(old.Next())
	mg := env.App.NewShardManager()
	if err := mg.Seal(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	env.App.Catalog().Invalidate(env.Tenant)
	persistProduce(t, env, persistEvent(env.Tenant, "sealed", 1, old, 1, "late"))
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env, "group_message_persist_total", `status="compensated"`) == 1
	})
	tool := persistTool(t, env)
	comps, err := tool.Compensations(ctx, env.Tenant, 10)
	if err != nil || len(comps) != 1 || comps[0].Month != old.String() || comps[0].Status != "pending" {
		t.Fatalf("compensation entries: %+v %v", comps, err)
	}
	// still sealed: replay refuses and keeps the entry
	if rep, err := tool.Replay(ctx, persist.ReplayOptions{Tenant: env.Tenant, All: true}); err == nil || rep.Replayed != 0 {
		t.Fatalf("replay into a sealed month: %+v %v", rep, err)
	}
	if err := mg.Unseal(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	env.App.Catalog().Invalidate(env.Tenant)
	rep, err := tool.Replay(ctx, persist.ReplayOptions{Tenant: env.Tenant, ID: comps[0].ID})
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	persistWaitCount(t, env, 1, 20*time.Second, old, old.Next())
	if rep, err := tool.Replay(ctx, persist.ReplayOptions{Tenant: env.Tenant, ID: comps[0].ID}); err != nil || rep.Replayed != 1 {
		t.Fatalf("second replay: %+v %v", rep, err)
	}
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env, "group_message_persist_total", `status="replayed"`) == 1
	})
	persistWaitCount(t, env, 1, time.Second, old, old.Next())
}

// Persist claims a batch's seqs in Redis before it stores anything: while
// Redis is down the batch waits, parked like a database outage, and
// nothing is stored (an unclaimed event could land under a seq readers
// skipped as a gap); once Redis is back every event is stored and the
// routes agree with the MySQL mirror.
func TestPersistWaitsForRedisBeforeStoringABatch(t *testing.T) {
	rs := testenv.StartRedis(t)
	env := persistOnly(t, func(c *config.Config) { c.Redis.Addrs = []string{rs.Addr} })
	var evs []message.Event
	for seq := int64(1); seq <= 30; seq++ {
		evs = append(evs, persistEvent(env.Tenant, fmt.Sprintf("r%d", seq%3), seq, env.Start, 1, fmt.Sprint(seq)))
	}
	rs.Stop()
	persistProduce(t, env, evs...)
	waitFor(t, 30*time.Second, func() bool {
		return persistMetric(t, env, "imshard_persist_retries_total", `reason="transient"`) > 0
	})
	if got := persistCount(persistStored(t, env.DB, env.Start)); got != 0 {
		t.Fatalf("stored %d rows while Redis was down, want 0", got)
	}
	rs.Start()
	persistWaitCount(t, env, len(evs), 30*time.Second, env.Start)
	persistCheckRoutes(t, env, persistStored(t, env.DB, env.Start))
}

func persistTool(t *testing.T, env *harness.Env) *persist.Tool {
	t.Helper()
	a := env.App
	return persist.NewTool(persist.ToolParams{Kafka: env.Config.Kafka, KafkaConn: a.KafkaConn(),
		DBs: a.Pools(), Tenants: a.Pools().IDs, Catalog: a.Catalog()})
}

func shardOpts(from routing.Month) shardmgr.Options {
	return shardmgr.Options{MonthsAhead: -1, From: from}
}

// Once every month up to m is sealed and no route repair up to it waits,
// persist advances the tenant's "routes complete through" watermark to m.
func TestPersistAdvancesRoutesCompleteOverSealedMonths(t *testing.T) {
	env := persistOnly(t, nil)
	ctx := context.Background()
	env.Activate(env.Start.Next())
	env.Activate(env.Start.Add(2))
	mg := env.App.NewShardManager()
	for _, m := range []routing.Month{env.Start.Add(-1), env.Start, env.Start.Next()} {
		if err := mg.Seal(ctx, env.Tenant, m); err != nil && !errors.Is(err, routing.ErrShardNotRegistered) {
			t.Fatalf("seal %s: %v", m, err)
		}
	}
	// a committed batch wakes the tenant's pass
	persistProduce(t, env, persistEvent(env.Tenant, "wm", 1, env.Start.Add(2), 1, "x"))
	persistWaitCount(t, env, 1, 20*time.Second, env.Start.Add(2))
	waitFor(t, 20*time.Second, func() bool {
		m, err := routing.RoutesComplete(ctx, env.Redis, env.Keys())
		return err == nil && m == env.Start.Next()
	})
}

// `imshard dlq list|replay` as an operator runs them: list shows dead
// letters and compensation entries with their reasons; replay of a still
// sealed month is refused (exit 1) and, after `shard unseal`, re-injects the
// entry with its frozen month; no selector is bad usage (exit 2).
func TestDLQCommandsListAndReplay(t *testing.T) {
	env := persistOnly(t, nil)
	ctx := context.Background()
	old := env.Start
	env.Activate(old.Next())
	if err := env.App.NewShardManager().Seal(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	env.App.Catalog().Invalidate(env.Tenant)
	bad := persistEvent(env.Tenant, "cli", 1, old, 1, "bad")
	bad.V = 9
	persistProduce(t, env, persistEvent(env.Tenant, "cli", 2, old, 1, "late"), bad)
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env, "group_message_persist_total", `status="compensated"`) == 1 &&
			persistMetric(t, env, "group_message_dead_letter_total") == 1
	})
	cfg := tenantConfig(t, env.Tenant, fmt.Sprintf("kafka: {brokers: [%q], partitions: 4}\n", env.Config.Kafka.Brokers[0]))
	code, out := runCLI(t, nil, "dlq", "list", "--config", cfg, "--tenant", env.Tenant)
	if code != 0 || !strings.Contains(out, "malformed") || !strings.Contains(out, "comp-"+env.Tenant+"-") ||
		!strings.Contains(out, "month sealed") {
		t.Fatalf("dlq list: %d\n%s", code, out)
	}
	if code, out := runCLI(t, nil, "dlq", "replay", "--config", cfg, "--tenant", env.Tenant, "--all"); code != 1 ||
		!strings.Contains(out, "shard unseal") {
		t.Fatalf("replay into a sealed month: %d\n%s", code, out)
	}
	if code, out := runCLI(t, nil, "dlq", "replay", "--config", cfg); code != 2 {
		t.Fatalf("replay without a selector: %d\n%s", code, out)
	}
	if err := env.App.NewShardManager().Unseal(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	env.App.Catalog().Invalidate(env.Tenant)
	if code, out := runCLI(t, nil, "dlq", "replay", "--config", cfg, "--tenant", env.Tenant, "--all"); code != 0 ||
		!strings.Contains(out, "replayed 1") {
		t.Fatalf("replay: %d\n%s", code, out)
	}
	stored := persistWaitCount(t, env, 1, 20*time.Second, old, old.Next())
	if stored["cli"][2] != old {
		t.Fatalf("replayed event stored in %v, frozen month %s", stored, old)
	}
}
