package test

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// Helpers of the message-change tests (recall, edit, delete for everyone):
// every change goes through the HTTP API.

// chResult is the answer of a change, or its error envelope.
type chResult struct {
	Message   message.Message `json:"message"`
	ChangeSeq int64           `json:"change_seq"`
	Error     struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	} `json:"error"`
}

func chDecode(t testing.TB, body []byte) chResult {
	t.Helper()
	var r chResult
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("change answer: %v\n%s", err, body)
	}
	return r
}

func chSeqPath(topic string, seq int64) string {
	return "/v1/topics/" + topic + "/messages/" + strconv.FormatInt(seq, 10)
}

// chRecall recalls (topic, seq) with token; body may be nil.
func chRecall(t testing.TB, env *harness.Env, token, topic string, seq int64, body any) (int, chResult) {
	t.Helper()
	code, out := env.Do("POST", chSeqPath(topic, seq)+"/recall", token, body)
	return code, chDecode(t, out)
}

// chDeleteAll deletes (topic, seq) for everyone with token.
func chDeleteAll(t testing.TB, env *harness.Env, token, topic string, seq int64, reason string) (int, chResult) {
	t.Helper()
	q := url.Values{"scope": {"all"}}
	if reason != "" {
		q.Set("reason", reason)
	}
	code, out := env.Do("DELETE", chSeqPath(topic, seq)+"?"+q.Encode(), token, nil)
	return code, chDecode(t, out)
}

// chEdit edits (topic, seq) with token: body is sent as it is.
func chEdit(t testing.TB, env *harness.Env, token, topic string, seq int64, body any) (int, chResult) {
	t.Helper()
	code, out := env.Do("PATCH", chSeqPath(topic, seq), token, body)
	return code, chDecode(t, out)
}

// chEditBody is a valid edit body setting the text.
func chEditBody(text string, expected int) map[string]any {
	return map[string]any{"content": map[string]any{"text": text}, "expected_version": expected}
}

// chText is the text of a message's content ("" for a tombstone).
func chText(m message.Message) string {
	var c struct{ Text string }
	_ = json.Unmarshal(m.Content, &c)
	return c.Text
}

// chRevision is one im_message_revisions row.
type chRevision struct {
	action, reason, month string
	version               int
	content               string
	actor, changeSeq      int64
}

// chRevisions reads the revision rows of (topic, seq) in change order.
func chRevisions(t testing.TB, env *harness.Env, topic string, seq int64) []chRevision {
	t.Helper()
	rows, err := sq.Select("action", "COALESCE(reason, '')", "COALESCE(shard_month, '')", "version", "COALESCE(content, '')", "actor", "change_seq").
		From("im_message_revisions").Where(sq.Eq{"topic": topic, "seqid": seq}).OrderBy("change_seq").
		RunWith(env.DB).QueryContext(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []chRevision
	for rows.Next() {
		var r chRevision
		if err := rows.Scan(&r.action, &r.reason, &r.month, &r.version, &r.content, &r.actor, &r.changeSeq); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// chCount counts the rows of a table of the tenant matching where.
func chCount(t testing.TB, env *harness.Env, table string, where sq.Eq) int {
	t.Helper()
	var n int
	if err := sq.Select("COUNT(*)").From(table).Where(where).RunWith(env.DB).QueryRowContext(context.Background()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// chWaitSettled waits until nothing of topic is in flight (every sent
// message stored).
func chWaitSettled(t *testing.T, env *harness.Env, topic string) {
	t.Helper()
	keys := env.Keys()
	sendWaitFor(t, 30*time.Second, topic+" stored", func() bool {
		n, err := env.Redis.Do(context.Background(), env.Redis.B().Zcard().Key(keys.Pending(topic)).Build()).AsInt64()
		return err == nil && n == 0
	})
}

// chHot lists the members of topic's hot cache.
func chHot(t testing.TB, env *harness.Env, topic string) []rueidis.ZScore {
	t.Helper()
	keys := env.Keys()
	zs, err := env.Redis.Do(context.Background(), env.Redis.B().Zrange().Key(keys.HotMessages(topic)).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatal(err)
	}
	return zs
}

// chSubscribe follows topic's realtime channel; the returned channel gets
// every change event published from now on.
func chSubscribe(t *testing.T, env *harness.Env, topic string) <-chan message.Change {
	t.Helper()
	keys := env.Keys()
	ch := keys.Realtime(topic)
	out := make(chan message.Change, 64)
	probes := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = env.Redis.Receive(ctx, env.Redis.B().Ssubscribe().Channel(ch).Build(), func(m rueidis.PubSubMessage) {
			if m.Message == "probe" {
				select {
				case probes <- struct{}{}:
				default:
				}
				return
			}
			var ev struct {
				Type   string         `json:"type"`
				Change message.Change `json:"change"`
			}
			if json.Unmarshal([]byte(m.Message), &ev) == nil && ev.Type == "change" {
				out <- ev.Change
			}
		})
	}()
	// subscribed once a probe comes back
	sendWaitFor(t, 10*time.Second, "subscription", func() bool {
		_ = env.Redis.Do(ctx, env.Redis.B().Spublish().Channel(ch).Message("probe").Build()).Error()
		select {
		case <-probes:
			return true
		case <-time.After(20 * time.Millisecond):
			return false
		}
	})
	return out
}

// chHotHolds reports whether a member of topic's hot cache holds s.
func chHotHolds(t testing.TB, env *harness.Env, topic, s string) bool {
	t.Helper()
	for _, z := range chHot(t, env, topic) {
		if strings.Contains(z.Member, s) {
			return true
		}
	}
	return false
}
