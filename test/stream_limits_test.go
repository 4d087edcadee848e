package test

import (
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/test/harness"
)

// A live message whose lower seq is still in flight is held: once the
// lower seq is recorded as a gap, the socket sends the gap, then the
// message — never the message first.
func TestStreamHoldsUntilGap(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("hold", 7, "active")
	e.member("hold", 1, "member", time.Time{})
	e.member("hold", 2, "member", time.Time{})
	c := stMustDial(t, e.Env, "/v1/topics/hold/stream?since=0", e.Token(2, ""))
	c.must("live")
	ctx := context.Background()
	a, err := e.App.Allocator().Allocate(ctx, e.Tenant, "hold") // in flight, never sent
	if err != nil || a.Seq != 1 {
		t.Fatalf("allocate: %+v %v", a, err)
	}
	r := e.mustSend(e.Token(1, ""), "hold", sendBody("after", "after the hole"))
	if r.Seq != 2 {
		t.Fatalf("sent seq %d, want 2", r.Seq)
	}
	if err := e.App.Flight().RecordGap(ctx, e.Tenant, "hold", 1); err != nil {
		t.Fatal(err)
	}
	if f := c.must("gap"); f.Topic != "hold" || f.From != 1 || f.To != 1 {
		t.Fatalf("gap frame %+v", f)
	}
	if f := c.must("message"); f.Message.Seq != 2 || f.Message.MessageID != r.MessageID {
		t.Fatalf("message frame %+v", f.Message)
	}
}

// stream.max_connections refuses one socket more with 503; a socket ends
// with 1008 "token expired" at its token's exp, and with 1008 "idle
// timeout" when its peer answers no ping.
func TestStreamLimits(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) {
		c.Stream.MaxConnections = 2
		c.Stream.PingInterval = 100 * time.Millisecond
		c.Stream.IdleTimeout = 300 * time.Millisecond
	}})
	e.group("lim", 7, "active")
	e.member("lim", 2, "member", time.Time{})
	short, err := httpapi.Sign(e.Secret, e.Tenant, 2, "", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	expiring := stMustDial(t, e.Env, "/v1/topics/lim/stream", short)
	expiring.must("live")
	// it reads (and so answers pings) until its token expires
	type end struct {
		code   websocket.StatusCode
		reason string
	}
	expired := make(chan end, 1)
	go func() { code, reason := expiring.closed(); expired <- end{code, reason} }()
	quiet := stMustDial(t, e.Env, "/v1/topics/lim/stream", e.Token(2, ""))
	if _, status, err := stDial(t, e.Env, "/v1/topics/lim/stream", e.Token(2, ""), 0); err == nil || status != 503 {
		t.Fatalf("third socket: %d %v, want 503", status, err)
	}
	// the quiet client reads nothing, so it answers no ping
	sendWaitFor(t, 20*time.Second, "the idle close", func() bool {
		return rpMetric(t, e.Env, "imshard_stream_closes_total", "reason=idle timeout") > 0
	})
	if code, reason := quiet.closed(); code != websocket.StatusPolicyViolation || reason != "idle timeout" {
		t.Fatalf("quiet socket closed with %d %q", code, reason)
	}
	if x := <-expired; x.code != websocket.StatusPolicyViolation || x.reason != "token expired" {
		t.Fatalf("expiring socket closed with %d %q", x.code, x.reason)
	}
}

// A socket opened without since while seq 1 is still in flight (issued and
// acknowledged, not stored yet) starts at the settled watermark, not at
// the last issued seq: its live frame names 0, so a client resuming from
// it never passes seq 1, and seq 1 is delivered once stored, before the
// next message.
func TestStreamWithoutSinceDeliversTheSeqInFlight(t *testing.T) {
	t.Parallel()
	e := stStart(t, harness.Options{})
	e.group("flying", 7, "active")
	e.member("flying", 1, "member", time.Time{})
	e.member("flying", 2, "member", time.Time{})
	ctx := context.Background()
	a, err := e.App.Allocator().Allocate(ctx, e.Tenant, "flying")
	if err != nil || a.Seq != 1 {
		t.Fatalf("allocate: %+v %v", a, err)
	}
	if err := e.App.Flight().MarkAcked(ctx, e.Tenant, "flying", a.Seq); err != nil {
		t.Fatal(err)
	}
	c := stMustDial(t, e.Env, "/v1/topics/flying/stream", e.Token(2, ""))
	if f := c.must("live"); f.Seq != 0 {
		t.Fatalf("live at seq %d: the resume cursor passed seq 1, still in flight", f.Seq)
	}
	// persist stores it: the socket reads it from storage
	rpInsert(t, e.Env, "flying", a.Month, rpRow{seq: 1})
	rpSyncRoute(t, e.Env, "flying")
	if err := e.App.Flight().MarkPersisted(ctx, e.Tenant, "flying", a.Seq); err != nil {
		t.Fatal(err)
	}
	if f := c.must("message"); f.Message.Seq != 1 {
		t.Fatalf("message frame %+v, want seq 1", f.Message)
	}
	r := e.mustSend(e.Token(1, ""), "flying", sendBody("next", "after the one in flight"))
	if f := c.must("message"); f.Message.Seq != 2 || f.Message.MessageID != r.MessageID {
		t.Fatalf("message frame %+v, want seq 2", f.Message)
	}
}
