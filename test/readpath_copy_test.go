package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
)

// TestCopiesOfNewestMessages: a read process keeps a copy of a topic's
// newest messages and reads only what lies above it from Redis; a message
// sent through another process shows on its very next page, and its pages
// are those of a process holding no copy. When the seq counter falls below
// the copy (a Redis restored from an older state) the copy goes and MySQL
// answers.
func TestCopiesOfNewestMessages(t *testing.T) {
	t.Parallel()
	env, reader, tok := rpCopyReader(t, "copy")
	for i := range 10 {
		rpPost(t, env, tok, "copy", fmt.Sprintf("c%d", i), fmt.Sprintf("text %d", i))
	}
	latest := func(e *harness.Env, limit int) []int64 {
		return rpList(t, e, rpMember, "copy", url.Values{"limit": {strconv.Itoa(limit)}}).seqs()
	}
	rpExpect(t, "the first latest page", latest(reader, 20), rpDesc(1, 10))
	for i := int64(11); i <= 15; i++ {
		seq, _ := rpPost(t, env, tok, "copy", fmt.Sprintf("c%d", i), fmt.Sprintf("text %d", i))
		rpExpect(t, "the latest page right after a send through another process", latest(reader, 5), rpDesc(seq-4, seq))
	}
	if hits := rpMetric(t, reader, "imshard_query_hot_local_total", "result=hit"); hits < 5 {
		t.Fatalf("%v pages read over the copy, want at least 5", hits)
	}
	waitFor(t, 30*time.Second, func() bool { return len(rpWalkSince(t, env, rpMember, "copy", 50)) == 15 }) // persisted
	rpExpect(t, "a since page from within the copy", rpList(t, reader, rpMember, "copy", url.Values{"since": {"8"}}).seqs(), rpAsc(9, 15))
	rpExpectWalks(t, reader, "over the copy", rpMember, "copy", 4, rpAsc(1, 15))
	// the very same JSON as from a process without a copy
	fresh := rpNoCopies(t, env)
	for _, q := range []string{"limit=7", "limit=20", "since=3&limit=6", "before=12&limit=5"} {
		a, b := rpRaw(t, reader, "copy", q), rpRaw(t, fresh, "copy", q)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: over the copy\n%v\nwithout\n%v", q, a, b)
		}
	}
	// the counter falls below the copy: it is dropped, MySQL answers
	setLast := func(seq int64) { rpSetLast(t, env, "copy", seq) }
	setLast(5)
	rpExpect(t, "the latest page with the counter below the copy", latest(reader, 5), rpDesc(11, 15))
	if n := rpMetric(t, reader, "imshard_query_hot_local_total", "result=reset"); n != 1 {
		t.Fatalf("copies dropped: %v, want 1", n)
	}
	setLast(15)
	rpExpect(t, "the latest page once the counter is back", latest(reader, 5), rpDesc(11, 15))
}

// rpRaw is a list page's decoded JSON.
func rpRaw(t *testing.T, env *harness.Env, topic, query string) any {
	t.Helper()
	code, body := env.Do("GET", "/v1/topics/"+topic+"/messages?"+query, env.Token(rpMember, ""), nil)
	var v any
	if code != 200 || json.Unmarshal(body, &v) != nil {
		t.Fatalf("GET %s: %d %s", query, code, body)
	}
	return v
}

// TestCopyReplacedOnceOld: a copy is read for hot_cache.local_max_age at
// most. A seq the copy holds as a gap whose message was stored after all
// (a send acknowledged after its produce timeout) shows once a full read
// replaced the copy.
func TestCopyReplacedOnceOld(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Roles: []string{"query"},
		Mutate: func(c *config.Config) { c.HotCache.LocalMaxAge = 2 * time.Second }})
	rpThreeMonths(t, env, "aged")
	ctx := context.Background()
	cache := func(seq int64, text string) { rpCache(t, env, "aged", seq, text) }
	for s := int64(41); s <= 70; s++ {
		if s != 65 {
			cache(s, "cached")
		}
	}
	if err := env.App.Flight().RecordGap(ctx, env.Tenant, "aged", 65); err != nil {
		t.Fatal(err)
	}
	rpSetLast(t, env, "aged", 70)
	page := func() []int64 { return rpList(t, env, rpMember, "aged", url.Values{"limit": {"8"}}).seqs() }
	rpExpect(t, "65 a gap", page(), []int64{70, 69, 68, 67, 66, 64, 63, 62})
	rpList(t, env, rpMember, "aged", url.Values{"limit": {"20"}}) // a deeper copy
	rpExpect(t, "over the copy", page(), []int64{70, 69, 68, 67, 66, 64, 63, 62})
	if rpMetric(t, env, "imshard_query_hot_local_total", "result=hit") < 1 {
		t.Fatal("no page was read over the copy")
	}
	cache(65, "late")
	waitFor(t, 15*time.Second, func() bool { return reflect.DeepEqual(page(), rpDesc(63, 70)) })
}

// TestCopyNeverOutlivesALostMessageVersion: a process's copy of a topic's
// newest messages is trusted only under a message version Redis holds. A
// copy made before an edit must not come back when Redis then loses the
// version (a flush, a restart, an eviction): a missing version says nothing
// of the changes made before it went missing, so the edited message shows.
func TestCopyNeverOutlivesALostMessageVersion(t *testing.T) {
	t.Parallel()
	env, reader, tok := rpCopyReader(t, "lost")
	for i := range 5 {
		rpPost(t, env, tok, "lost", fmt.Sprintf("l%d", i), fmt.Sprintf("text %d", i))
	}
	waitFor(t, 30*time.Second, func() bool { return len(rpWalkSince(t, env, rpMember, "lost", 50)) == 5 }) // persisted
	latest := func() rpPage { return rpList(t, reader, rpMember, "lost", url.Values{"limit": {"5"}}) }
	latest()
	rpExpect(t, "the latest page over the copy", latest().seqs(), rpDesc(1, 5))
	if rpMetric(t, reader, "imshard_query_hot_local_total", "result=hit") < 1 {
		t.Fatal("no page was read over the copy")
	}
	if code, res := chEdit(t, env, tok, "lost", 3, chEditBody("edited", 1)); code != 200 {
		t.Fatalf("edit: %d %+v", code, res)
	}
	keys := env.Keys()
	if err := env.Redis.Do(context.Background(), env.Redis.B().Del().Key(keys.MessagesVersion("lost")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, m := range latest().Messages {
		if m.Seq == 3 && (m.Version != 2 || chText(m) != "edited") {
			t.Fatalf("seq 3 after the version was lost: version %d %q, want the edit (version 2)", m.Version, chText(m))
		}
	}
}

// TestCopyDroppedForAChangeKeepsUnstoredMessages: a process holding a
// copy of a topic's newest messages reads only what lies above it; when
// that read shows the topic's message version moved (a change of an older
// message, which also took that message out of the cache), the copy goes
// and the page must read the cache afresh from its cursor. Kept cut at the
// copy, the read held none of the acknowledged messages persist has not
// stored yet: the changed message's hole sent the page to MySQL, which
// does not have them either, and the page topped out below them.
func TestCopyDroppedForAChangeKeepsUnstoredMessages(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Roles: []string{"query"},
		Mutate: func(c *config.Config) { c.HotCache.LocalMaxAge = time.Hour }})
	rpThreeMonths(t, env, "moved")     // 1..70 stored
	for s := int64(56); s <= 80; s++ { // 71..80 acknowledged, not stored yet
		rpCache(t, env, "moved", s, "cached")
	}
	rpSetLast(t, env, "moved", 80)
	latest := func() []int64 { return rpList(t, env, rpMember, "moved", url.Values{"limit": {"12"}}).seqs() }
	rpExpect(t, "the first latest page", latest(), rpDesc(69, 80))
	rpExpect(t, "the latest page over the copy", latest(), rpDesc(69, 80))
	if rpMetric(t, env, "imshard_query_hot_local_total", "result=hit") < 1 {
		t.Fatal("no page was read over the copy")
	}
	// an edit of 68, as the change path makes it: out of the cache, the
	// topic's message version moved on
	keys := env.Keys()
	ctx := context.Background()
	for _, c := range []rueidis.Completed{
		env.Redis.B().Zremrangebyscore().Key(keys.HotMessages("moved")).Min("68").Max("68").Build(),
		env.Redis.B().Set().Key(keys.MessagesVersion("moved")).Value("2").Build(),
	} {
		if err := env.Redis.Do(ctx, c).Error(); err != nil {
			t.Fatal(err)
		}
	}
	rpExpect(t, "the latest page once a change moved the version", latest(), rpDesc(69, 80))
	if n := rpMetric(t, env, "imshard_query_hot_local_total", "result=changed"); n != 1 {
		t.Fatalf("copies dropped for a change: %v, want 1", n)
	}
}
