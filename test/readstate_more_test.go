package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"
	"golang.org/x/sync/errgroup"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// TestReadStateCursorSurvivesRedisFlush: a cursor acknowledged with a 200
// is in MySQL: after the service's (private) Redis is flushed, the badge,
// the list and a lower PUT still answer it.
func TestReadStateCursorSurvivesRedisFlush(t *testing.T) {
	rs := testenv.StartRedis(t)
	env := startSend(t, harness.Options{Roles: []string{"all"}, Mutate: func(c *config.Config) { c.Redis.Addrs = []string{rs.Addr} }})
	const topic = "rsflush"
	env.group(topic, 503, "active")
	env.member(topic, 31, "member", time.Time{})
	env.member(topic, 32, "member", time.Time{})
	for i := range 5 {
		env.mustSend(env.Token(32, ""), topic, sendBody(fmt.Sprintf("f-%d", i), "x"))
	}
	chWaitSettled(t, env.Env, topic)
	rsUnread(t, env, 31) // fills the entry: a move raises only a topic it names
	if code, got := rsRead(t, env, 31, topic, 3); code != 200 || got != 3 {
		t.Fatalf("read: %d %d", code, got)
	}
	ctx := context.Background()
	cached := func() map[string]string {
		t.Helper()
		m, err := env.Redis.Do(ctx, env.Redis.B().Hgetall().Key(env.Keys().ReadCursors(31)).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// the move raised the cached cursor in its round trip
	if c := cached(); c[topic] != "3" {
		t.Fatalf("cached cursors after the move: %v", c)
	}
	if err := env.Redis.Do(ctx, env.Redis.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, by := rsUnread(t, env, 31); by[topic].Unread != 2 {
		t.Fatalf("unread after the flush: %+v, want 2", by[topic])
	}
	// the read filled the cache from MySQL, complete at the groups epoch
	// (none: the flush dropped it)
	if c := cached(); c[topic] != "3" || c["~"] != "e" {
		t.Fatalf("cached cursors after the flush and a read: %v", c)
	}
	if code, got := rsRead(t, env, 31, topic, 1); code != 200 || got != 3 {
		t.Fatalf("lower read after the flush: %d cursor %d, want 3", code, got)
	}
	if l := rsTopics(t, env, 31, 10); len(l) != 1 || l[0].ReadSeq != 3 || l[0].Unread != 2 {
		t.Fatalf("list after the flush: %+v", l)
	}
	if code, got := rsRead(t, env, 31, topic, 4); code != 200 || got != 4 {
		t.Fatalf("read after the flush: %d %d", code, got)
	}
	if _, by := rsUnread(t, env, 31); by[topic].Unread != 1 {
		t.Fatalf("unread after a move without the seq counter: %+v, want 1", by[topic])
	}
	// a stale entry (as if an older fill had landed) is what a join
	// replaces: the join bumps the version and drops it
	if err := env.Redis.Do(ctx, env.Redis.B().Hset().Key(env.Keys().ReadCursors(31)).FieldValue().
		FieldValue("~", "e").FieldValue(topic, "0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	const other = "rsflush2"
	env.group(other, 504, "active")
	env.member(other, 31, "member", time.Time{})
	if c := cached(); len(c) != 0 {
		t.Fatalf("a join left the cached cursors: %v", c)
	}
	if _, by := rsUnread(t, env, 31); by[topic].Unread != 1 {
		t.Fatalf("unread after a join: %+v, want 1", by[topic])
	}
	// a malformed entry is dropped and read again from MySQL; a move over
	// it still works
	if err := env.Redis.Do(ctx, env.Redis.B().Hset().Key(env.Keys().ReadCursors(31)).FieldValue().
		FieldValue("~", "e").FieldValue(topic, "x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, by := rsUnread(t, env, 31); by[topic].Unread != 1 {
		t.Fatalf("unread over a malformed entry: %+v, want 1", by[topic])
	}
	if c := cached(); c[topic] != "4" {
		t.Fatalf("cached cursors after a malformed entry: %v", c)
	}
	if err := env.Redis.Do(ctx, env.Redis.B().Hset().Key(env.Keys().ReadCursors(31)).FieldValue().
		FieldValue(topic, "x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if code, got := rsRead(t, env, 31, topic, 5); code != 200 || got != 5 {
		t.Fatalf("read over a malformed entry: %d %d", code, got)
	}
}

// rsTopicNames is the topics of a list, in order.
func rsTopicNames(l []inbox.InboxTopic) []string {
	out := make([]string, len(l))
	for i, e := range l {
		out[i] = e.Topic
	}
	return out
}

// TestReadStateTopicListStableWhileMessagesArrive: pinned first, then
// newest activity; a walk in pages of 4 while messages arrive (stored
// before each next page) in topics on pages already read and still to be
// read returns every topic once, in the order of the walk's first moment.
func TestReadStateTopicListStableWhileMessagesArrive(t *testing.T) {
	env := rsStart(t)
	const user, other = 41, 42
	var topics []string
	for i := range 12 {
		topic := fmt.Sprintf("rslist%02d", i)
		topics = append(topics, topic)
		env.group(topic, int64(600+i), "active")
		env.member(topic, user, "member", time.Time{})
		env.member(topic, other, "member", time.Time{})
		env.mustSend(env.Token(other, ""), topic, sendBody("first", "x"))
		chWaitSettled(t, env.Env, topic)
	}
	code, out := env.Do("PUT", "/v1/topics/"+topics[3]+"/me", env.Token(user, ""), map[string]any{"pinned": true})
	if code != 200 {
		t.Fatalf("pin: %d %s", code, out)
	}
	want := []string{topics[3]}
	for i := 11; i >= 0; i-- {
		if i != 3 {
			want = append(want, topics[i]) // newest activity first
		}
	}
	if got := rsTopicNames(rsTopics(t, env, user, 50)); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		path := "/v1/me/topics?limit=4"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var p inbox.TopicsPage
		rsGet(t, env, user, path, &p)
		got = append(got, rsTopicNames(p.Topics)...)
		if p.NextCursor == nil {
			break
		}
		cursor = *p.NextCursor
		// activity in an old topic (later page) and in one already read
		for _, topic := range []string{topics[page], want[page*4+1]} {
			env.mustSend(env.Token(other, ""), topic, sendBody(fmt.Sprintf("p%d", page), "x"))
			chWaitSettled(t, env.Env, topic)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("walk while messages arrive %v, want %v", got, want)
	}
	// a new walk sees the new activity
	if l := rsTopics(t, env, user, 50); l[0].Topic != topics[3] || slices.Equal(rsTopicNames(l), want) {
		t.Fatalf("a new walk %v", rsTopicNames(l))
	}
}

// TestReadStateMembership: history before a join is not unread; a topic
// left is out of the list and the badges; re-joining starts at the join
// point (no unread storm); a dissolved group is out of the list.
func TestReadStateMembership(t *testing.T) {
	env := rsStart(t)
	const topic, user, other = "rsjoin", 61, 62
	env.group(topic, 700, "active")
	env.member(topic, other, "member", time.Time{})
	for i := range 4 {
		env.mustSend(env.Token(other, ""), topic, sendBody(fmt.Sprintf("h-%d", i), "x"))
	}
	chWaitSettled(t, env.Env, topic)
	env.member(topic, user, "member", time.Time{})
	if s, _ := rsUnread(t, env, user); s.Total != 0 {
		t.Fatalf("history unread after a join: %+v", s)
	}
	env.mustSend(env.Token(other, ""), topic, sendBody("after", "x"))
	chWaitSettled(t, env.Env, topic)
	if _, by := rsUnread(t, env, user); by[topic].Unread != 1 {
		t.Fatalf("unread after a join and a message: %+v", by[topic])
	}
	code, out := env.Do("DELETE", fmt.Sprintf("/v1/topics/%s/members/%d", topic, user), env.svc, nil)
	if code != 200 && code != 204 {
		t.Fatalf("leave: %d %s", code, out)
	}
	for i := range 3 {
		env.mustSend(env.Token(other, ""), topic, sendBody(fmt.Sprintf("away-%d", i), "x"))
	}
	chWaitSettled(t, env.Env, topic)
	if s, _ := rsUnread(t, env, user); s.Total != 0 || len(rsTopics(t, env, user, 10)) != 0 {
		t.Fatalf("a topic left still counts: %+v", s)
	}
	env.member(topic, user, "member", time.Time{})
	l := rsTopics(t, env, user, 10)
	if len(l) != 1 || l[0].Unread != 0 || l[0].ReadSeq != l[0].LastSeq {
		t.Fatalf("re-join: %+v", l)
	}
	env.group(topic, 700, "dissolved")
	if l := rsTopics(t, env, user, 10); len(l) != 0 {
		t.Fatalf("dissolved group listed: %+v", l)
	}
}

// TestReadStateBadgesFromCachedMemberships: once a user's memberships are
// cached, badges read no MySQL membership and count a topic joined while
// empty (cursor 0) from the hot cache; a leave, a dissolve (by a
// preferences or cursor move of the caller too) and its undoing show on the
// very next call, and an entry of an older form naming a topic the user
// left is read again.
func TestReadStateBadgesFromCachedMemberships(t *testing.T) {
	env := rsStart(t)
	const a, b, user, other = "rsmema", "rsmemb", 41, 42
	env.group(a, 710, "active")
	env.group(b, 711, "active")
	for _, tp := range []string{a, b} {
		env.member(tp, user, "member", time.Time{}) // an empty topic: cursor 0
		env.member(tp, other, "member", time.Time{})
	}
	for i := range 3 {
		env.mustSend(env.Token(other, ""), a, sendBody(fmt.Sprintf("a-%d", i), "x"))
	}
	for i := range 2 {
		env.mustSend(env.Token(other, ""), b, sendBody(fmt.Sprintf("b-%d", i), "x"))
	}
	chWaitSettled(t, env.Env, a)
	chWaitSettled(t, env.Env, b)
	want := func(step string, counts map[string]int) {
		t.Helper()
		s, by := rsUnread(t, env, user)
		if len(s.Topics) != len(counts) {
			t.Fatalf("%s: badges %+v, want %v", step, s.Topics, counts)
		}
		for tp, n := range counts {
			if by[tp].Unread != n {
				t.Fatalf("%s: badges %+v, want %v", step, s.Topics, counts)
			}
		}
	}
	want("first read", map[string]int{a: 3, b: 2})
	misses := persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="miss"`)
	cold := persistMetric(t, env.Env, "imshard_unread_counts_total", `source="mysql"`)
	want("cached", map[string]int{a: 3, b: 2})
	if n := persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="miss"`); n != misses {
		t.Fatalf("the memberships were read from MySQL again (%v misses)", n-misses)
	}
	if n := persistMetric(t, env.Env, "imshard_unread_counts_total", `source="mysql"`); n != cold {
		t.Fatalf("%v counts of cursor-0 topics fell back to the month tables", n-cold)
	}
	env.group(b, 711, "dissolved")
	want("after a dissolve", map[string]int{a: 3})
	if code, _ := rsRead(t, env, user, b, 1); code != 200 {
		t.Fatalf("read in a dissolved group: %d", code)
	}
	want("after a move in a dissolved group", map[string]int{a: 3})
	env.group(b, 711, "active")
	want("after the group came back", map[string]int{a: 3, b: 1})
	code, out := env.Do("DELETE", fmt.Sprintf("/v1/topics/%s/members/%d", a, user), env.svc, nil)
	if code != 200 && code != 204 {
		t.Fatalf("leave: %d %s", code, out)
	}
	want("after a leave", map[string]int{b: 1})
	// an entry of the older form (complete marker "1", topics left kept)
	ctx := context.Background()
	if err := env.Redis.Do(ctx, env.Redis.B().Hset().Key(env.Keys().ReadCursors(user)).FieldValue().
		FieldValue("~", "1").FieldValue(a, "0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	want("over an entry of the older form", map[string]int{b: 1})
	m, err := env.Redis.Do(ctx, env.Redis.B().Hgetall().Key(env.Keys().ReadCursors(user)).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m[a]; ok || m[b] != "1" {
		t.Fatalf("the entry was not read again: %v", m)
	}
	// a group without messages is placed by the join time (read for the
	// topics that need it): joined after b's last message, it leads
	const c = "rsmemc"
	env.group(c, 712, "active")
	before := time.Now().Add(-time.Minute)
	env.member(c, user, "member", time.Time{})
	after := time.Now().Add(time.Minute)
	l := rsTopics(t, env, user, 10)
	if got := rsTopicNames(l); !slices.Equal(got, []string{c, b}) {
		t.Fatalf("list: %v, want [%s %s]", got, c, b)
	}
	if at := l[0].ActivityAt.Time; at.Before(before) || at.After(after) {
		t.Fatalf("activity of a topic without messages: %v, want its join time (about %v)", at, time.Now())
	}
}

// TestReadStateSyncSevenOf200: a user in 200 topics syncs until nothing is
// new; then 7 topics change (a message, a cursor, a pin, a mute, a leave, a
// dissolution, a recall) and the next sync returns exactly those 7.
func TestReadStateSyncSevenOf200(t *testing.T) {
	env := rsStart(t)
	const user, other = 71, 72
	ctx := context.Background()
	acl := env.App.ACL()
	var topics []string
	for i := range 200 {
		topics = append(topics, fmt.Sprintf("rssync%03d", i))
	}
	// the 200 groups are made 16 at a time: each is a few MySQL commits,
	// and one at a time they were a minute of the suite
	var g errgroup.Group
	g.SetLimit(16)
	for i, topic := range topics {
		g.Go(func() error {
			if err := acl.PutGroup(ctx, env.Tenant, topic, int64(1000+i), topic, "active"); err != nil {
				return err
			}
			for _, u := range []int64{user, other} {
				if err := acl.PutMember(ctx, env.Tenant, topic, u, "member", nil); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	read := env.mustSend(env.Token(other, ""), topics[1], sendBody("r", "x"))
	recall := env.mustSend(env.Token(other, ""), topics[6], sendBody("c", "x"))
	chWaitSettled(t, env.Env, topics[1])
	chWaitSettled(t, env.Env, topics[6])

	seen := map[string]bool{}
	token := ""
	for range 500 {
		p := rsSync(t, env, user, token, 50)
		token = p.Token
		for _, e := range p.Topics {
			seen[e.Topic] = true
		}
		if len(p.Topics) == 0 && len(seen) > 0 {
			break
		}
	}
	if len(seen) != 200 {
		t.Fatalf("first sync saw %d topics, want 200", len(seen))
	}
	env.mustSend(env.Token(other, ""), topics[0], sendBody("new", "x"))
	if code, _ := rsRead(t, env, user, topics[1], read.Seq); code != 200 {
		t.Fatal("read")
	}
	for i, body := range map[int]map[string]any{2: {"pinned": true}, 3: {"notify_muted_until": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}} {
		if code, out := env.Do("PUT", "/v1/topics/"+topics[i]+"/me", env.Token(user, ""), body); code != 200 {
			t.Fatalf("prefs: %d %s", code, out)
		}
	}
	if err := acl.DeleteMember(ctx, env.Tenant, topics[4], user); err != nil {
		t.Fatal(err)
	}
	if err := acl.PutGroup(ctx, env.Tenant, topics[5], 1005, topics[5], "dissolved"); err != nil {
		t.Fatal(err)
	}
	if code, r := chRecall(t, env.Env, env.Token(other, ""), topics[6], recall.Seq, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r)
	}
	chWaitSettled(t, env.Env, topics[0])
	p := rsSync(t, env, user, token, 50)
	var got []string
	removed := map[string]bool{}
	for _, e := range p.Topics {
		got = append(got, e.Topic)
		removed[e.Topic] = e.Removed
	}
	slices.Sort(got)
	if !slices.Equal(got, topics[:7]) || p.HasMore || p.Reset {
		t.Fatalf("sync after 7 changes: %v (has_more %v reset %v), want %v", got, p.HasMore, p.Reset, topics[:7])
	}
	for i, topic := range topics[:7] {
		if removed[topic] != (i == 4 || i == 5) {
			t.Fatalf("%s removed %v", topic, removed[topic])
		}
	}
	// a hide changes what the caller's unread and last message are
	if code, out := env.Do("POST", "/v1/topics/"+topics[1]+"/deletions", env.Token(user, ""), map[string]any{"low": read.Seq, "hi": read.Seq + 1}); code != 200 {
		t.Fatalf("hide: %d %s", code, out)
	}
	if p := rsSync(t, env, user, p.Token, 50); !slices.ContainsFunc(p.Topics, func(e inbox.InboxTopic) bool { return e.Topic == topics[1] }) {
		t.Fatalf("sync after a hide: %+v", p.Topics)
	}
}

// rsRowCounts counts the rows of every table of the tenant's database.
func rsRowCounts(t *testing.T, env *sendEnv) map[string]int {
	t.Helper()
	rows, err := sq.Select("table_name").From("information_schema.tables").Where("table_schema = DATABASE()").
		RunWith(env.DB).Query()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	out := map[string]int{}
	for _, n := range names {
		out[n] = chCount(t, env.Env, "`"+n+"`", sq.Eq{})
	}
	return out
}

// rsRowsAdded is what a send adds to every table, once stored.
func rsRowsAdded(t *testing.T, env *sendEnv, topic string, from int64, cmid string) map[string]int {
	t.Helper()
	before := rsRowCounts(t, env)
	env.mustSend(env.Token(from, ""), topic, sendBody(cmid, "x"))
	chWaitSettled(t, env.Env, topic)
	after := rsRowCounts(t, env)
	out := map[string]int{}
	for n, c := range after {
		if d := c - before[n]; d != 0 {
			out[n] = d
		}
	}
	return out
}

// TestReadStateSendWritesNothingPerMember: a send to a 10,000-member group
// adds exactly the rows a send to a 2-member group adds (the message and
// its bookkeeping), none per member.
func TestReadStateSendWritesNothingPerMember(t *testing.T) {
	env := rsStart(t)
	const sender = 81
	env.group("rssmall", 801, "active")
	env.group("rsbig", 802, "active")
	env.member("rssmall", sender, "member", time.Time{})
	env.member("rssmall", sender+1, "member", time.Time{})
	env.member("rsbig", sender, "member", time.Time{})
	for lo := int64(100000); lo < 110000; lo += 1000 {
		var vals []string
		for u := lo; u < lo+1000; u++ {
			vals = append(vals, fmt.Sprintf("('rsbig', %d)", u))
		}
		if _, err := env.DB.Exec("INSERT INTO im_group_members (topic, user_id) VALUES " + strings.Join(vals, ",")); err != nil {
			t.Fatal(err)
		}
	}
	if n := chCount(t, env.Env, "im_group_members", sq.Eq{"topic": "rsbig"}); n != 10001 {
		t.Fatalf("members %d", n)
	}
	for _, topic := range []string{"rssmall", "rsbig"} { // first sends create per-topic rows
		env.mustSend(env.Token(sender, ""), topic, sendBody("warm", "x"))
		chWaitSettled(t, env.Env, topic)
	}
	small := rsRowsAdded(t, env, "rssmall", sender, "m1")
	big := rsRowsAdded(t, env, "rsbig", sender, "m1")
	if len(big) == 0 || fmt.Sprint(big) != fmt.Sprint(small) {
		t.Fatalf("rows a send adds: 10,000 members %v, 2 members %v", big, small)
	}
	for n, d := range big {
		if d > 2 {
			t.Fatalf("a send added %d rows to %s", d, n)
		}
	}
}
