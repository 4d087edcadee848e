package test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"

	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/message"
)

// TestQueryBenchHotFixtureAsSent: the hot topics of the query and inbox
// benches hold in Redis what a send leaves for a topic — its hot cache,
// seq counter and both versions, the message version with a lifetime as a
// send gives it — so their pages take a sent topic's path: over the read
// process's copy of the newest messages, which it keeps only under a
// message version Redis holds. Without the versions every page parsed the
// whole hot cache again, a path no sent topic takes, and the bench's
// hot-cache page measured that.
func TestQueryBenchHotFixtureAsSent(t *testing.T) {
	t.Parallel()
	env, reader, tok := rpCopyReader(t, "sent")
	rpGroup(t, env, "filled")
	for _, text := range []string{"one", "two", "three"} {
		rpPost(t, env, tok, "sent", "cmid-"+text, text)
	}
	ctx := context.Background()
	keys := env.Keys()
	var ms []message.Message
	for seq := int64(1); seq <= 3; seq++ {
		ms = append(ms, message.Message{Topic: "filled", Seq: seq, MessageID: message.ID(seq), Status: "normal", MsgType: "text",
			Content: json.RawMessage(`{"text":"bench"}`), Version: 1}.Normalized())
	}
	for _, r := range env.Redis.DoMulti(ctx, bench.HotFill(env.Redis, keys, "filled", ms, 3)...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	// -2: no key, -1: no lifetime, otherwise ms left
	pttl := func(key string) int64 {
		ms, err := env.Redis.Do(ctx, env.Redis.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	for _, c := range []struct {
		name     string
		key      func(string) string
		lifetime bool // whether the two must agree on having one
	}{
		{"message version", keys.MessagesVersion, true},
		{"deletion-range version", keys.HiddenVersion, true},
		{"hot cache", keys.HotMessages, false},
		{"seq counter", keys.Seq, false},
	} {
		sent, filled := pttl(c.key("sent")), pttl(c.key("filled"))
		switch {
		case sent == -2:
			t.Fatalf("%s: a send left none", c.name)
		case filled == -2:
			t.Fatalf("%s: the bench's fill left none where a send leaves one", c.name)
		case c.lifetime && (sent > 0) != (filled > 0):
			t.Fatalf("%s: PTTL %d after a send, %d after the bench's fill", c.name, sent, filled)
		}
	}
	latest := func() []int64 {
		return rpList(t, reader, rpMember, "filled", url.Values{"limit": {"2"}}).seqs()
	}
	for range 4 {
		rpExpect(t, "the latest page of a filled topic", latest(), rpDesc(2, 3))
	}
	if hits := rpMetric(t, reader, "imshard_query_hot_local_total", "result=hit"); hits < 3 {
		t.Fatalf("%v of the 3 pages after the first read over the process's copy", hits)
	}
}
