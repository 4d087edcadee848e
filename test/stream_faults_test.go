package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// stFollow reads c's frames of one topic until its cursor reaches last:
// seqs must ascend (a seq left out is one storage proved holds nothing
// visible: a gap frame, or a range the allocator skipped when it seeded a
// counter again), so nothing is repeated; it returns the seqs received as
// messages, which the caller compares with what was sent.
func stFollow(t *testing.T, c *stClient, cursor, last int64) []int64 {
	t.Helper()
	var got []int64
	for cursor < last {
		f, err := c.next()
		if err != nil {
			t.Fatalf("at cursor %d of %d: %v", cursor, last, err)
		}
		switch f.Type {
		case "message":
			if f.Message.Seq <= cursor {
				t.Fatalf("message seq %d after cursor %d", f.Message.Seq, cursor)
			}
			cursor = f.Message.Seq
			got = append(got, cursor)
		case "gap":
			if f.From <= cursor || f.To < f.From {
				t.Fatalf("gap %d-%d after cursor %d", f.From, f.To, cursor)
			}
			cursor = f.To
		case "live", "change":
		default:
			t.Fatalf("frame %+v at cursor %d", f, cursor)
		}
	}
	return got
}

// The hub's Redis restarts empty (a crash without persistence): the
// process subscribes again, and every socket reads what it may have
// missed meanwhile from storage, so the messages sent right after the
// restart — before the hub's new SSUBSCRIBE, when their SPUBLISH reached
// nobody — arrive in order, each once, on single- and multi-topic sockets.
func TestStreamRedisRestart(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Redis.Addrs = []string{rs.Addr} }})
	e.group("phoenix", 7, "active")
	e.member("phoenix", 1, "member", time.Time{})
	e.member("phoenix", 2, "member", time.Time{})
	alice, bob := e.Token(1, ""), e.Token(2, "")
	single := stMustDial(t, e.Env, "/v1/topics/phoenix/stream?since=0", bob)
	single.must("live")
	multi := stMustDial(t, e.Env, "/v1/stream?topics=phoenix", bob)
	multi.must("live")
	first := e.mustSend(alice, "phoenix", sendBody("before", "before the restart"))
	for _, c := range []*stClient{single, multi} {
		if f := c.must("message"); f.Message.Seq != first.Seq {
			t.Fatalf("message frame %+v", f.Message)
		}
	}
	// stored, so the restarted Redis seeds the topic's counter above it
	chWaitSettled(t, e.Env, "phoenix")
	resubscribed := rpMetric(t, e.Env, "imshard_stream_resubscribes_total")

	rs.Kill()
	// down long enough for the hub's resubscription backoff to grow past
	// a second, so the sends below reach the restarted Redis before it
	// subscribes again
	time.Sleep(2 * time.Second)
	rs.Start()
	const total = 3
	var sent []int64
	for i := range total {
		var r sendResp
		sendWaitFor(t, 30*time.Second, "a send after the restart", func() bool {
			var code int
			code, r = e.send(alice, "phoenix", sendBody(fmt.Sprintf("after%d", i), "after the restart"))
			return code == 201
		})
		sent = append(sent, r.Seq)
	}
	last := sent[len(sent)-1]
	if n := rpMetric(t, e.Env, "imshard_stream_resubscribes_total"); n > resubscribed {
		// still correct below, but the window was not hit this time
		t.Logf("the hub subscribed again before the last send")
	}
	for name, c := range map[string]*stClient{"single": single, "multi": multi} {
		got := stFollow(t, c, first.Seq, last)
		if fmt.Sprint(got) != fmt.Sprint(sent) {
			t.Fatalf("%s socket received %v, sent %v", name, got, sent)
		}
	}
	if n := rpMetric(t, e.Env, "imshard_stream_resubscribes_total"); n <= resubscribed {
		t.Fatalf("imshard_stream_resubscribes_total %v, want above %v", n, resubscribed)
	}
	// and live delivery goes on over the new subscription
	r := e.mustSend(alice, "phoenix", sendBody("later", "live again"))
	for _, c := range []*stClient{single, multi} {
		if got := stFollow(t, c, last, r.Seq); len(got) != 1 || got[0] != r.Seq {
			t.Fatalf("after the resubscription: %v, want [%d]", got, r.Seq)
		}
	}
}

// A client whose changes_since is older than the change history the
// server keeps for it — more than stream.max_catchup_changes behind, or
// behind revisions that are gone — gets a reset frame with the topic's
// last change_seq instead of a partial list; within the history it gets
// the changes themselves.
func TestStreamResetBeyondChangeHistory(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Stream.MaxCatchupChanges = 2 }})
	e.group("edits", 7, "active")
	e.member("edits", 1, "member", time.Time{})
	alice := e.Token(1, "")
	for i := range 4 {
		e.mustSend(alice, "edits", sendBody(fmt.Sprintf("e%d", i), "x"))
	}
	chWaitSettled(t, e.Env, "edits")
	for seq := int64(1); seq <= 4; seq++ {
		if code, _ := chRecall(t, e.Env, alice, "edits", seq, nil); code != 200 {
			t.Fatalf("recall %d: %d", seq, code)
		}
	}
	// 4 changes missed, 2 kept for a catch-up
	c := stMustDial(t, e.Env, "/v1/topics/edits/stream?since=4&changes_since=0", alice)
	if f := c.must("reset"); f.Topic != "edits" || f.ChangeSeq != 4 {
		t.Fatalf("reset frame %+v", f)
	}
	if f := c.must("live"); f.Seq != 4 || f.ChangeSeq != 4 {
		t.Fatalf("live frame %+v", f)
	}
	// within the window: the changes
	c = stMustDial(t, e.Env, "/v1/topics/edits/stream?since=4&changes_since=2", alice)
	for cs := int64(3); cs <= 4; cs++ {
		if f := c.must("change"); f.Change.ChangeSeq != cs || f.Change.Seq != cs {
			t.Fatalf("change frame %+v, want change_seq %d", f.Change, cs)
		}
	}
	c.must("live")

	// the revisions up to change_seq 3 are gone (pruned by an operator):
	// a cursor at 1 cannot be continued from the history, though the
	// backlog is within the window
	if _, err := e.DB.Exec("DELETE FROM im_message_revisions WHERE topic = ? AND change_seq <= 3", "edits"); err != nil {
		t.Fatal(err)
	}
	c = stMustDial(t, e.Env, "/v1/topics/edits/stream?since=4&changes_since=2", alice)
	if f := c.must("reset"); f.ChangeSeq != 4 {
		t.Fatalf("frame %+v, want a reset to change_seq 4", f)
	}
	c.must("live")
	// the same on a multi-topic socket's subscribe
	m := stMustDial(t, e.Env, "/v1/stream", alice)
	m.write(map[string]any{"type": "subscribe", "topics": map[string]any{"edits": map[string]any{"since": 4, "changes_since": 1}}})
	if f := m.must("reset"); f.Topic != "edits" || f.ChangeSeq != 4 {
		t.Fatalf("reset frame %+v", f)
	}
	if f := m.must("live"); f.ChangeSeq != 4 {
		t.Fatalf("live frame %+v", f)
	}
	// a cursor at the last remaining revision's predecessor continues
	c = stMustDial(t, e.Env, "/v1/topics/edits/stream?since=4&changes_since=3", alice)
	if f := c.must("change"); f.Change.ChangeSeq != 4 {
		t.Fatalf("change frame %+v", f.Change)
	}
	c.must("live")
}

// A membership re-check that fails (MySQL cannot be read) is made again,
// after a growing pause, until it answers: meanwhile the socket keeps its topic and receives
// (the caller was a member at the last answer), and a removal made while
// the check failed — with no further membership event to announce it —
// still ends the delivery once the check can be made.
func TestStreamMembershipRecheckRetried(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Stream.ACLCheckInterval = 100 * time.Millisecond }})
	e.group("vault", 7, "active")
	e.member("vault", 1, "member", time.Time{})
	e.member("vault", 2, "member", time.Time{})
	alice, bob := e.Token(1, ""), e.Token(2, "")
	c := stMustDial(t, e.Env, "/v1/topics/vault/stream", bob)
	c.must("live")
	r := e.mustSend(alice, "vault", sendBody("m1", "x")) // alice's membership is cached from here on
	if f := c.must("message"); f.Message.Seq != r.Seq {
		t.Fatalf("frame %+v", f.Message)
	}

	// bob's membership can be read neither from the cache nor from MySQL,
	// and the topic's memberships are announced as changed
	ctx := context.Background()
	keys := e.Keys()
	if _, err := e.DB.Exec("RENAME TABLE im_group_members TO im_group_members_away"); err != nil {
		t.Fatal(err)
	}
	renamed := true
	t.Cleanup(func() {
		if renamed {
			_, _ = e.DB.Exec("RENAME TABLE im_group_members_away TO im_group_members")
		}
	})
	for _, cmd := range []func() error{
		func() error {
			return e.Redis.Do(ctx, e.Redis.B().Hdel().Key(keys.Members("vault")).Field("2").Build()).Error()
		},
		func() error { return e.Redis.Do(ctx, e.Redis.B().Incr().Key(keys.ACLVersion("vault")).Build()).Error() },
	} {
		if err := cmd(); err != nil {
			t.Fatal(err)
		}
	}
	sendWaitFor(t, 20*time.Second, "a failed membership re-check", func() bool {
		return rpMetric(t, e.Env, "imshard_stream_acl_check_errors_total") >= 3 // failed, and failed again
	})
	// retried after a growing pause (50 ms doubling up to 2 s), not every
	// 50 ms: a few retries in 3 s, where a fixed 50 ms would make 60
	before := rpMetric(t, e.Env, "imshard_stream_acl_check_errors_total")
	time.Sleep(3 * time.Second)
	if n := rpMetric(t, e.Env, "imshard_stream_acl_check_errors_total") - before; n < 1 || n > 8 {
		t.Fatalf("%v failed re-checks in 3 s, want a few (backing off, still retrying)", n)
	}
	// not dropped: still delivering
	r = e.mustSend(alice, "vault", sendBody("m2", "while the check fails"))
	if f := c.must("message"); f.Message.Seq != r.Seq {
		t.Fatalf("frame %+v", f.Message)
	}
	// removed behind the stream's back, then readable again: the retried
	// check (not a new event) ends the delivery
	if _, err := e.DB.Exec("DELETE FROM im_group_members_away WHERE topic = ? AND user_id = 2", "vault"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.Exec("RENAME TABLE im_group_members_away TO im_group_members"); err != nil {
		t.Fatal(err)
	}
	renamed = false
	if f := c.must("error"); f.Topic != "vault" || f.Code != "permission_denied" {
		t.Fatalf("error frame %+v", f)
	}
	if code, reason := c.closed(); code != websocket.StatusPolicyViolation || reason != "permission denied" {
		t.Fatalf("closed with %d %q, want 1008 permission denied", code, reason)
	}
}
