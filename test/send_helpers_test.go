package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// sendEnv is a running send role with a service token and helpers that make
// a test read like the behaviour it checks.
type sendEnv struct {
	*harness.Env
	svc string // service-role token
}

func startSend(t *testing.T, opts harness.Options) *sendEnv {
	t.Helper()
	if len(opts.Roles) == 0 {
		opts.Roles = []string{"send"}
	}
	e := harness.Start(t, opts)
	return &sendEnv{Env: e, svc: e.Token(900, "service")}
}

// group creates or updates the group behind topic.
func (e *sendEnv) group(topic string, groupID int64, status string) {
	e.T.Helper()
	code, body := e.Do("PUT", "/v1/topics/"+topic, e.svc, map[string]any{"group_id": groupID, "name": "g " + topic, "status": status})
	if code != 200 {
		e.T.Fatalf("put group %s: %d %s", topic, code, body)
	}
}

// member adds or updates a member; mutedUntil may be zero.
func (e *sendEnv) member(topic string, uid int64, role string, mutedUntil time.Time) {
	e.T.Helper()
	body := map[string]any{"role": role}
	if !mutedUntil.IsZero() {
		body["muted_until"] = mutedUntil.UTC().Format(time.RFC3339)
	}
	code, out := e.Do("PUT", fmt.Sprintf("/v1/topics/%s/members/%d", topic, uid), e.svc, body)
	if code != 200 {
		e.T.Fatalf("put member %s/%d: %d %s", topic, uid, code, out)
	}
}

// sendBody is a valid send body.
func sendBody(clientMsgID, text string) map[string]any {
	return map[string]any{"client_msg_id": clientMsgID, "msg_type": "text", "content": map[string]any{"text": text}}
}

type sendResp struct {
	Topic      string     `json:"topic"`
	Seq        int64      `json:"seq"`
	MessageID  message.ID `json:"message_id"`
	ShardMonth string     `json:"shard_month"`
	CreatedAt  string     `json:"created_at"`
	Duplicate  bool       `json:"duplicate"`
	Error      struct {
		Code string `json:"code"`
	} `json:"error"`
}

// send posts a message and decodes the answer (a success or an error).
func (e *sendEnv) send(token, topic string, body any) (int, sendResp) {
	e.T.Helper()
	code, raw := e.Do("POST", "/v1/topics/"+url.PathEscape(topic)+"/messages", token, body)
	var r sendResp
	if err := json.Unmarshal(raw, &r); err != nil {
		e.T.Fatalf("send %s: %d %q: %v", topic, code, raw, err)
	}
	return code, r
}

// mustSend sends and requires a 201.
func (e *sendEnv) mustSend(token, topic string, body any) sendResp {
	e.T.Helper()
	code, r := e.send(token, topic, body)
	if code != 201 || r.Duplicate {
		e.T.Fatalf("send to %s: %d %+v", topic, code, r)
	}
	return r
}

// persistPassed stands in for persist in a test that runs none and whose
// subject is not persist's progress: it publishes, as persist would once
// its group committed everything, that every record Kafka took up to an
// hour from now is stored — so neither a resume fence nor the tenant's
// memory start (lua/fenced.lua) waits for it. A loss of Redis takes it
// with the rest: call it again after one.
func (e *sendEnv) persistPassed() {
	e.T.Helper()
	ctx := context.Background()
	now, err := routing.NewClock(e.Redis).Now(ctx)
	if err != nil {
		e.T.Fatal(err)
	}
	ms := strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10)
	if err := e.Redis.Do(ctx, e.Redis.B().Set().Key(e.Keys().PersistedBefore()).Value(ms).Build()).Error(); err != nil {
		e.T.Fatal(err)
	}
}

// store writes a sent message into its month table and the mirror, as
// persist does, and returns its created_at.
func (e *sendEnv) store(topic string, groupID, from int64, cmid string, r sendResp) time.Time {
	e.T.Helper()
	ctx := context.Background()
	created, err := time.Parse(time.RFC3339Nano, r.CreatedAt)
	if err != nil {
		e.T.Fatal(err)
	}
	table, err := routing.TableFor(e.Start)
	if err != nil {
		e.T.Fatal(err)
	}
	if _, err := sq.Insert(table.Quoted()).
		Columns("message_id", "topic", "group_id", "seqid", "from_user", "client_msg_id", "content", "created_at", "updated_at").
		Values(int64(r.MessageID), topic, groupID, r.Seq, from, cmid, `{"text":"stored"}`, created, created).
		RunWith(e.DB).ExecContext(ctx); err != nil {
		e.T.Fatal(err)
	}
	if err := routing.Fenced(ctx, e.DB, func(tx *sql.Tx) error {
		return routing.WidenMirror(ctx, tx, []routing.MirrorRow{{Topic: topic,
			MonthRange:   routing.MonthRange{Month: e.Start, MinSeq: r.Seq, MaxSeq: r.Seq, Count: 1},
			MinCreatedAt: created, MaxCreatedAt: created}})
	}); err != nil {
		e.T.Fatal(err)
	}
	return created
}

// seqKeyExists reports whether Redis holds an allocation counter for topic.
func (e *sendEnv) seqKeyExists(topic string) bool {
	e.T.Helper()
	keys := e.Keys()
	n, err := e.Redis.Do(context.Background(), e.Redis.B().Exists().Key(keys.Seq(topic)).Build()).AsInt64()
	if err != nil {
		e.T.Fatal(err)
	}
	return n == 1
}

// events reads every event of this tenant produced so far, waiting until
// the record matching done shows up (the caller's last send): Kafka keeps a
// partition's order, and a topic lives in one partition.
func (e *sendEnv) events(done func(message.Event) bool) []message.Event {
	e.T.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.Config.Kafka.Brokers...), kgo.ConsumeTopics(e.Config.Kafka.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		e.T.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []message.Event
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			e.T.Fatalf("events: the awaited event did not arrive; got %d", len(out))
		}
		found := false
		fs.EachRecord(func(r *kgo.Record) {
			var ev message.Event
			if err := json.Unmarshal(r.Value, &ev); err != nil {
				e.T.Fatalf("event %q: %v", r.Value, err)
			}
			if ev.Tenant != e.Tenant {
				return
			}
			if want := ev.Tenant + "/" + ev.Topic; string(r.Key) != want {
				e.T.Errorf("record key %q, want %q", r.Key, want)
			}
			out = append(out, ev)
			found = found || done(ev)
		})
		if found {
			return out
		}
	}
}

// sendByCMID selects the events of one client_msg_id.
func sendByCMID(evs []message.Event, id string) []message.Event {
	var out []message.Event
	for _, ev := range evs {
		if ev.ClientMsgID == id {
			out = append(out, ev)
		}
	}
	return out
}

// idemRecord reads the idempotency HASH of one send.
func (e *sendEnv) idemRecord(topic string, from int64, clientMsgID string) map[string]string {
	e.T.Helper()
	m, err := e.Redis.Do(context.Background(), e.Redis.B().Hgetall().Key(e.Keys().Idempotency(topic, from, clientMsgID)).Build()).AsStrMap()
	if err != nil && !rueidis.IsRedisNil(err) {
		e.T.Fatal(err)
	}
	return m
}

// sendWaitFor polls cond until it holds or the deadline passes.
func sendWaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(d, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// pollUntil polls cond every 10 ms until it holds (true) or d has passed
// (false).
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// groupOfUsers creates topic as an active group of owner 7 whose members
// are users 1..n.
func (e *sendEnv) groupOfUsers(topic string, n int) {
	e.T.Helper()
	e.group(topic, 7, "active")
	for u := range n {
		e.member(topic, int64(u+1), "member", time.Time{})
	}
}

// sendConcurrently makes users 1..workers members of topic (a group of
// owner 7) and has each send per messages at the same time ("w<user-1>-<i>",
// text "x"); every send must be a 201, and the seqs handed out must be
// exactly 1..workers*per: unique and consecutive.
func (e *sendEnv) sendConcurrently(topic string, workers, per int) {
	e.T.Helper()
	e.groupOfUsers(topic, workers)
	seqs := make(chan int64, workers*per)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := e.Token(int64(w+1), "")
			for i := range per {
				code, r := e.send(tok, topic, sendBody(fmt.Sprintf("w%d-%d", w, i), "x"))
				if code != 201 {
					e.T.Errorf("send: %d %+v", code, r)
					return
				}
				seqs <- r.Seq
			}
		}()
	}
	wg.Wait()
	close(seqs)
	var got []int64
	for s := range seqs {
		got = append(got, s)
	}
	slices.Sort(got)
	for i, s := range got {
		if s != int64(i+1) {
			e.T.Fatalf("seq #%d = %d: want 1..%d without gaps or repeats", i, s, workers*per)
		}
	}
	if len(got) != workers*per {
		e.T.Fatalf("%d seqs, want %d", len(got), workers*per)
	}
}

// sentAfterAck makes the send path's call after the broker's ack (the
// library's sent) for the message of (topic, from, clientMsgID) at seq,
// whose hot-cache member is member — as the send makes it, but at a moment
// the test chooses. It returns the call's reply.
func sentAfterAck(t *testing.T, env *harness.Env, topic string, from int64, clientMsgID string, seq int64, member string) int64 {
	t.Helper()
	k := env.Keys()
	keys := []string{k.Idempotency(topic, from, clientMsgID), k.Pending(topic), k.HotMessages(topic), k.Realtime(topic),
		k.MessagesVersion(topic), k.Abandoned(topic)}
	hc := env.Config.HotCache
	args := []string{strconv.FormatInt(seq, 10), "60000", "{}", member, strconv.FormatInt(hc.TTL.Milliseconds(), 10),
		strconv.Itoa(hc.MaxPerTopic), "", `{"type":"message","message":` + member + `}`}
	n, err := routing.NewScripts().Fenced.Sent(context.Background(), env.Redis, keys, args).AsIntSlice()
	if err != nil || len(n) != 1 {
		t.Fatalf("the call after the ack = %v %v, want one reply", n, err)
	}
	return n[0]
}
