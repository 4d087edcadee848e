package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// rpPost sends one message through the API and returns its seq and month.
func rpPost(t testing.TB, env *harness.Env, token, topic, cmid, text string) (int64, string) {
	t.Helper()
	var r struct {
		Seq        int64  `json:"seq"`
		ShardMonth string `json:"shard_month"`
	}
	code, body := env.Do("POST", "/v1/topics/"+topic+"/messages", token, map[string]any{
		"client_msg_id": cmid, "msg_type": "text", "content": map[string]any{"text": text}})
	if code != 201 {
		t.Fatalf("send %s: %d %s", cmid, code, body)
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r.Seq, r.ShardMonth
}

// TestReadPathEndToEndThroughPost: messages sent through POST over three
// months are readable by their sender at once (hot cache, before persist
// catches up), then page exactly once in both directions from MySQL — also
// with the hot cache and the Redis routes gone.
func TestReadPathEndToEndThroughPost(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	rpGroup(t, env, "e2e")
	tok := env.Token(rpMember, "")
	ctx := context.Background()
	var all []int64
	for i := range 3 {
		month := env.Start.Add(i)
		if i > 0 {
			env.Activate(month)
		}
		for j := range 12 {
			seq, sm := rpPost(t, env, tok, "e2e", fmt.Sprintf("m%d-%d", i, j), fmt.Sprintf("text %d-%d", i, j))
			if sm != month.String() {
				t.Fatalf("seq %d stored for %s, want %s", seq, sm, month)
			}
			var m message.Message
			if code := rpGet(t, env, rpMember, "", "/v1/topics/e2e/messages/"+strconv.FormatInt(seq, 10), &m); code != 200 || m.Seq != seq {
				t.Fatalf("the sender reads seq %d right after the 201: %d %+v", seq, code, m)
			}
			all = append(all, seq)
		}
	}
	rpExpect(t, "seqs are consecutive across months", all, rpAsc(1, 36))
	deadline := time.Now().Add(30 * time.Second)
	for len(rpWalkSince(t, env, rpMember, "e2e", 50)) < len(all) {
		if time.Now().After(deadline) {
			t.Fatal("messages not all persisted within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rpExpectWalks(t, env, "persisted", rpMember, "e2e", 5, all)
	ranges, found, err := env.App.Routes().Load(ctx, env.Tenant, "e2e")
	if err != nil || !found || len(ranges) != 3 || ranges[0].MinSeq != 1 || ranges[2].MaxSeq != 36 {
		t.Fatalf("persist merged the route: %v %v %v", ranges, found, err)
	}
	// the latest page as the hot cache answers it (members passed through
	// as they are) and as MySQL answers it, to a process holding no copy
	// of the topic: the same JSON
	reader := rpNoCopies(t, env)
	latest := func() any {
		code, body := reader.Do("GET", "/v1/topics/e2e/messages?limit=20", tok, nil)
		var v any
		if code != 200 || json.Unmarshal(body, &v) != nil {
			t.Fatalf("latest page: %d %s", code, body)
		}
		return v
	}
	fromCache := latest()
	keys := env.Keys()
	if err := env.Redis.Do(ctx, env.Redis.B().Del().Key(keys.HotMessages("e2e")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if fromMySQL := latest(); !reflect.DeepEqual(fromCache, fromMySQL) {
		t.Fatalf("hot-cache page\n%v\nMySQL page\n%v", fromCache, fromMySQL)
	}
	if err := env.App.Routes().Delete(ctx, env.Tenant, "e2e"); err != nil {
		t.Fatal(err)
	}
	rpExpectWalks(t, env, "without hot cache and routes", rpMember, "e2e", 7, all)
	if code := rpGet(t, env, rpMember, "", "/v1/topics/e2e/messages/1", nil); code != 200 {
		t.Fatalf("oldest message evicted from the cache: %d", code)
	}
}

// TestReadPathSinceWalkDuringConcurrentSends: readers following a topic
// with since while writers send concurrently see every seq exactly once,
// in order — a seq still in flight is waited for, never jumped over.
func TestReadPathSinceWalkDuringConcurrentSends(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	rpGroup(t, env, "follow")
	const writers, each = 4, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := env.Token(rpMember, "")
			for j := range each {
				code, body := env.Do("POST", "/v1/topics/follow/messages", tok, map[string]any{
					"client_msg_id": fmt.Sprintf("w%d-%d", w, j), "msg_type": "text", "content": map[string]any{"text": "x"}})
				if code != 201 {
					t.Errorf("send: %d %s", code, body)
					return
				}
			}
		}()
	}
	var got []int64
	since := int64(0)
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < writers*each {
		if time.Now().After(deadline) {
			t.Fatalf("since walk stalled at %d of %d: %v", len(got), writers*each, got)
		}
		p := rpList(t, env, rpOther, "follow", url.Values{"since": {strconv.FormatInt(since, 10)}, "limit": {"7"}})
		for _, s := range p.seqs() {
			for missing := since + 1; missing < s; missing++ {
				if !slices.Contains(p.Gaps, missing) {
					t.Fatalf("since walk jumped from %d to %d (page %v, gaps %v)", since, s, p.seqs(), p.Gaps)
				}
			}
			got = append(got, s)
			since = s
		}
		if len(p.Messages) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	wg.Wait()
	rpExpect(t, "every seq once, in order", got, rpAsc(1, writers*each))
}
