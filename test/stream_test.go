package test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// A member following a topic receives another member's messages in seq
// order and their recall as a change; a non-member is refused before the
// upgrade.
func TestStreamDeliversMessagesAndChanges(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	e.member("room", 2, "member", time.Time{})
	alice, bob := e.Token(1, ""), e.Token(2, "")

	if _, status, err := stDial(t, e.Env, "/v1/topics/room/stream", e.Token(3, ""), 0); err == nil || status != 403 {
		t.Fatalf("non-member: status %d, err %v; want 403 before the upgrade", status, err)
	}
	if _, status, err := stDial(t, e.Env, "/v1/topics/room/stream?since=-1", bob, 0); err == nil || status != 400 {
		t.Fatalf("since=-1: status %d, err %v; want 400", status, err)
	}

	c := stMustDial(t, e.Env, "/v1/topics/room/stream?since=0&changes_since=0", bob)
	if f := c.must("live"); f.Topic != "room" || f.Seq != 0 || f.ChangeSeq != 0 {
		t.Fatalf("live frame %+v", f)
	}
	for i := range 3 {
		e.mustSend(alice, "room", sendBody(fmt.Sprintf("c%d", i), fmt.Sprintf("hello %d", i)))
	}
	for seq := int64(1); seq <= 3; seq++ {
		f := c.must("message")
		if f.Message.Seq != seq || f.Message.Topic != "room" || f.Message.FromUser != 1 {
			t.Fatalf("frame %d: %+v", seq, f.Message)
		}
	}
	chWaitSettled(t, e.Env, "room")
	if code, _ := chRecall(t, e.Env, alice, "room", 2, nil); code != 200 {
		t.Fatalf("recall: %d", code)
	}
	f := c.must("change")
	if f.Change.Seq != 2 || f.Change.Action != "recall" || f.Change.ChangeSeq != 1 || f.Change.Version != 2 {
		t.Fatalf("change frame %+v", f.Change)
	}

	// a reconnect with the cursors it holds gets nothing again; one from
	// before the change gets the change from the revisions
	c2 := stMustDial(t, e.Env, "/v1/topics/room/stream?since=3&changes_since=1", bob)
	if f := c2.must("live"); f.Seq != 3 || f.ChangeSeq != 1 {
		t.Fatalf("live frame %+v", f)
	}
	c3 := stMustDial(t, e.Env, "/v1/topics/room/stream?since=1&changes_since=0", bob)
	if f := c3.must("message"); f.Message.Seq != 2 || f.Message.Status != "recalled" {
		t.Fatalf("caught-up message %+v", f.Message)
	}
	if f := c3.must("message"); f.Message.Seq != 3 {
		t.Fatalf("caught-up message %+v", f.Message)
	}
	if f := c3.must("change"); f.Change.ChangeSeq != 1 || f.Change.Seq != 2 || f.Change.Action != "recall" {
		t.Fatalf("caught-up change %+v", f.Change)
	}
	c3.must("live")
	// without cursors: live from the topic's last seq and change_seq
	if f := stMustDial(t, e.Env, "/v1/topics/room/stream", bob).must("live"); f.Seq != 3 || f.ChangeSeq != 1 {
		t.Fatalf("live frame %+v, want seq 3 change_seq 1", f)
	}
}

// Clients that drop and resume with their cursor while another member
// sends without pause see every seq exactly once, in order.
func TestStreamResumeWithoutSeam(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("busy", 7, "active")
	e.member("busy", 1, "member", time.Time{})
	e.member("busy", 2, "member", time.Time{})
	alice, bob := e.Token(1, ""), e.Token(2, "")
	const total = 120

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range total {
			e.mustSend(alice, "busy", sendBody(fmt.Sprintf("m%d", i), "x"))
		}
	}()
	var cursor int64
	var got []int64
	for round := 0; cursor < total; round++ {
		c := stMustDial(t, e.Env, fmt.Sprintf("/v1/topics/busy/stream?since=%d", cursor), bob)
		// each round reads a handful of frames and drops the socket
		for n := 0; n < 15 || round >= 12; n++ {
			f, err := c.next()
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			switch f.Type {
			case "message":
				if f.Message.Seq != cursor+1 {
					t.Fatalf("round %d: seq %d after %d", round, f.Message.Seq, cursor)
				}
				cursor = f.Message.Seq
				got = append(got, cursor)
			case "gap":
				if f.From != cursor+1 {
					t.Fatalf("round %d: gap %d-%d after %d", round, f.From, f.To, cursor)
				}
				cursor = f.To
			case "live":
				if f.Seq != cursor {
					t.Fatalf("round %d: live at %d, cursor %d", round, f.Seq, cursor)
				}
			default:
				t.Fatalf("round %d: frame %+v", round, f)
			}
			if cursor >= total {
				break
			}
		}
		_ = c.ws.Close(websocket.StatusNormalClosure, "")
	}
	wg.Wait()
	if len(got) != total {
		t.Fatalf("got %d messages, want %d", len(got), total)
	}
}

// A member removed from the group stops receiving: an error frame, and
// the single-topic socket ends with 1008.
func TestStreamMemberRemoved(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("club", 7, "active")
	e.member("club", 1, "member", time.Time{})
	e.member("club", 2, "member", time.Time{})
	c := stMustDial(t, e.Env, "/v1/topics/club/stream", e.Token(2, ""))
	c.must("live")
	if code, body := e.Do("DELETE", "/v1/topics/club/members/2", e.svc, nil); code != 204 {
		t.Fatalf("remove member: %d %s", code, body)
	}
	if f := c.must("error"); f.Topic != "club" || f.Code != "permission_denied" {
		t.Fatalf("error frame %+v", f)
	}
	if code, reason := c.closed(); code != websocket.StatusPolicyViolation || reason != "permission denied" {
		t.Fatalf("closed with %d %q, want 1008", code, reason)
	}
}

// One socket follows several topics; a topic the caller may not read is
// an error frame and the others go on.
func TestStreamManyTopics(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	for _, topic := range []string{"a", "b", "c"} {
		e.group(topic, 7, "active")
		e.member(topic, 1, "member", time.Time{})
	}
	e.member("a", 2, "member", time.Time{})
	e.member("b", 2, "member", time.Time{})
	alice, bob := e.Token(1, ""), e.Token(2, "")
	e.mustSend(alice, "b", sendBody("b0", "early"))

	c := stMustDial(t, e.Env, "/v1/stream?topics=a", bob)
	c.must("live")
	c.write(map[string]any{"type": "subscribe", "topics": map[string]any{"b": map[string]any{"since": 0}, "c": map[string]any{"since": 0}}})
	seen := map[string]bool{}
	for len(seen) < 3 {
		f, err := c.next()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case f.Type == "message" && f.Message.Topic == "b" && f.Message.Seq == 1:
			seen["b1"] = true
		case f.Type == "live" && f.Topic == "b":
			seen["b live"] = true
		case f.Type == "error" && f.Topic == "c" && f.Code == "permission_denied":
			seen["c denied"] = true
		default:
			t.Fatalf("frame %+v", f)
		}
	}
	e.mustSend(alice, "c", sendBody("c1", "hidden"))
	e.mustSend(alice, "a", sendBody("a1", "to a"))
	if f := c.must("message"); f.Message.Topic != "a" || f.Message.Seq != 1 {
		t.Fatalf("frame %+v", f.Message)
	}
	c.write(map[string]any{"type": "unsubscribe", "topics": []string{"a"}})
	c.write(map[string]any{"type": "pong"})
	e.mustSend(alice, "a", sendBody("a2", "not followed"))
	e.mustSend(alice, "b", sendBody("b2", "to b"))
	if f := c.must("message"); f.Message.Topic != "b" || f.Message.Seq != 2 {
		t.Fatalf("frame %+v (a was unsubscribed)", f.Message)
	}
}

// A subscribe frame naming more topics than a socket may follow is refused
// whole with one error frame, before any topic is read or joined.
func TestStreamSubscribeFrameCapped(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Stream.MaxTopics = 3 }})
	e.group("a", 7, "active")
	e.member("a", 1, "member", time.Time{})
	c := stMustDial(t, e.Env, "/v1/stream?topics=a", e.Token(1, ""))
	c.must("live")
	topics := map[string]any{}
	for i := range 5000 {
		topics[fmt.Sprintf("t%d", i)] = map[string]any{"since": 0}
	}
	catchups := rpMetric(t, e.Env, "imshard_stream_catchups_total")
	c.write(map[string]any{"type": "subscribe", "topics": topics})
	f := c.must("error")
	if f.Code != "invalid_argument" || f.Topic != "" || !strings.Contains(f.Detail, "max_topics") {
		t.Fatalf("error frame %+v", f)
	}
	// the socket goes on, and nothing of the frame was followed or read
	c.write(map[string]any{"type": "subscribe", "topics": map[string]any{"a": map[string]any{"since": 0}}})
	e.mustSend(e.Token(1, ""), "a", sendBody("a1", "after"))
	if f := c.must("message"); f.Message.Topic != "a" || f.Message.Seq != 1 {
		t.Fatalf("frame %+v", f.Message)
	}
	if got := rpMetric(t, e.Env, "imshard_stream_catchups_total"); got != catchups {
		t.Fatalf("the refused frame made %v catch-ups", got-catchups)
	}
}

// A client that stops reading is cut off with 1008 "slow consumer" once
// its send queue is full; what it had not read is dropped, not kept.
func TestStreamSlowConsumer(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Stream.SendQueue = 4 }})
	e.group("fire", 7, "active")
	e.member("fire", 1, "member", time.Time{})
	e.member("fire", 2, "member", time.Time{})
	alice := e.Token(1, "")
	c, status, err := stDial(t, e.Env, "/v1/topics/fire/stream", e.Token(2, ""), 4096)
	if err != nil {
		t.Fatalf("dial: %d %v", status, err)
	}
	c.must("live")
	big := strings.Repeat("x", 60_000)
	for i := 0; rpMetric(t, e.Env, "imshard_stream_slow_consumer_closes_total") == 0; i++ {
		if i == 500 {
			t.Fatal("500 large messages did not fill the socket")
		}
		e.mustSend(alice, "fire", sendBody(fmt.Sprintf("big%d", i), big))
	}
	if code, reason := c.closed(); code != websocket.StatusPolicyViolation || reason != "slow consumer" {
		t.Fatalf("closed with %d %q, want 1008 slow consumer", code, reason)
	}
}

// On Redis Cluster the stream subscribes with SSUBSCRIBE on the node that
// owns the channel's slot, where send and the change path publish.
func TestStreamRedisCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartRedisCluster(t, 3)
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Redis.Addrs = addrs }})
	e.group("ring", 7, "active")
	e.member("ring", 1, "member", time.Time{})
	e.member("ring", 2, "member", time.Time{})
	c := stMustDial(t, e.Env, "/v1/topics/ring/stream?since=0", e.Token(2, ""))
	c.must("live")
	r := e.mustSend(e.Token(1, ""), "ring", sendBody("r1", "over the cluster"))
	if f := c.must("message"); f.Message.Seq != r.Seq || f.Message.MessageID != r.MessageID {
		t.Fatalf("frame %+v, sent %+v", f.Message, r)
	}
}

// Browsers pass the token as ?access_token=; it authenticates the stream
// like the header and never reaches a log line. A shutdown closes the
// socket with 1001.
func TestStreamAccessToken(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	log := zerolog.New(&logs).Level(zerolog.DebugLevel)
	e := stStart(t, harness.Options{Log: &log})
	e.group("door", 7, "active")
	e.member("door", 2, "member", time.Time{})
	tok := e.Token(2, "")
	c := stMustDial(t, e.Env, "/v1/topics/door/stream?access_token="+tok, "")
	c.must("live")
	if _, status, _ := stDial(t, e.Env, "/v1/topics/door/stream?access_token="+tok+"x", "", 0); status != 401 {
		t.Fatalf("bad access_token: %d, want 401", status)
	}
	if _, status, _ := stDial(t, e.Env, "/v1/topics/door/stream?access_token="+e.Token(3, ""), "", 0); status != 403 {
		t.Fatalf("non-member access_token: %d, want 403", status)
	}
	if code, body := e.Do("GET", "/v1/topics/door/stream", tok, nil); code != 400 || !strings.Contains(string(body), "invalid_argument") {
		t.Fatalf("plain GET: %d %s, want 400", code, body)
	}
	// a shutdown closes the socket with 1001
	closed := make(chan websocket.StatusCode, 1)
	go func() { code, _ := c.closed(); closed <- code }()
	e.Stop()
	if code := <-closed; code != websocket.StatusGoingAway {
		t.Fatalf("socket closed with %d at shutdown, want 1001", code)
	}
	if strings.Contains(logs.String(), tok[len(tok)-20:]) {
		t.Fatal("the access token appears in the log")
	}
	if !strings.Contains(logs.String(), "shutdown") {
		t.Fatal("the log captured nothing: the check above proves nothing")
	}
}

// A read-cursor move reaches the mover's sockets as a read frame, on a
// socket following the topic and on one following another topic alike; a
// move that raises nothing sends none; another member's socket gets none.
func TestStreamReadFrames(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{Roles: []string{"all"}})
	for _, topic := range []string{"room", "other"} {
		e.group(topic, 8, "active")
		e.member(topic, 1, "member", time.Time{})
		e.member(topic, 2, "member", time.Time{})
	}
	alice, bob := e.Token(1, ""), e.Token(2, "")
	phone := stMustDial(t, e.Env, "/v1/stream?topics=room", bob)
	phone.must("live")
	tablet := stMustDial(t, e.Env, "/v1/stream?topics=other", bob)
	tablet.must("live")
	watcher := stMustDial(t, e.Env, "/v1/stream?topics=room", alice)
	watcher.must("live")
	for i := range 3 {
		e.mustSend(alice, "room", sendBody(fmt.Sprintf("r%d", i), "hi"))
	}
	for range 3 {
		phone.must("message")
		watcher.must("message")
	}
	for _, seq := range []int64{2, 1, 3} { // the move to 1 raises nothing
		if code, body := e.Do("PUT", "/v1/topics/room/read", bob, map[string]any{"seq": seq}); code != 200 {
			t.Fatalf("read %d: %d %s", seq, code, body)
		}
	}
	for _, c := range []*stClient{phone, tablet} {
		for _, want := range []int64{2, 3} {
			if f := c.must("read"); f.Topic != "room" || f.Seq != want {
				t.Fatalf("read frame %+v, want room %d", f, want)
			}
		}
	}
	e.mustSend(bob, "room", sendBody("r-bob", "hi"))
	if f := watcher.must("message"); f.Message.FromUser != 2 {
		t.Fatalf("another member's socket: %+v", f)
	}
}
