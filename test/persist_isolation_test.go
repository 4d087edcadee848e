package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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

// isoTwoTenants runs every role for tenant B (the harness tenant, which
// sends over HTTP; "" = a fresh one) and serves a second tenant A from the
// same processes — sharing the Kafka partitions and the persist writers —
// whose events the test produces straight to Kafka. dsnA, if set, is A's
// own DSN; brokers, if set, is the Kafka of an earlier run.
func isoTwoTenants(t *testing.T, tenantB, tenantA, dsnA string, brokers []string, mutate func(*config.Config)) *sendEnv {
	t.Helper()
	return startSend(t, harness.Options{Roles: []string{app.All}, Tenant: tenantB, Brokers: brokers, Mutate: func(c *config.Config) {
		c.Tenants = append(c.Tenants, config.Tenant{ID: tenantA, JWTSecret: "secret-" + tenantA, DSN: dsnA})
		// small batches: A's events fill every writer, as a busy tenant's do
		c.Persist.BatchSize = 5
		if mutate != nil {
			mutate(c)
		}
	}})
}

// isoEnsure creates A's month tables from m on and activates m.
func isoEnsure(t *testing.T, env *sendEnv, tenant string, m routing.Month) {
	t.Helper()
	ctx := context.Background()
	mg := env.App.NewShardManager()
	if res := mg.SyncTenant(ctx, tenant, shardmgr.Options{MonthsAhead: -1, From: m}); res.Err != nil {
		t.Fatalf("shard ensure %s: %v", tenant, res.Err)
	}
	if err := mg.Activate(ctx, tenant, m); err != nil {
		t.Fatalf("activate %s: %v", tenant, err)
	}
}

// isoSendB sends messages first..first+n-1 to topic as a member of B and
// returns their seqs.
func isoSendB(t *testing.T, env *sendEnv, topic string, uid int64, first, n int) []int64 {
	t.Helper()
	tok := env.Token(uid, "")
	var seqs []int64
	for i := first; i < first+n; i++ {
		r := env.mustSend(tok, topic, sendBody(fmt.Sprintf("%s-%d-%d", topic, uid, i), "b"+strconv.Itoa(i)))
		seqs = append(seqs, r.Seq)
	}
	return seqs
}

// isoWaitSince waits (bounded) until B's since walk of topic lists want —
// the readers' settled watermark has passed every message — and B's month
// table holds them.
func isoWaitSince(t *testing.T, env *sendEnv, topic string, uid int64, want []int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := rpWalkSince(t, env.Env, uid, topic, 50)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's since walk of %s: %v, want %v (stuck behind tenant A)", topic, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stored := persistStored(t, env.DB, env.Start)
	if n := len(stored[topic]); n != len(want) {
		t.Fatalf("B's %s: %d rows stored, want %d", topic, n, len(want))
	}
	persistCheckRoutes(t, env.Env, stored)
}

// Events of tenant A that the database refuses — here a CHECK constraint
// the test adds to A's month table, so that they pass every check before
// the database, as content MariaDB's json_valid refuses does — spread over
// many topics and every writer: each refused event is dead-lettered at once
// (no retry) with reason "rejected" and its seq recorded as a gap, A's other
// events in the same batches are stored, and tenant B, sending meanwhile,
// is stored and readable through since pages within seconds.
func TestPersistRefusedEventsAreDeadLetteredAtOnceAndOthersProceed(t *testing.T) {
	tenantA := testenv.NewTenant(t)
	env := isoTwoTenants(t, "", tenantA, "", nil, func(c *config.Config) {
		c.Persist.MaxRetries = 1000 // a refusal must not wait for retries to run out
	})
	ctx := context.Background()
	m := env.Start
	isoEnsure(t, env, tenantA, m)
	dbA, err := env.App.Pools().DB(ctx, tenantA)
	if err != nil {
		t.Fatal(err)
	}
	table, _ := routing.TableFor(m)
	if _, err := dbA.Exec("ALTER TABLE " + table.Quoted() + " ADD CONSTRAINT test_refuse CHECK (msg_type <> 'refused')"); err != nil {
		t.Fatal(err)
	}
	const topicsA, perTopic = 12, 5
	var evs []message.Event
	refused := map[string]int64{}
	for i := 0; i < topicsA; i++ {
		topic := fmt.Sprintf("a%d", i)
		for seq := int64(1); seq <= perTopic; seq++ {
			e := persistEvent(tenantA, topic, seq, m, 1, fmt.Sprintf("c%d", seq))
			if seq == int64(1+i%perTopic) {
				e.MsgType = "refused"
				refused[topic] = seq
			}
			evs = append(evs, e)
		}
	}
	persistProduce(t, env.Env, evs...)

	topicB := "b-room"
	env.group(topicB, 42, "active")
	env.member(topicB, 7, "member", time.Time{})
	seqs := isoSendB(t, env, topicB, 7, 0, 20)
	isoWaitSince(t, env, topicB, 7, seqs, 20*time.Second)

	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env.Env, "group_message_dead_letter_total", `reason="rejected"`) == topicsA
	})
	stored := persistWaitCountIn(t, dbA, len(evs)-topicsA, 20*time.Second, m)
	for topic, seq := range refused {
		if _, ok := stored[topic][seq]; ok {
			t.Fatalf("refused event %s/%d stored", topic, seq)
		}
		gaps, err := env.App.Flight().Gaps(ctx, tenantA, topic, 0, 100)
		if err != nil || fmt.Sprint(gaps) != fmt.Sprint([]int64{seq}) {
			t.Fatalf("%s: gaps %v (%v), want the refused seq %d", topic, gaps, err, seq)
		}
	}
	if n := persistMetric(t, env.Env, "imshard_persist_retries_total"); n != 0 {
		t.Fatalf("a refusal was retried: %v retries", n)
	}
	dl := persistDeadLetters(t, env.Env)
	if len(dl) != topicsA {
		t.Fatalf("%d dead letters, want %d", len(dl), topicsA)
	}
	for _, r := range dl {
		if persistHeader(r, persist.HeaderReason) != "rejected" || persistHeader(r, persist.HeaderTenant) != tenantA ||
			!strings.Contains(persistHeader(r, persist.HeaderError), "4025") {
			t.Fatalf("dead letter headers: %v", r.Headers)
		}
	}
}

// isoProduceEverywhere produces perTopic events of tenant in month m to one
// topic per partition of the message topic ("<prefix><partition>", seqs
// from first), so that every partition carries some: whatever another
// tenant sends shares a partition with them.
func isoProduceEverywhere(t *testing.T, env *sendEnv, tenant, prefix string, m routing.Month, first, perTopic int64) []message.Event {
	t.Helper()
	var evs []message.Event
	var recs []*kgo.Record
	for p := int32(0); p < int32(env.Config.Kafka.Partitions); p++ {
		for seq := first; seq < first+perTopic; seq++ {
			e := persistEvent(tenant, fmt.Sprintf("%s%d", prefix, p), seq, m, 1, fmt.Sprintf("c%d", seq))
			v, err := json.Marshal(&e)
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, e)
			recs = append(recs, &kgo.Record{Topic: env.Config.Kafka.Topic, Partition: p, Key: e.Key(), Value: v})
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.Config.Kafka.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return evs
}

// Tenant A's database goes down (a private mariadbd, stopped) while its
// events keep coming on every partition: A is parked — its events wait,
// uncommitted — and tenant B, sharing those partitions and the writers, is
// stored and readable through since pages within seconds. A restart of the
// service while A is still down re-delivers from the first parked event
// (B's events after it come again and are replays, applied once) and B
// proceeds again; when A's database is back, A's events are stored exactly
// once and nothing was dead-lettered.
func TestPersistTenantOutageParksOnlyThatTenant(t *testing.T) {
	t.Parallel()
	mdb := testenv.StartMariaDB(t)
	tenantA, tenantB := testenv.NewTenant(t), testenv.NewTenant(t)
	dsnA := strings.Replace(mdb.DSNTemplate, "{tenant}", tenantA, 1)
	fast := func(c *config.Config) {
		c.Persist.RetryBackoff = 10 * time.Millisecond
		c.Persist.RetryBackoffMax = 200 * time.Millisecond
	}
	env := isoTwoTenants(t, tenantB, tenantA, dsnA, nil, fast)
	m := env.Start
	isoEnsure(t, env, tenantA, m)
	dbA := testenv.OpenDB(t, dsnA)
	evs := isoProduceEverywhere(t, env, tenantA, "a", m, 1, 5)
	persistWaitCountIn(t, dbA, len(evs), 20*time.Second, m)

	mdb.Stop()
	evs = append(evs, isoProduceEverywhere(t, env, tenantA, "a", m, 6, 10)...)
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env.Env, "imshard_persist_parked_tenants") == 1 })
	topicB := "b-room"
	env.group(topicB, 42, "active")
	env.member(topicB, 7, "member", time.Time{})
	seqs := isoSendB(t, env, topicB, 7, 0, 20)
	isoWaitSince(t, env, topicB, 7, seqs, 20*time.Second)
	if n := persistMetric(t, env.Env, "imshard_persist_retries_total", `reason="transient"`); n == 0 {
		t.Fatal("A's batches were not retried")
	}

	// restart while A is down: the committed offsets stop at A's first
	// parked event, so B's stored events after it are delivered again
	env.Stop()
	env = isoTwoTenants(t, tenantB, tenantA, dsnA, env.Config.Kafka.Brokers, fast)
	seqs = append(seqs, isoSendB(t, env, topicB, 7, 20, 10)...)
	isoWaitSince(t, env, topicB, 7, seqs, 20*time.Second)
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env.Env, "group_message_persist_total", `status="replayed"`) > 0
	})

	mdb.Start()
	stored := persistWaitCountIn(t, dbA, len(evs), 30*time.Second, m)
	persistCheckRoutesOf(t, dbA, env.App.Routes(), tenantA, stored)
	persistCheckRoutes(t, env.Env, persistStored(t, env.DB, m))
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env.Env, "imshard_persist_parked_tenants") == 0 })
	if n := persistMetric(t, env.Env, "group_message_dead_letter_total"); n != 0 {
		t.Fatalf("%v events dead-lettered during an outage", n)
	}
}

// An error persist does not know (here: a column the insert names dropped
// from the month table, as a botched schema change would) is retried like
// a transient one — the tenant parked — but only persist.max_retries times;
// then the events still refused are dead-lettered as "rejected" and the
// tenant resumes.
func TestPersistUnknownErrorRetriesThenDeadLetters(t *testing.T) {
	env := persistOnly(t, func(c *config.Config) { c.Persist.MaxRetries = 2 })
	table, _ := routing.TableFor(env.Start)
	if _, err := env.DB.Exec("ALTER TABLE " + table.Quoted() + " DROP COLUMN content_size"); err != nil {
		t.Fatal(err)
	}
	var evs []message.Event
	for seq := int64(1); seq <= 4; seq++ {
		evs = append(evs, persistEvent(env.Tenant, "drift", seq, env.Start, 1, fmt.Sprint(seq)))
	}
	persistProduce(t, env, evs...)
	waitFor(t, 20*time.Second, func() bool {
		return persistMetric(t, env, "group_message_dead_letter_total", `reason="rejected"`) == 4
	})
	if n := persistMetric(t, env, "imshard_persist_retries_total", `reason="unclassified"`); n != 2 {
		t.Fatalf("%v retries, want persist.max_retries = 2", n)
	}
	waitFor(t, 10*time.Second, func() bool { return persistMetric(t, env, "imshard_persist_parked_tenants") == 0 })
	for _, r := range persistDeadLetters(t, env) {
		if !strings.Contains(persistHeader(r, persist.HeaderError), "1054") {
			t.Fatalf("dead letter error: %v", r.Headers)
		}
	}
}

// The limit of parking: events parked behind a waiting tenant are held in
// memory, at most persist.max_parked; at it the process stops polling (for
// every tenant) and says so (imshard_persist_poll_paused, alert
// ImshardPersistStalled) until the tenant resumes — then everything is
// stored, once.
func TestPersistParkedBudgetPausesPollingUntilTheTenantResumes(t *testing.T) {
	env := persistOnly(t, func(c *config.Config) {
		c.Persist.MaxRetries = 1 << 20
		c.Persist.MaxParked = 3
		c.Persist.BatchSize = 2
	})
	table, _ := routing.TableFor(env.Start)
	if _, err := env.DB.Exec("DROP TABLE " + table.Quoted()); err != nil {
		t.Fatal(err)
	}
	var evs []message.Event
	for seq := int64(1); seq <= 20; seq++ {
		evs = append(evs, persistEvent(env.Tenant, fmt.Sprintf("p%d", seq%5), seq, env.Start, 1, fmt.Sprint(seq)))
	}
	persistProduce(t, env, evs[:19]...)
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env, "imshard_persist_parked_events") >= 3 })
	persistProduce(t, env, evs[19]) // the next poll finds the budget used up
	waitFor(t, 20*time.Second, func() bool { return persistMetric(t, env, "imshard_persist_poll_paused") == 1 })
	if res := env.App.NewShardManager().SyncTenant(context.Background(), env.Tenant, shardOpts(env.Start)); res.Err != nil {
		t.Fatal(res.Err)
	}
	stored := persistWaitCount(t, env, len(evs), 30*time.Second, env.Start)
	persistCheckRoutes(t, env, stored)
	waitFor(t, 10*time.Second, func() bool {
		return persistMetric(t, env, "imshard_persist_poll_paused") == 0 && persistMetric(t, env, "imshard_persist_parked_tenants") == 0
	})
}
