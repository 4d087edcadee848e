package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// Helpers of the change feed tests: a random workload of sends and
// changes through the HTTP API, and a consumer that reads both Kafka
// topics, rebuilds every message's current state from them alone and
// compares it with what the API answers.

// feedAPI is what the feed tests need of a deployment: one request as a
// client makes it, and tokens.
type feedAPI interface {
	do(method, path, token string, body any) (int, []byte, error)
	token(uid int64, role string) string
}

// feedEnv adapts an in-process harness.Env.
type feedEnv struct{ env *harness.Env }

func (f feedEnv) do(method, path, token string, body any) (int, []byte, error) {
	code, out := f.env.Do(method, path, token, body)
	return code, out, nil
}

func (f feedEnv) token(uid int64, role string) string { return f.env.Token(uid, role) }

// feedProcs adapts separate processes reached over HTTP.
type feedProcs struct {
	t *testing.T
	c *faultsAPI
}

func (f feedProcs) do(method, path, token string, body any) (int, []byte, error) {
	return f.c.do(method, path, token, body)
}

func (f feedProcs) token(uid int64, role string) string { return f.c.token(f.t, uid, role) }

// feedAdmin is the admin who recalls and deletes for everyone.
const feedAdmin int64 = 9001

// feedWorkload is a random workload: workers members (uids 1..workers)
// of every topic each send messages and change their own — edit (mostly),
// recall or delete for everyone (by the admin) — until changes changes
// answered a change_seq in all; a member sends a new message every
// sendEvery changes, so changes also meet messages still in flight. Every
// request is retried until answered, as a client would (a 409 in flight
// after retry_after_ms, a 503 or a lost connection at once). after(n) is
// called after the nth change.
type feedWorkload struct {
	t                         *testing.T
	api                       feedAPI
	topics                    []string
	workers, changes, initial int
	sendEvery                 int
	after                     func(n int)

	mu       sync.Mutex
	answered map[string][]int64 // topic → change_seqs answered
	sent     map[string][]int64 // topic → seqs answered
	done     int
}

// feedMsg is a message a worker may still change.
type feedMsg struct {
	topic   string
	seq     int64
	version int
}

func (w *feedWorkload) run() {
	w.answered, w.sent = map[string][]int64{}, map[string][]int64{}
	svc := w.api.token(900, "service")
	for gid, topic := range w.topics {
		w.must("PUT", "/v1/topics/"+topic, svc, map[string]any{"group_id": gid + 1, "status": "active"})
		for uid := 1; uid <= w.workers; uid++ {
			w.must("PUT", fmt.Sprintf("/v1/topics/%s/members/%d", topic, uid), svc, map[string]any{"role": "member"})
		}
	}
	var wg sync.WaitGroup
	for n := range w.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.worker(int64(n+1), rand.New(rand.NewPCG(uint64(n), 28)))
		}()
	}
	wg.Wait()
}

func (w *feedWorkload) worker(uid int64, rnd *rand.Rand) {
	tok, admin := w.api.token(uid, ""), w.api.token(feedAdmin, "admin")
	var mine []feedMsg
	sends := 0
	send := func() {
		topic := w.topics[rnd.IntN(len(w.topics))]
		_, out := w.retry("POST", "/v1/topics/"+topic+"/messages", tok, map[string]any{
			"client_msg_id": fmt.Sprintf("f%d-%d", uid, sends), "msg_type": "text",
			"content": map[string]any{"text": fmt.Sprintf("u%d m%d", uid, sends)}})
		sends++
		var r struct{ Seq int64 }
		if err := json.Unmarshal(out, &r); err != nil || r.Seq <= 0 {
			w.t.Errorf("send answer: %s", out)
			return
		}
		mine = append(mine, feedMsg{topic: topic, seq: r.Seq, version: 1})
		w.mu.Lock()
		w.sent[topic] = append(w.sent[topic], r.Seq)
		w.mu.Unlock()
	}
	for range w.initial {
		send()
	}
	for k := 0; k < w.changes/w.workers; k++ {
		if len(mine) == 0 || k%w.sendEvery == 0 {
			send()
		}
		if w.t.Failed() || len(mine) == 0 {
			return
		}
		i := rnd.IntN(len(mine))
		m := &mine[i]
		path := chSeqPath(m.topic, m.seq)
		var code int
		var out []byte
		switch r := rnd.Float64(); {
		case r < 0.86:
			code, out = w.retry("PATCH", path, tok, chEditBody(fmt.Sprintf("u%d edit %d", uid, k), m.version))
		case r < 0.93:
			code, out = w.retry("POST", path+"/recall", admin, map[string]any{"reason": "workload"})
		default:
			code, out = w.retry("DELETE", path+"?scope=all", admin, nil)
		}
		var res chResult
		if code != 200 || json.Unmarshal(out, &res) != nil || res.ChangeSeq <= 0 {
			w.t.Errorf("change %s: %d %s", path, code, out)
			return
		}
		m.version = res.Message.Version
		if res.Message.Status != message.StatusNormal {
			mine = append(mine[:i], mine[i+1:]...)
		}
		w.mu.Lock()
		w.answered[res.Message.Topic] = append(w.answered[res.Message.Topic], res.ChangeSeq)
		w.done++
		n := w.done
		w.mu.Unlock()
		if w.after != nil {
			w.after(n)
		}
	}
}

// retry makes one request until it is answered with anything but a 409
// in flight, a 503 or a lost connection, for at most two minutes.
func (w *feedWorkload) retry(method, path, token string, body any) (int, []byte) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, out, err := w.api.do(method, path, token, body)
		again := err != nil || code == 503 || code == 409 && bytes.Contains(out, []byte("retry_after_ms"))
		if !again {
			return code, out
		}
		if time.Now().After(deadline) {
			w.t.Errorf("%s %s still %d %s %v after two minutes", method, path, code, out, err)
			return code, out
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (w *feedWorkload) must(method, path, token string, body any) {
	if code, out := w.retry(method, path, token, body); code != 200 && code != 201 {
		w.t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
}

// kafkaReadAll reads every record a topic holds now, from its start.
func kafkaReadAll(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	var out []*kgo.Record
	for int64(len(out)) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %d of %d records", topic, len(out), want)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// feedRebuilt is what a consumer of both topics knows of a tenant.
type feedRebuilt struct {
	messages map[string]map[int64]message.Message // topic → seq → current state
	seen     map[string]map[int64]bool            // topic → change_seqs received
	resent   int                                  // change events received again
}

// feedRebuild consumes the message topic and the change feed of tenant as
// docs/events.md tells a consumer to: each stored message from its message
// event, then per topic the change events in the order received — one
// whose change_seq is at or below the last applied is a re-send and is
// skipped, the next applies its message (none: the message is gone). A
// change_seq that is neither — a gap or a change out of order — fails the
// test.
func feedRebuild(t *testing.T, brokers []string, msgTopic, changesTopic, tenant string) feedRebuilt {
	t.Helper()
	out := feedRebuilt{messages: map[string]map[int64]message.Message{}, seen: map[string]map[int64]bool{}}
	for _, r := range kafkaReadAll(t, brokers, msgTopic) {
		var ev message.Event
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatalf("message event: %v", err)
		}
		if ev.Tenant != tenant {
			continue
		}
		if out.messages[ev.Topic] == nil {
			out.messages[ev.Topic] = map[int64]message.Message{}
		}
		out.messages[ev.Topic][ev.SeqID] = message.FromEvent(&ev)
	}
	last := map[string]int64{}
	for _, r := range kafkaReadAll(t, brokers, changesTopic) {
		var ev feed.Event
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatalf("change event: %v", err)
		}
		if ev.Tenant != tenant {
			continue
		}
		if string(r.Key) != tenant+"/"+ev.Topic || ev.V != feed.EventVersion {
			t.Fatalf("change event key %q, v %d: %s", r.Key, ev.V, r.Value)
		}
		switch {
		case ev.ChangeSeq <= last[ev.Topic]:
			out.resent++
			continue
		case ev.ChangeSeq != last[ev.Topic]+1:
			t.Fatalf("topic %s: change_seq %d received after %d", ev.Topic, ev.ChangeSeq, last[ev.Topic])
		}
		last[ev.Topic] = ev.ChangeSeq
		if out.seen[ev.Topic] == nil {
			out.seen[ev.Topic] = map[int64]bool{}
		}
		out.seen[ev.Topic][ev.ChangeSeq] = true
		if ev.Message == nil {
			delete(out.messages[ev.Topic], ev.SeqID)
			continue
		}
		if _, ok := out.messages[ev.Topic][ev.SeqID]; !ok {
			t.Fatalf("change %s/%d of seq %d, which no message event brought", ev.Topic, ev.ChangeSeq, ev.SeqID)
		}
		out.messages[ev.Topic][ev.SeqID] = *ev.Message
	}
	return out
}

// feedCompare checks that every change the workload was answered is on
// the feed, and that every message the workload sent is, as rebuilt, what
// the API answers for it (the exact lookup, as a member).
func feedCompare(t *testing.T, w *feedWorkload, got feedRebuilt) {
	t.Helper()
	for topic, seqs := range w.answered {
		for _, cs := range seqs {
			if !got.seen[topic][cs] {
				t.Errorf("change %s/%d answered but not on the feed", topic, cs)
			}
		}
	}
	member := w.api.token(1, "")
	n := 0
	for topic, seqs := range w.sent {
		for _, seq := range seqs {
			rebuilt, ok := got.messages[topic][seq]
			if !ok {
				t.Errorf("message %s/%d sent but not rebuilt", topic, seq)
				continue
			}
			code, out, err := w.api.do("GET", chSeqPath(topic, seq), member, nil)
			if err != nil || code != 200 {
				t.Fatalf("GET %s/%d: %d %s %v", topic, seq, code, out, err)
			}
			var api message.Message
			if err := json.Unmarshal(out, &api); err != nil {
				t.Fatal(err)
			}
			if a, b := feedComparable(api), feedComparable(rebuilt); a != b {
				t.Errorf("message %s/%d\n  API:     %s\n  rebuilt: %s", topic, seq, a, b)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("the workload sent nothing")
	}
}

// feedComparable is a message rendered for comparison: as the API renders
// it, its JSON values compacted (a client's spacing is not part of the
// state).
func feedComparable(m message.Message) string {
	m.Content, m.Head = feedCompact(m.Content), feedCompact(m.Head)
	b, _ := json.Marshal(m)
	return string(b)
}

func feedCompact(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if len(raw) == 0 {
		return nil
	}
	if json.Compact(&b, raw) != nil {
		return json.RawMessage(strings.TrimSpace(string(raw)))
	}
	return b.Bytes()
}
