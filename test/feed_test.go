package test

import (
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// feedWaitRelayed waits until the tenant's outbox is empty: every change
// committed so far is acknowledged on the change feed.
func feedWaitRelayed(t *testing.T, db *sql.DB) {
	t.Helper()
	sendWaitFor(t, 2*time.Minute, "the outbox relayed", func() bool {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM im_change_outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// TestFeedRebuildsEveryMessageFromBothTopics: after a random workload of
// sends, edits, recalls and deletes for everyone (concurrent changes of
// one topic among them), a consumer that reads only the message topic and
// the change feed rebuilds every message exactly as the API shows it, and
// receives every change the API answered, in change_seq order per topic.
func TestFeedRebuildsEveryMessageFromBothTopics(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Mutate: func(c *config.Config) { c.Relay.PollInterval = 20 * time.Millisecond }})
	w := &feedWorkload{t: t, api: feedEnv{env}, topics: []string{"fa", "fb", "fc"}, workers: 4, changes: 240, initial: 4, sendEvery: 8}
	w.run()
	feedWaitRelayed(t, env.DB)
	k := env.Config.Kafka
	feedCompare(t, w, feedRebuild(t, k.Brokers, k.Topic, k.ChangesTopic, env.Tenant))
	if lag := persistMetric(t, env, "imshard_change_feed_lag_seconds", `tenant="`+env.Tenant+`"`); lag != 0 {
		sendWaitFor(t, 10*time.Second, "the lag back to 0", func() bool {
			return persistMetric(t, env, "imshard_change_feed_lag_seconds", `tenant="`+env.Tenant+`"`) == 0
		})
	}
}

// feedBarChangesEnv sets the size of TestFeedSurvivesPersistAndRelayKill9's
// workload; the default run makes 1,500 changes, the bar 10,000.
const feedBarChangesEnv = "IMSHARD_TEST_FEED_CHANGES"

// TestFeedSurvivesPersistAndRelayKill9 is the change feed's bar: the API,
// persist and the relay run as separate processes on one devkafka; while
// a random workload of changes runs (with sends among them, so changes
// meet messages still on their way to persist), persist is killed -9 a
// third of the way in and restarted, and the relay kills itself -9 right
// after the broker acknowledged a batch, before deleting its rows (the
// window that must become a re-send, never a loss), and is restarted.
// Two relays take over two thirds of the way in. Every change the API
// answered is then on the change feed, none out of change_seq order per
// topic, some of them re-sent, and the messages rebuilt from both topics
// are what the API answers.
func TestFeedSurvivesPersistAndRelayKill9(t *testing.T) {
	t.Parallel()
	changes := 1500
	if s := os.Getenv(feedBarChangesEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", feedBarChangesEnv, s)
		}
		changes = n
	}
	tenant := testenv.NewTenant(t)
	broker := faultsDevKafka(t)
	cfg := faultsConfig(t, tenant, broker, testenv.DSNTemplate(), "relay: {poll_interval: 20ms, batch_size: 50}\n")
	now, err := routing.NewClock(testenv.Redis(t)).Month(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"shard", "ensure", "--config", cfg, "--from", now.String()},
		{"shard", "activate", "--config", cfg, "--tenant", tenant, "--month", now.String()},
	} {
		if code, out := runCLI(t, nil, args...); code != 0 {
			t.Fatalf("%v: %d\n%s", args, code, out)
		}
	}
	metrics := func() []string {
		return []string{fmt.Sprintf("IMSHARD_METRICS_ADDR=127.0.0.1:%d", testenv.FreePort(t))}
	}
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	faultsStart(t, append(metrics(), "IMSHARD_HTTP_ADDR="+api), "serve", "--roles=send,query", "--config", cfg)
	client := faultsClient(t, "http://"+api, []byte("secret-"+tenant), tenant)
	waitFor(t, 30*time.Second, func() bool { return client.ready() })
	persistProc := faultsStart(t, metrics(), "persist", "--config", cfg)
	// a slower poll than the restarted relay's, so the batch it dies after holds
	// several changes of a topic
	crashing := faultsStart(t, append(metrics(), testhook.CrashAfterRelayEnv+"=5", "IMSHARD_RELAY_POLL_INTERVAL=300ms"),
		"serve", "--roles=relay", "--config", cfg)

	var (
		mu        sync.Mutex
		restarted []*faultsProc
	)
	w := &feedWorkload{t: t, api: feedProcs{t: t, c: client}, topics: []string{"b0", "b1", "b2", "b3", "b4", "b5"},
		workers: 8, changes: changes, initial: 5, sendEvery: 10}
	w.after = func(n int) {
		if n == 2*changes/3 {
			// two relays in place of the one that died: they take the
			// tenant in turns, under its MySQL lock
			if err := crashing.wait(t, 2*time.Minute); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Errorf("the relay should have killed itself after its 5th batch: %v\n%s", err, crashing.out.String())
			}
			faultsStart(t, metrics(), "serve", "--roles=relay", "--config", cfg)
			faultsStart(t, metrics(), "serve", "--roles=relay", "--config", cfg)
		}
		if n != changes/3 {
			return
		}
		// persist dies mid-stream; sends go on into Kafka, and changes of
		// those messages answer 409 in flight until the next persist
		// stores them
		persistProc.kill9(t)
		mu.Lock()
		restarted = append(restarted, faultsStart(t, metrics(), "persist", "--config", cfg))
		mu.Unlock()
	}
	w.run()
	if t.Failed() {
		return
	}
	if len(restarted) != 1 {
		t.Fatalf("persist restarted %d times, want 1", len(restarted))
	}
	db := testenv.OpenDB(t, strings.Replace(testenv.DSNTemplate(), "{tenant}", tenant, 1))
	feedWaitRelayed(t, db)
	got := feedRebuild(t, []string{broker}, "imshard.groupmsg", "imshard.changes", tenant)
	feedCompare(t, w, got)
	total, messages := 0, 0
	for _, seen := range got.seen {
		total += len(seen)
	}
	for _, ms := range got.messages {
		messages += len(ms)
	}
	if total != changes/w.workers*w.workers {
		t.Errorf("%d changes on the feed, %d made", total, changes/w.workers*w.workers)
	}
	if got.resent == 0 {
		t.Error("the relay's crash after an acknowledged batch re-sent nothing: the crash missed its window")
	}
	t.Logf("%d changes of %d messages on the feed, %d re-sent after the relay's crash", total, messages, got.resent)
}

// TestFeedRelayNeverSkipsALateCommit is the outbox's gap problem: a change
// of one topic takes an outbox id and commits late, after a change of
// another topic with a higher id was committed and relayed. A relay that
// kept a cursor by id would have stepped past the lower id for good; this
// one relays it as soon as it commits.
func TestFeedRelayNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Roles: []string{app.Persist, app.Relay},
		Mutate: func(c *config.Config) { c.Relay.PollInterval = 20 * time.Millisecond }})
	ctx := t.Context()
	event := func(topic string) feed.Event {
		return feed.Event{Tenant: env.Tenant, Topic: topic, ChangeSeq: 1, Action: message.ActionRecall, SeqID: 1,
			MessageID: 1, ShardMonth: env.Start.String(), Version: 2, Actor: 1, At: message.NewTime(time.Now())}
	}
	late, err := env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback() }()
	if err := feed.Record(ctx, late, event("late")); err != nil {
		t.Fatal(err)
	}
	early, err := env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := feed.Record(ctx, early, event("early")); err != nil {
		t.Fatal(err)
	}
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	k := env.Config.Kafka
	relayed := func(topic string) bool {
		for _, r := range kafkaReadAll(t, k.Brokers, k.ChangesTopic) {
			if string(r.Key) == env.Tenant+"/"+topic {
				return true
			}
		}
		return false
	}
	// the later id is relayed (and its row deleted) while the earlier one
	// is still uncommitted
	sendWaitFor(t, 30*time.Second, "the early commit relayed", func() bool { return relayed("early") })
	feedWaitRelayed(t, env.DB)
	if relayed("late") {
		t.Fatal("an uncommitted change was relayed")
	}
	if err := late.Commit(); err != nil {
		t.Fatal(err)
	}
	sendWaitFor(t, 30*time.Second, "the late commit relayed", func() bool { return relayed("late") })
	feedWaitRelayed(t, env.DB)
}
