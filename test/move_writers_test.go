package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// TestMoveFenceRefusesEveryWriter: with the source's fence raised past
// the epoch this process writes with (a switch it has not followed yet),
// every kind of writer of the tenant database refuses — the HTTP ones 409
// conflict with reason tenant_moving and retry_after_ms, the others
// routing.ErrPlacementMoved — and no table of the database changes, nor
// appears.
func TestMoveFenceRefusesEveryWriter(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	ctx := context.Background()
	rpGroup(t, env, "mvw")
	seq, month := rpPost(t, env, env.Token(rpMember, ""), "mvw", "w1", "stored before the switch")
	chWaitSettled(t, env, "mvw")
	m, err := routing.ParseMonth(month)
	if err != nil {
		t.Fatal(err)
	}
	future, err := routing.TableFor(m.Add(24))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := env.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	if _, err := env.DB.ExecContext(ctx, "UPDATE im_tenant_fence SET epoch = 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	before := mvChecksums(t, env)

	seqPath := fmt.Sprintf("/v1/topics/mvw/messages/%d", seq)
	for _, c := range []struct {
		name   string
		method string
		path   string
		token  string
		body   any
	}{
		{"read cursor", "PUT", "/v1/topics/mvw/read", env.Token(rpMember, ""), map[string]any{"seq": seq}},
		{"preferences", "PUT", "/v1/topics/mvw/me", env.Token(rpMember, ""), map[string]any{"pinned": true}},
		{"hide", "DELETE", seqPath + "?scope=me", env.Token(rpMember, ""), nil},
		{"recall", "POST", seqPath + "/recall", env.Token(rpAdmin, "admin"), nil},
		{"delete for everyone", "DELETE", seqPath + "?scope=all", env.Token(rpAdmin, "admin"), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := env.Do(c.method, c.path, c.token, c.body)
			var r struct {
				Error struct {
					Code    string         `json:"code"`
					Details map[string]any `json:"details"`
				} `json:"error"`
			}
			_ = json.Unmarshal(body, &r)
			if code != http.StatusConflict || r.Error.Code != "conflict" || r.Error.Details["reason"] != "tenant_moving" || r.Error.Details["retry_after_ms"] == nil {
				t.Fatalf("%s %s: %d %s, want 409 conflict, reason tenant_moving, retry_after_ms", c.method, c.path, code, body)
			}
		})
	}
	for _, c := range []struct {
		name  string
		write func() error
	}{
		{"membership", func() error { return env.App.ACL().PutMember(ctx, env.Tenant, "mvw", rpStranger, "member", nil) }},
		{"group retention", func() error { return env.App.ACL().SetRetention(ctx, env.Tenant, "mvw", 3) }},
		{"seq reservation", func() error {
			_, err := env.App.Allocator().RaiseReservations(ctx, env.Tenant, map[string]int64{"mvw": seq + 100}, 0)
			return err
		}},
		{"route repair queue", func() error {
			return routing.QueueRouteRepairs(ctx, env.DB, "test", []routing.RouteRepair{{Topic: "mvw", Month: m, MinSeq: seq, MaxSeq: seq}})
		}},
		{"dead letters", func() error {
			return routing.RecordDeadLetters(ctx, env.DB, []routing.DeadLetterRow{{Topic: "mvw", Seq: seq + 1, Month: m, Reason: "rejected"}})
		}},
		{"catalog", func() error {
			_, err := routing.SetStatus(ctx, env.DB, m, routing.StatusSealing, routing.StatusWritable)
			return err
		}},
		{"retention floors", func() error { return env.RaiseFloors(routing.Floor{Topic: "mvw", Seq: seq + 1}) }},
		{"month table DDL", func() error { return routing.FencedDDL(ctx, env.DB, future.CreateDDL()) }},
		{"migration", func() error {
			return routing.PlanMigration(ctx, env.DB, routing.MigrationPlan{LegacyRows: 1, LegacyMinID: 1, LegacyMaxID: 1, MinMonth: m, MaxMonth: m})
		}},
		{"change outbox", func() error { return feed.Delete(ctx, conn, []int64{1}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.write(); !errors.Is(err, routing.ErrPlacementMoved) {
				t.Fatalf("%s with the fence raised: %v, want refused by the fence", c.name, err)
			}
		})
	}
	after := mvChecksums(t, env)
	for name, sum := range after {
		if before[name] != sum {
			t.Errorf("table %s changed behind the raised fence (checksum %s, was %s)", name, sum, before[name])
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d tables behind the raised fence, %d before", len(after), len(before))
	}
}

// mvChecksums is every table of env's tenant database with its checksum.
func mvChecksums(t *testing.T, env *harness.Env) map[string]string {
	t.Helper()
	rows, err := env.DB.Query("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range names {
		var name, sum string
		if err := env.DB.QueryRow("CHECKSUM TABLE `"+n+"`").Scan(&name, &sum); err != nil {
			t.Fatal(err)
		}
		out[n] = sum
	}
	return out
}

// TestMoveSendWaitsOutTheSwitch: a send whose seq reservation meets the
// raised fence of a switch (the first send of a topic always reserves)
// waits until the process follows the new placement and answers 201,
// instead of 409; nothing reached the database before that.
func TestMoveSendWaitsOutTheSwitch(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Mutate: func(c *config.Config) {
		c.MySQL.PlacementPoll = 100 * time.Millisecond
	}})
	store := mvStore(t, env)
	rpGroup(t, env, "mvq")
	at, err := env.App.Pools().Placement(env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("UPDATE im_tenant_fence SET epoch = ? WHERE id = 1", at.Epoch+1); err != nil {
		t.Fatal(err)
	}
	const hold = 700 * time.Millisecond
	placed := make(chan time.Time, 1)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		time.Sleep(hold)
		var rows int
		if err := env.DB.QueryRow("SELECT COUNT(*) FROM im_seq_reservations WHERE topic = 'mvq'").Scan(&rows); err != nil || rows != 0 {
			t.Errorf("reservations of mvq behind the fence: %d %v", rows, err)
		}
		placed <- time.Now()
		if err := store.Write(context.Background(), placement.Record{Tenant: env.Tenant, DSN: at.DSN, Epoch: at.Epoch + 1}); err != nil {
			t.Errorf("write placement: %v", err)
		}
	}()
	code, body := env.Do("POST", "/v1/topics/mvq/messages", env.Token(rpMember, ""), map[string]any{
		"client_msg_id": "q1", "msg_type": "text", "content": map[string]any{"text": "during the switch"}})
	answered := time.Now()
	<-wrote
	if code != 201 {
		t.Fatalf("send during the switch: %d %s, want 201", code, body)
	}
	if p := <-placed; answered.Before(p) {
		t.Fatal("the send answered before the switch ended: its reservation was not refused")
	}
	sendWaitFor(t, 10*time.Second, "the send stored", func() bool {
		n, _ := mvTopicRows(t, env.DB, "mvq")
		return n == 1
	})
}

// TestChangeSeqAndCursorUnderTheMoveTriggers: while a move's mark triggers
// are on the tenant's tables (from its copy to its end), an edit still
// answers 200 with the topic's next change_seq, a read cursor write
// answers the cursor it holds and a purge answers its job's id. The first
// two set their value with LAST_INSERT_ID(expr); MariaDB does not report
// that value with the statement's result when a trigger of the statement
// inserted a row into a table with an AUTO_INCREMENT key (the marks), so
// taken from there the edit failed on the outbox with a duplicate
// change_seq 0 (503) and the cursor write answered read_seq 0; they read
// it back in their transaction now. (A plain AUTO_INCREMENT insert, the
// job's, is reported right.)
func TestChangeSeqAndCursorUnderTheMoveTriggers(t *testing.T) {
	t.Parallel()
	l := mvStartLive(t, 1)
	env, ctx := l.env, context.Background()
	rpGroup(t, env, "mvt")
	tok := env.Token(rpMember, "")
	s1, _ := rpPost(t, env, tok, "mvt", "t1", "one")
	s2, _ := rpPost(t, env, tok, "mvt", "t2", "two")
	chWaitSettled(t, env, "mvt")
	at := l.at
	mvBeginStopped(t, ctx, l.tenant, at, l.targetDSN, l.store)
	var triggers int
	if err := l.src.QueryRow("SELECT COUNT(*) FROM information_schema.triggers WHERE trigger_schema = DATABASE()").Scan(&triggers); err != nil || triggers == 0 {
		t.Fatalf("the move's triggers on the source: %d %v", triggers, err)
	}
	version := map[int64]int64{s1: 1, s2: 1}
	for i, seq := range []int64{s1, s2, s1} {
		code, body := env.Do("PATCH", fmt.Sprintf("/v1/topics/mvt/messages/%d", seq), tok,
			map[string]any{"content": map[string]any{"text": fmt.Sprint("edit ", i)}, "expected_version": version[seq]})
		version[seq]++
		var r struct {
			ChangeSeq int64 `json:"change_seq"`
		}
		if code != 200 || json.Unmarshal(body, &r) != nil || r.ChangeSeq != int64(i+1) {
			t.Fatalf("edit %d of seq %d under the move's triggers: %d %s, want 200 with change_seq %d", i, seq, code, body, i+1)
		}
	}
	for _, c := range []struct{ put, want int64 }{{s2, s2}, {s1, s2}} {
		code, body := env.Do("PUT", "/v1/topics/mvt/read", tok, map[string]any{"seq": c.put})
		var r struct {
			ReadSeq int64 `json:"read_seq"`
		}
		if code != 200 || json.Unmarshal(body, &r) != nil || r.ReadSeq != c.want {
			t.Fatalf("read cursor to %d under the move's triggers: %d %s, want read_seq %d", c.put, code, body, c.want)
		}
	}
	code, body := env.Do("DELETE", "/v1/topics/mvt2?purge=true", env.Token(900, "service"), nil)
	var job struct {
		ID string `json:"id"`
	}
	var last string
	if err := l.src.QueryRow("SELECT CAST(MAX(job_id) AS CHAR) FROM im_jobs").Scan(&last); err != nil {
		t.Fatal(err)
	}
	if code != 202 || json.Unmarshal(body, &job) != nil || job.ID != last {
		t.Fatalf("purge queued under the move's triggers: %d %s, want the job %s", code, body, last)
	}
}
