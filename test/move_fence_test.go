package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// TestMoveFenceStaleWriterWritesNothing: the placement fence inside the
// write transaction. A persist batch already past its fence check when
// the switch raises the epoch holds the switch's UPDATE until it commits
// (so the catch-up, taken after that commit, sees its rows); a batch and a
// change that start after it — their process still on the old placement —
// write nothing at all: the batch is parked, never dead-lettered, and the
// send was answered 201; the change answers 409 with retry_after_ms. Once
// the process follows the new epoch every message is stored exactly once.
func TestMoveFenceStaleWriterWritesNothing(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Mutate: func(c *config.Config) { c.MySQL.PlacementPoll = 200 * time.Millisecond }})
	store := mvStore(t, env)
	ctx := context.Background()
	rpGroup(t, env, "mvf")
	tok := env.Token(rpMember, "")
	first, month := rpPost(t, env, tok, "mvf", "f1", "before the switch")
	chWaitSettled(t, env, "mvf")
	m, err := routing.ParseMonth(month)
	if err != nil {
		t.Fatal(err)
	}

	// 1. a writer held inside its transaction, past the fence check: the
	// test holds the topic's mirror row, which the batch upserts last
	hold, err := env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback() }()
	var locked string
	if err := hold.QueryRow("SELECT topic FROM im_group_message_topic_shards WHERE topic = ? FOR UPDATE", "mvf").Scan(&locked); err != nil {
		t.Fatalf("lock the mirror row: %v", err)
	}
	inside, _ := rpPost(t, env, tok, "mvf", "f2", "written while the switch comes")
	for deadline := time.Now().Add(10 * time.Second); mvLockWaits(t, env.DB) == 0; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the batch never reached its transaction")
		}
	}
	switched := make(chan error, 1)
	go func() {
		_, err := env.DB.Exec("UPDATE im_tenant_fence SET epoch = 1 WHERE id = 1")
		switched <- err
	}()
	select {
	case err := <-switched:
		t.Fatalf("the switch did not wait for the writer inside its transaction: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-switched; err != nil {
		t.Fatal(err)
	}
	// the writer committed before the switch did: its row is there
	mvWantSeqs(t, env.DB, m, "mvf", first, inside)

	// 2. writers of the old epoch after the switch: nothing written
	late, _ := rpPost(t, env, tok, "mvf", "f3", "sent after the switch")
	code, r := chRecall(t, env, env.Token(rpAdmin, "admin"), "mvf", first, nil)
	if code != 409 || r.Error.Code != "conflict" || r.Error.Details["retry_after_ms"] == nil || r.Error.Details["reason"] != "tenant_moving" {
		t.Fatalf("change during the switch: %d %+v, want 409 conflict with retry_after_ms and reason tenant_moving", code, r.Error)
	}
	if err := env.App.ACL().PutMember(ctx, env.Tenant, "mvf", rpStranger, "member", nil); !errors.Is(err, routing.ErrPlacementMoved) && !strings.Contains(fmt.Sprint(err), "tenant is switching") {
		t.Fatalf("membership write during the switch: %v, want refused by the fence", err)
	}
	sendWaitFor(t, 10*time.Second, "the stale batch refused by the fence", func() bool {
		return persistMetric(t, env, "imshard_persist_retries_total", `reason="moved"`) > 0
	})
	time.Sleep(300 * time.Millisecond)
	mvWantSeqs(t, env.DB, m, "mvf", first, inside)
	if n := chCount(t, env, "im_message_revisions", sq.Eq{"topic": "mvf"}); n != 0 {
		t.Fatalf("a refused change wrote %d revisions", n)
	}

	// 3. the process follows epoch 1 (here the same database: the fence
	// alone is under test): the parked batch lands once, the change passes
	mvPlace(t, store, env.Tenant, env.Config.TenantDSN(env.Config.Tenants[0]), 1)
	mvWaitEpoch(t, env, 1)
	chWaitSettled(t, env, "mvf")
	db, err := env.App.Pools().DB(ctx, env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	mvWantSeqs(t, db, m, "mvf", first, inside, late)
	if code, r := chRecall(t, env, env.Token(rpAdmin, "admin"), "mvf", first, nil); code != 200 {
		t.Fatalf("change after the switch: %d %+v", code, r.Error)
	}
	if n := persistMetric(t, env, "group_message_dead_letter_total"); n != 0 {
		t.Fatalf("%v events dead-lettered during the switch", n)
	}
}

// mvLockWaits counts the transactions of db's database waiting for a lock.
func mvLockWaits(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.innodb_trx x
		JOIN information_schema.processlist p ON p.id = x.trx_mysql_thread_id
		WHERE x.trx_state = 'LOCK WAIT' AND p.db = DATABASE()`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mvWantSeqs checks that topic's rows in month m are exactly seqs, each once.
func mvWantSeqs(t *testing.T, db *sql.DB, m routing.Month, topic string, seqs ...int64) {
	t.Helper()
	got := persistStored(t, db, m)[topic]
	if len(got) != len(seqs) {
		t.Fatalf("%s holds seqs %v, want exactly %v", topic, got, seqs)
	}
	for _, s := range seqs {
		if _, ok := got[s]; !ok {
			t.Fatalf("%s holds seqs %v, want exactly %v", topic, got, seqs)
		}
	}
}
