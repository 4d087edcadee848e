package test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/send"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// Every bad input gets its 4xx code, allocates no seq and
// produces nothing: afterwards the topic's first real send gets seq 1 and is
// the first event of the tenant in Kafka.
func TestSendBadInputsChangeNothing(t *testing.T) {
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.Send.MaxBodyBytes = 2048 }})
	const topic, dissolved = "room", "gone"
	e.group(topic, 1, "active")
	e.group(dissolved, 2, "active")
	e.member(topic, 1, "member", time.Time{})
	e.member(topic, 2, "member", time.Now().Add(time.Hour))
	e.member(dissolved, 1, "member", time.Time{})
	e.group(dissolved, 2, "dissolved")
	user := e.Token(1, "")

	sign := func(claims jwt.MapClaims, secret []byte) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	future := time.Now().Add(time.Hour).Unix()
	b64 := base64.RawURLEncoding.EncodeToString
	algNone := b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
		b64([]byte(fmt.Sprintf(`{"tid":%q,"sub":"1","exp":%d}`, e.Tenant, future))) + "."
	other := testenv.NewTenant(t)

	big := sendBody("big", strings.Repeat("x", 4096))
	for _, tc := range []struct {
		name   string
		token  string
		topic  string
		body   any
		status int
		code   string
	}{
		{"oversized body", user, topic, big, 413, "too_large"},
		{"invalid JSON", user, topic, []byte(`{"client_msg_id":`), 400, "invalid_argument"},
		{"unknown field", user, topic, []byte(`{"client_msg_id":"a","msg_type":"text","content":{},"seq":1}`), 400, "invalid_argument"},
		{"unknown msg_type", user, topic, map[string]any{"client_msg_id": "a", "msg_type": "html", "content": map[string]any{}}, 400, "invalid_argument"},
		{"missing client_msg_id", user, topic, map[string]any{"msg_type": "text", "content": map[string]any{}}, 400, "invalid_argument"},
		{"oversized client_msg_id", user, topic, sendBody(strings.Repeat("c", 65), "x"), 400, "invalid_argument"},
		{"content not an object", user, topic, map[string]any{"client_msg_id": "a", "msg_type": "text", "content": "hi"}, 400, "invalid_argument"},
		{"topic with a quote", user, "a'b", sendBody("a", "x"), 400, "invalid_argument"},
		{"topic with a space", user, "a b", sendBody("a", "x"), 400, "invalid_argument"},
		{"topic with a glob", user, "x*", sendBody("a", "x"), 400, "invalid_argument"},
		{"topic with a hash tag", user, "{t}", sendBody("a", "x"), 400, "invalid_argument"},
		{"topic with a colon", user, "a:b", sendBody("a", "x"), 400, "invalid_argument"},
		{"topic of 65 chars", user, strings.Repeat("t", 65), sendBody("a", "x"), 400, "invalid_argument"},
		{"no token", "", topic, sendBody("a", "x"), 401, "unauthenticated"},
		{"expired token", sign(jwt.MapClaims{"tid": e.Tenant, "sub": "1", "exp": time.Now().Add(-time.Hour).Unix()}, e.Secret), topic, sendBody("a", "x"), 401, "unauthenticated"},
		{"forged token", sign(jwt.MapClaims{"tid": e.Tenant, "sub": "1", "exp": future}, []byte("wrong")), topic, sendBody("a", "x"), 401, "unauthenticated"},
		{"alg none", algNone, topic, sendBody("a", "x"), 401, "unauthenticated"},
		{"other tenant's token", sign(jwt.MapClaims{"tid": other, "sub": "1", "exp": future}, []byte("secret-"+other)), topic, sendBody("a", "x"), 401, "unauthenticated"},
		{"non-member sender", e.Token(3, ""), topic, sendBody("a", "x"), 403, "permission_denied"},
		{"muted member", e.Token(2, ""), topic, sendBody("a", "x"), 403, "permission_denied"},
		{"dissolved group", user, dissolved, sendBody("a", "x"), 403, "permission_denied"},
		{"no group", user, "nogroup", sendBody("a", "x"), 404, "not_found"},
		{"from_user by a plain user", user, topic, map[string]any{"client_msg_id": "a", "msg_type": "text", "content": map[string]any{}, "from_user": "2"}, 400, "invalid_argument"},
		{"system message by a plain user", user, topic, map[string]any{"client_msg_id": "a", "msg_type": "system", "content": map[string]any{}}, 403, "permission_denied"},
		{"negative reply_seqid", user, topic, map[string]any{"client_msg_id": "a", "msg_type": "text", "content": map[string]any{}, "reply_seqid": -1}, 400, "invalid_argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, r := e.send(tc.token, tc.topic, tc.body)
			if status != tc.status || r.Error.Code != tc.code {
				t.Fatalf("got %d %q, want %d %q", status, r.Error.Code, tc.status, tc.code)
			}
		})
	}
	for _, tp := range []string{topic, dissolved, "nogroup"} {
		if e.seqKeyExists(tp) {
			t.Errorf("a rejected send allocated on %s", tp)
		}
	}
	if n, err := e.App.Allocator().ReservedHi(context.Background(), e.Tenant, topic); err != nil || n != 0 {
		t.Errorf("reservation of %s = %d, %v; want none", topic, n, err)
	}
	if rec := e.idemRecord(topic, 1, "a"); len(rec) != 0 {
		t.Errorf("a rejected send left an idempotency record: %v", rec)
	}

	ok := e.mustSend(user, topic, sendBody("first", "hello"))
	if ok.Seq != 1 || ok.ShardMonth != e.Start.String() {
		t.Fatalf("first real send = %+v, want seq 1 in %s", ok, e.Start)
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "first" })
	if len(evs) != 1 {
		t.Fatalf("produced %d events before the first real send: %+v", len(evs)-1, evs)
	}
	ev := evs[0]
	if ev.V != 1 || ev.SeqID != 1 || ev.Topic != topic || int64(ev.GroupID) != 1 || int64(ev.FromUser) != 1 ||
		ev.MessageID != ok.MessageID || ev.ShardMonth != e.Start.String() || ev.EventID == "" || ev.MsgType != "text" {
		t.Fatalf("event = %+v", ev)
	}
}

// A retried client_msg_id answers 200 with the original seq — from Redis,
// and from MySQL once Redis forgot (the month table's unique key) — and
// produces nothing.
func TestSendIdempotentRetry(t *testing.T) {
	e := startSend(t, harness.Options{})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	ctx := context.Background()
	retry := func(cmid string, first sendResp) {
		t.Helper()
		status, again := e.send(user, "room", sendBody(cmid, "a different body"))
		if status != 200 || !again.Duplicate || again.Seq != first.Seq || again.MessageID != first.MessageID ||
			again.CreatedAt != first.CreatedAt || again.ShardMonth != first.ShardMonth {
			t.Fatalf("retry of %s = %d %+v, first %+v", cmid, status, again, first)
		}
	}
	// Redis loses the tenant's memory of sends: the record and the horizon
	forget := func(cmid string) {
		t.Helper()
		k := e.Keys()
		if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(k.Idempotency("room", 1, cmid), k.IdemSince()).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}

	// persist's progress makes MySQL's answer complete (no persist runs)
	e.persistPassed()
	first := e.mustSend(user, "room", sendBody("m1", "hello"))
	retry("m1", first)
	if rec := e.idemRecord("room", 1, "m1"); rec["status"] != "acked" || rec["event"] == "" ||
		rec["seq"] != strconv.FormatInt(first.Seq, 10) || rec["month"] != first.ShardMonth || rec["gid"] != "7" {
		t.Fatalf("idempotency record = %v", rec)
	}

	// once Redis forgot, the stored message itself (what persist writes)
	// answers; the horizon waits for it meanwhile
	// (TestSendHorizonSkipsMessagesWithRecords)
	second := e.mustSend(user, "room", sendBody("m2", "stored"))
	e.store("room", 7, 1, "m2", second)
	forget("m2")
	retry("m2", second)
	if rec := e.idemRecord("room", 1, "m2"); rec["status"] != "done" || rec["resp"] == "" {
		t.Fatalf("idempotency record not restored from MySQL: %v", rec)
	}

	next := e.mustSend(user, "room", sendBody("m3", "next"))
	if next.Seq != second.Seq+1 {
		t.Fatalf("a duplicate consumed a seq: next = %d after %d", next.Seq, second.Seq)
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "m3" })
	for _, cmid := range []string{"m1", "m2"} {
		if got := sendByCMID(evs, cmid); len(got) != 1 {
			t.Fatalf("%s produced %d times", cmid, len(got))
		}
	}
}

// The horizon waits a full idempotency TTL only after messages that a
// retry could reach without their record: messages whose sends made their
// records after Redis's memory began (a new tenant's first sends, any
// tenant's traffic since a loss) do not hold it back, or every send would
// ask MySQL for a day.
func TestSendHorizonSkipsMessagesWithRecords(t *testing.T) {
	e := startSend(t, harness.Options{})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	ctx := context.Background()
	horizon := func() int64 {
		t.Helper()
		var ms int64
		sendWaitFor(t, 10*time.Second, "the idempotency horizon", func() bool {
			v, err := e.Redis.Do(ctx, e.Redis.B().Get().Key(e.Keys().IdemSince()).Build()).ToString()
			_, s, _ := strings.Cut(v, ":")
			ms, _ = strconv.ParseInt(s, 10, 64)
			return err == nil && ms > 0
		})
		return ms
	}
	recompute := func(cmid string) {
		t.Helper()
		if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(e.Keys().IdemSince()).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		e.mustSend(user, "room", sendBody(cmid, "x"))
	}

	e.persistPassed()
	var last sendResp
	var created time.Time
	for i := range 3 {
		cmid := "m" + strconv.Itoa(i)
		last = e.mustSend(user, "room", sendBody(cmid, "stored"))
		created = e.store("room", 7, 1, cmid, last)
	}
	recompute("probe-1")
	ttl := e.Config.Send.IdempotencyTTL
	if h := horizon(); h >= created.Add(ttl/2).UnixMilli() {
		t.Fatalf("horizon %s with every stored message recorded: a full TTL after %s", time.UnixMilli(h).UTC(), created)
	}

	// the newest stored message loses its record: a retry of it would find
	// none, so the horizon lies a full TTL after it
	if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(e.Keys().Idempotency("room", 1, "m2")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	recompute("probe-2")
	if h, want := horizon(), created.Add(ttl).UnixMilli(); h != want {
		t.Fatalf("horizon %s, want %s (the unrecorded message's created_at + TTL)", time.UnixMilli(h).UTC(), time.UnixMilli(want).UTC())
	}
}

// A first attempt that stored its event and then died (still pending)
// is re-produced by the retry: same seq, month and event_id.
func TestSendRetryReproducesPendingEvent(t *testing.T) {
	e := startSend(t, harness.Options{})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	ctx := context.Background()

	al, err := e.App.Allocator().Allocate(ctx, e.Tenant, "room")
	if err != nil {
		t.Fatal(err)
	}
	ev := message.Event{V: 1, EventID: "evt-crashed", Tenant: e.Tenant, Topic: "room", GroupID: 7, SeqID: al.Seq,
		ShardMonth: al.Month.String(), MessageID: 12345, FromUser: 1, ClientMsgID: "c1", MsgType: "text",
		Content: []byte(`{"text":"before the crash"}`), CreatedAt: message.NewTime(time.Now())}
	raw, _ := json.Marshal(ev)
	key := e.Keys().Idempotency("room", 1, "c1")
	if err := e.Redis.Do(ctx, e.Redis.B().Hset().Key(key).FieldValue().FieldValue("status", "pending").
		FieldValue("owner", "dead").FieldValue("event", string(raw)).Build()).Error(); err != nil {
		t.Fatal(err)
	}

	status, r := e.send(user, "room", sendBody("c1", "the retry's body is ignored"))
	if status != 200 || !r.Duplicate || r.Seq != al.Seq || int64(r.MessageID) != 12345 || r.ShardMonth != al.Month.String() {
		t.Fatalf("retry of a pending send = %d %+v", status, r)
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "c1" })
	got := sendByCMID(evs, "c1")
	if len(got) != 1 || got[0].EventID != "evt-crashed" || got[0].SeqID != al.Seq || string(got[0].Content) != `{"text":"before the crash"}` {
		t.Fatalf("re-produced %+v", got)
	}
	if rec := e.idemRecord("room", 1, "c1"); rec["status"] != "acked" {
		t.Fatalf("record after the re-produce: %v", rec)
	}
}

// brokerSwitch makes a kfake cluster refuse produce requests (with
// INVALID_RECORD: the client knows nothing was written and fails the record
// at once) while down.
type brokerSwitch struct {
	c    *kfake.Cluster
	down atomic.Bool
}

func newBrokerSwitch(t *testing.T) *brokerSwitch {
	s := &brokerSwitch{c: testenv.KafkaCluster(t)}
	s.c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		s.c.KeepControl()
		if !s.down.Load() {
			return nil, nil, false
		}
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.InvalidRecord.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return s
}

// brokerHold makes a kfake cluster hold the next produce request once armed
// — the broker has the record but does not answer — until released; the
// cluster then writes and acknowledges it as usual.
type brokerHold struct {
	c       *kfake.Cluster
	armed   atomic.Bool
	release chan struct{}
	once    sync.Once
}

func newBrokerHold(t *testing.T) *brokerHold {
	h := &brokerHold{c: testenv.KafkaCluster(t), release: make(chan struct{})}
	h.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		h.c.KeepControl()
		if h.armed.CompareAndSwap(true, false) {
			h.c.SleepControl(func() { <-h.release })
		}
		return nil, nil, false
	})
	t.Cleanup(h.free)
	return h
}

// free lets the held request through.
func (h *brokerHold) free() { h.once.Do(func() { close(h.release) }) }

// TestSendAckAfterGapNeverAnsweredAsStored: a send whose broker ack comes
// only after readers recorded its seq as a gap is never answered as
// stored, and its message never appears under that seq: the send answers
// 503 (before the gap could be recorded), the late ack finds the seq
// abandoned, persist drops the event, and the retry with the same
// client_msg_id sends the message afresh under a new seq — read exactly
// once, in order, by since and before walks alike.
func TestSendAckAfterGapNeverAnsweredAsStored(t *testing.T) {
	h := newBrokerHold(t)
	env := harness.Start(t, harness.Options{Brokers: h.c.ListenAddrs(), Mutate: func(c *config.Config) {
		c.Send.ProduceTimeout = time.Second
	}})
	rpGroup(t, env, "late")
	tok := env.Token(rpMember, "")
	rpPost(t, env, tok, "late", "before", "before")
	late := sendBody("late", "acknowledged late")

	h.armed.Store(true)
	if code, body := env.Do("POST", "/v1/topics/late/messages", tok, late); code != 503 {
		t.Fatalf("send whose produce the broker holds = %d %s, want 503", code, body)
	}
	ctx := context.Background()
	const gap = 2
	sendWaitFor(t, 10*time.Second, "readers to record the held seq as a gap", func() bool {
		if _, err := env.App.Flight().Bound(ctx, env.Tenant, "late"); err != nil {
			t.Fatal(err)
		}
		gaps, err := env.App.Flight().Gaps(ctx, env.Tenant, "late", gap, gap)
		if err != nil {
			t.Fatal(err)
		}
		return len(gaps) == 1
	})
	h.free()
	sendWaitFor(t, 10*time.Second, "the late ack", func() bool {
		return rpMetric(t, env, "imshard_send_post_ack_failures_total", "step=late_after_gap") >= 1
	})
	// persist takes the topic's events in order: once this one is stored,
	// the late one was handled
	rpPost(t, env, tok, "late", "after", "after")
	chWaitSettled(t, env, "late")

	code, body := env.Do("POST", "/v1/topics/late/messages", tok, late)
	var r sendResp
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if code != 201 || r.Seq == gap {
		t.Fatalf("retry of the late send = %d %s: want 201 under a new seq, never the gap %d", code, body, gap)
	}
	chWaitSettled(t, env, "late")
	rpExpectWalks(t, env, "after the retry", rpOther, "late", 10, []int64{1, 3, r.Seq})
	if _, gaps := rpWalkSinceGaps(t, env, rpOther, "late", 10); !slices.Equal(gaps, []int64{gap}) {
		t.Fatalf("gaps reported by the since walk = %v, want [%d]", gaps, gap)
	}
	if n := rpMetric(t, env, "group_message_persist_total", "status=abandoned"); n != 1 {
		t.Fatalf("persist dropped %v events of abandoned seqs, want 1", n)
	}
}

// Kafka unavailable: 503, nothing produced; once the broker is back sends
// work, the failed seq is never reused and times out into a recorded gap.
func TestSendKafkaUnavailable(t *testing.T) {
	bs := newBrokerSwitch(t)
	e := startSend(t, harness.Options{Brokers: bs.c.ListenAddrs(), Mutate: func(c *config.Config) {
		c.Send.ProduceTimeout = time.Second
	}})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	before := e.mustSend(user, "room", sendBody("ok1", "x"))

	bs.down.Store(true)
	status, r := e.send(user, "room", sendBody("lost", "x"))
	if status != 503 || r.Error.Code != "unavailable" {
		t.Fatalf("send with Kafka down = %d %+v", status, r)
	}
	if rec := e.idemRecord("room", 1, "lost"); rec["status"] != "failed" || rec["event"] == "" {
		t.Fatalf("record of the failed send = %v", rec)
	}
	bs.down.Store(false)

	after := e.mustSend(user, "room", sendBody("ok2", "x"))
	if after.Seq != before.Seq+2 {
		t.Fatalf("seq after the failure = %d, want %d (the failed seq is never reused)", after.Seq, before.Seq+2)
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "ok2" })
	if got := sendByCMID(evs, "lost"); len(got) != 0 {
		t.Fatalf("the refused send was produced: %+v", got)
	}
	failedSeq := before.Seq + 1
	// persist (not running here) stores the acknowledged seqs around it
	if err := e.App.Flight().MarkPersisted(context.Background(), e.Tenant, "room", before.Seq, after.Seq); err != nil {
		t.Fatal(err)
	}
	sendWaitFor(t, 10*time.Second, "the failed seq to become a gap", func() bool {
		if _, err := e.App.Flight().Bound(context.Background(), e.Tenant, "room"); err != nil {
			t.Fatal(err)
		}
		gaps, err := e.App.Flight().Gaps(context.Background(), e.Tenant, "room", failedSeq, failedSeq)
		if err != nil {
			t.Fatal(err)
		}
		return len(gaps) == 1
	})

	// a retry after the seq became a gap sends the message for real, under
	// a new seq: the old one was never stored
	retried := e.mustSendOrDup(user, "room", sendBody("lost", "x"))
	if retried.Seq <= after.Seq {
		t.Fatalf("retry after the gap reused seq %d", retried.Seq)
	}
}

// mustSendOrDup accepts 201 or 200 (a retry that ends up sending).
func (e *sendEnv) mustSendOrDup(token, topic string, body any) sendResp {
	e.T.Helper()
	code, r := e.send(token, topic, body)
	if code != 201 && code != 200 {
		e.T.Fatalf("send to %s: %d %+v", topic, code, r)
	}
	return r
}

// A retry while the broker is still down re-produces the same event (same
// seq, same event_id) and succeeds once it is back.
func TestSendRetryOfFailedProduceKeepsItsSeq(t *testing.T) {
	bs := newBrokerSwitch(t)
	e := startSend(t, harness.Options{Brokers: bs.c.ListenAddrs(), Mutate: func(c *config.Config) {
		c.Send.ProduceTimeout = 2 * time.Second
	}})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")

	bs.down.Store(true)
	if status, r := e.send(user, "room", sendBody("c1", "x")); status != 503 {
		t.Fatalf("send with Kafka down = %d %+v", status, r)
	}
	bs.down.Store(false)
	status, r := e.send(user, "room", sendBody("c1", "x"))
	if status != 200 || !r.Duplicate || r.Seq != 1 {
		t.Fatalf("retry = %d %+v, want the first attempt's seq 1", status, r)
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "c1" })
	if got := sendByCMID(evs, "c1"); len(got) != 1 || got[0].SeqID != 1 {
		t.Fatalf("events of c1: %+v", got)
	}
	if next := e.mustSend(user, "room", sendBody("c2", "x")); next.Seq != 2 {
		t.Fatalf("next seq = %d, want 2", next.Seq)
	}
}

// Concurrent senders on one topic get unique, consecutive seqs.
func TestSendConcurrentSendersGetConsecutiveSeqs(t *testing.T) {
	startSend(t, harness.Options{}).sendConcurrently("room", 8, 200)
}

// FLUSHALL mid-run with concurrent senders: no seq is ever issued twice,
// and sends resume.
func TestSendFlushAllNeverReissuesSeq(t *testing.T) {
	rs := testenv.StartRedis(t)
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.Redis.Addrs = []string{rs.Addr} }})
	const workers = 8
	e.groupOfUsers("room", workers)
	var (
		mu      sync.Mutex
		seen    = map[int64]string{}
		flushed atomic.Bool
		after   atomic.Int64
	)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := e.Token(int64(w+1), "")
			for i := 0; ctx.Err() == nil; i++ {
				cmid := fmt.Sprintf("w%d-%d", w, i)
				code, r := e.send(tok, "room", sendBody(cmid, "x"))
				if code != 201 {
					continue // a send racing the flush may fail; it is retried as a new message here
				}
				mu.Lock()
				if prev, dup := seen[r.Seq]; dup {
					t.Errorf("seq %d issued twice: %s and %s", r.Seq, prev, cmid)
				}
				seen[r.Seq] = cmid
				mu.Unlock()
				if flushed.Load() {
					after.Add(1)
				}
			}
		}()
	}
	sendWaitFor(t, 20*time.Second, "sends before the flush", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 200 })
	if err := e.Redis.Do(ctx, e.Redis.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// the flush re-fences the topic: sends wait until persist passed the
	// flush (no persist runs here; its progress stands in)
	e.persistPassed()
	flushed.Store(true)
	sendWaitFor(t, 20*time.Second, "sends to resume after the flush", func() bool { return after.Load() >= 200 })
	stop()
	wg.Wait()
}

// The service role sends for a member with from_user; not for a stranger.
func TestSendServiceSendsForMember(t *testing.T) {
	e := startSend(t, harness.Options{})
	e.group("room", 7, "active")
	e.member("room", 5, "member", time.Time{})
	body := func(cmid string, from any) map[string]any {
		b := sendBody(cmid, "on behalf")
		b["from_user"] = from
		return b
	}
	r := e.mustSend(e.svc, "room", body("s1", "5"))
	if status, r := e.send(e.svc, "room", body("s2", 6)); status != 403 || r.Error.Code != "permission_denied" {
		t.Fatalf("service for a non-member = %d %+v", status, r)
	}
	if status, r := e.send(e.Token(5, "admin"), "room", body("s3", "5")); status != 400 {
		t.Fatalf("admin with from_user = %d %+v", status, r)
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "s1" })
	got := sendByCMID(evs, "s1")
	if len(got) != 1 || got[0].FromUser != 5 || got[0].SeqID != r.Seq {
		t.Fatalf("events = %+v", got)
	}
	// the idempotency key is the member's, not the service's
	if rec := e.idemRecord("room", 5, "s1"); rec["status"] != "acked" {
		t.Fatalf("record = %v", rec)
	}
}

// Group and member endpoints validate every field, need the service or
// admin role, and take effect at once (the ACL cache is invalidated).
func TestSendGroupAndMemberEndpoints(t *testing.T) {
	e := startSend(t, harness.Options{})
	user := e.Token(1, "")
	admin := e.Token(99, "admin")
	for _, tc := range []struct {
		name, method, path, token string
		body                      any
		status                    int
	}{
		{"user may not manage groups", "PUT", "/v1/topics/room", user, map[string]any{"group_id": 1, "status": "active"}, 403},
		{"missing group_id", "PUT", "/v1/topics/room", e.svc, map[string]any{"status": "active"}, 400},
		{"bad status", "PUT", "/v1/topics/room", e.svc, map[string]any{"group_id": 1, "status": "closed"}, 400},
		{"bad group_id", "PUT", "/v1/topics/room", e.svc, map[string]any{"group_id": "x", "status": "active"}, 400},
		{"bad topic", "PUT", "/v1/topics/a:b", e.svc, map[string]any{"group_id": 1, "status": "active"}, 400},
		{"unknown field", "PUT", "/v1/topics/room", e.svc, map[string]any{"group_id": 1, "status": "active", "owner": 1}, 400},
		{"member of no group", "PUT", "/v1/topics/room/members/1", e.svc, map[string]any{"role": "member"}, 404},
		{"user may not manage members", "PUT", "/v1/topics/room/members/1", user, map[string]any{"role": "member"}, 403},
		{"bad uid", "PUT", "/v1/topics/room/members/0x1", e.svc, map[string]any{"role": "member"}, 400},
		{"bad role", "PUT", "/v1/topics/room/members/1", e.svc, map[string]any{"role": "god"}, 400},
		{"bad muted_until", "PUT", "/v1/topics/room/members/1", e.svc, map[string]any{"role": "member", "muted_until": "soon"}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, body := e.Do(tc.method, tc.path, tc.token, tc.body); status != tc.status {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, status, body, tc.status)
			}
		})
	}

	if status, body := e.Do("PUT", "/v1/topics/room", admin, map[string]any{"group_id": "7", "name": "Room", "status": "active"}); status != 200 ||
		!strings.Contains(string(body), `"group_id":"7"`) {
		t.Fatalf("admin put group = %d %s", status, body)
	}
	e.member("room", 1, "member", time.Time{})
	e.mustSend(user, "room", sendBody("a", "x")) // fills the ACL cache

	expect := func(what string, want int) {
		t.Helper()
		if status, r := e.send(user, "room", sendBody(what, "x")); status != want {
			t.Fatalf("%s: send = %d %+v, want %d", what, status, r, want)
		}
	}
	e.member("room", 1, "member", time.Now().Add(time.Hour))
	expect("muted", 403)
	e.member("room", 1, "admin", time.Time{})
	e.group("room", 7, "muted")
	expect("group muted, admin may post", 201)
	e.member("room", 1, "member", time.Time{})
	expect("group muted", 403)
	e.group("room", 7, "active")
	expect("unmuted", 201)
	if status, body := e.Do("DELETE", "/v1/topics/room/members/1", e.svc, nil); status != 204 {
		t.Fatalf("delete member = %d %s", status, body)
	}
	expect("removed", 403)
	e.member("room", 1, "member", time.Time{})
	e.group("room", 7, "dissolved")
	expect("dissolved", 403)
}

// Snowflake node ids are leased uniquely across live processes, and a lease
// lost to a flush is taken again by the renewal.
func TestSendSnowflakeNodeLeases(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := testenv.RedisClient(t, rs.Addr)
	scripts := routing.NewScripts()
	space, err := routing.NewKeySpace("lease:")
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ttl = 300 * time.Millisecond
	seen := map[int]bool{}
	var leases []*send.NodeLease
	var gens []*send.Snowflake
	for range 5 {
		gen := send.NewSnowflake(time.Second)
		l := send.NewNodeLease(rdb, space, scripts, ttl, gen, log)
		if err := l.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		if seen[gen.Node()] {
			t.Fatalf("node %d leased twice", gen.Node())
		}
		seen[gen.Node()] = true
		leases, gens = append(leases, l), append(gens, gen)
	}
	var wg sync.WaitGroup
	for _, l := range leases {
		wg.Add(1)
		go func() { defer wg.Done(); l.Run(ctx) }()
	}
	defer wg.Wait()
	defer cancel()

	if err := rdb.Do(ctx, rdb.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	sendWaitFor(t, 10*time.Second, "every lease to be taken again", func() bool {
		for _, g := range gens {
			key, err := space.SnowflakeNode(g.Node())
			if err != nil {
				t.Fatal(err)
			}
			n, err := rdb.Do(ctx, rdb.B().Exists().Key(key).Build()).AsInt64()
			if err != nil || n != 1 {
				return false
			}
		}
		return true
	})
	// renewed leases keep minting past their first TTL
	time.Sleep(2 * ttl)
	for _, g := range gens {
		if _, err := g.Next(); err != nil {
			t.Fatalf("node %d: %v", g.Node(), err)
		}
	}
}

// A claim whose sender died before allocating is taken over once stale; a
// live one makes the retry wait for it instead of allocating twice.
func TestSendStaleClaimTakenOver(t *testing.T) {
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.Send.ProduceTimeout = time.Second }})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	ctx := context.Background()
	claim := func(cmid string, at time.Time) {
		t.Helper()
		if err := e.Redis.Do(ctx, e.Redis.B().Hset().Key(e.Keys().Idempotency("room", 1, cmid)).FieldValue().
			FieldValue("status", "pending").FieldValue("owner", "dead").
			FieldValue("claimed_at", fmt.Sprint(at.UnixMilli())).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	claim("old", time.Now().Add(-time.Minute))
	if r := e.mustSend(user, "room", sendBody("old", "x")); r.Seq != 1 {
		t.Fatalf("takeover of a stale claim = %+v", r)
	}
	claim("live", time.Now())
	start := time.Now()
	r := e.mustSend(user, "room", sendBody("live", "x"))
	if r.Seq != 2 || time.Since(start) < 500*time.Millisecond {
		t.Fatalf("a live claim was not waited for: %+v after %s", r, time.Since(start))
	}
}

// After the ack the message is in the hot cache (score seq, trimmed to
// hot_cache.max_per_topic lowest-first at every 16th seq, with the cache
// TTL) and published on the topic's realtime channel.
func TestSendHotCacheAndRealtime(t *testing.T) {
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.HotCache.MaxPerTopic = 3 }})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	k := e.Keys()

	sub := testenv.RedisClient(t, testenv.RedisAddr())
	got := make(chan string, 32)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = sub.Receive(ctx, sub.B().Ssubscribe().Channel(k.Realtime("room")).Build(), func(m rueidis.PubSubMessage) {
			got <- m.Message
		})
	}()
	sendWaitFor(t, 10*time.Second, "the realtime subscription", func() bool {
		n, err := e.Redis.Do(ctx, e.Redis.B().PubsubShardnumsub().Channel(k.Realtime("room")).Build()).AsIntMap()
		return err == nil && n[k.Realtime("room")] > 0
	})

	var last sendResp
	hot := func(first, last float64) []rueidis.ZScore {
		t.Helper()
		members, err := e.Redis.Do(ctx, e.Redis.B().Zrange().Key(k.HotMessages("room")).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			t.Fatal(err)
		}
		if n := len(members); n == 0 || members[0].Score != first || members[n-1].Score != last || n != int(last-first)+1 {
			t.Fatalf("hot cache = %+v, want seqs %v..%v", members, first, last)
		}
		return members
	}
	for i := range 17 {
		last = e.mustSend(user, "room", sendBody(fmt.Sprintf("h%d", i), fmt.Sprintf("hello %d", i)))
		switch i + 1 {
		case 15:
			hot(1, 15) // no trim yet
		case 16:
			hot(14, 16) // seq 16 trimmed to the newest 3
		}
	}
	members := hot(14, 17)
	var m message.Message
	if err := json.Unmarshal([]byte(members[3].Member), &m); err != nil {
		t.Fatal(err)
	}
	if m.Seq != last.Seq || m.MessageID != last.MessageID || m.Status != "normal" || string(m.Content) != `{"text":"hello 16"}` || m.Version != 1 {
		t.Fatalf("cached message = %+v", m)
	}
	if ttl, err := e.Redis.Do(ctx, e.Redis.B().Pttl().Key(k.HotMessages("room")).Build()).AsInt64(); err != nil ||
		ttl <= 0 || ttl > e.Config.HotCache.TTL.Milliseconds() {
		t.Fatalf("hot cache ttl = %d, %v", ttl, err)
	}
	for i := range 5 {
		select {
		case raw := <-got:
			var frame struct {
				Type    string          `json:"type"`
				Message message.Message `json:"message"`
			}
			if err := json.Unmarshal([]byte(raw), &frame); err != nil {
				t.Fatal(err)
			}
			if frame.Type != "message" || frame.Message.Seq != int64(i+1) || frame.Message.ClientMsgID != fmt.Sprintf("h%d", i) {
				t.Fatalf("frame %d = %s", i, raw)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("realtime frame %d not received", i)
		}
	}
}

// `imshard bench send` runs end to end — the rounds of the HTTP send, the
// reference send and a peer command, the open loop — in an installation
// with a redis.key_prefix, leaves no key of its tenant behind under any
// prefix, and rejects bad usage with exit 2 (figures are not asserted: they
// belong to docs/performance.md).
func TestSendBenchCommand(t *testing.T) {
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	peer := `echo "minimal HTTP send: 1000 ok, 0 failed, 2000/s, p50 1.5ms, p99 4ms"`
	profile := filepath.Join(t.TempDir(), "http.prof")
	code, out := runCLI(t, []string{"IMSHARD_REDIS_KEY_PREFIX=bench:"}, "--config", cfg, "bench", "send", "--tenant", tenant,
		"--concurrency=2", "--duration=500ms", "--warmup=0s", "--topics=2", "--pairs=2", "--rate=50", "--peer", peer,
		"--profile-http", profile)
	for _, want := range []string{"HTTP / reference send = rate ", "HTTP / peer (--peer) = rate ", "raw allocation (FCALL)",
		"only 2 rounds", "Redis memory per idempotency record, HTTP send", "open loop", "median"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("bench send: exit %d, want %q in\n%s", code, want, out)
		}
	}
	if st, err := os.Stat(profile); err != nil || st.Size() == 0 {
		t.Fatalf("--profile-http wrote no profile: %v", err)
	}
	// the bench's own tenant is dropped: no Redis key of it is left, under
	// the prefix or outside it
	rdb := testenv.RedisClient(t, testenv.RedisAddr())
	var left []string
	for cursor := uint64(0); ; {
		e, err := rdb.Do(context.Background(), rdb.B().Scan().Cursor(cursor).Match("*im:{"+tenant+"}:*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatal(err)
		}
		if left = append(left, e.Elements...); e.Cursor == 0 {
			break
		}
		cursor = e.Cursor
	}
	if len(left) > 0 {
		t.Fatalf("bench send left %d keys of its tenant: %.5q", len(left), left)
	}
	for _, bad := range [][]string{{"--concurrency=0"}, {"--rate=fast"}, {"--pairs=0"}, {"--profile-http=a", "--cpuprofile=b"}} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg, "bench", "send"}, bad...)...); code != 2 {
			t.Fatalf("bench send %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
}
