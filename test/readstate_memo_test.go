package test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// TestReadStateRememberedBadgesFollowEveryChange: a badge read twice is
// answered the second time from what the query process remembered, and
// every change that moves a count — another member's send (mentioning the
// reader), a recall, a delete for everyone, a hide, a cursor move, the
// reader's own send — shows on the very next read, never the remembered
// count.
func TestReadStateRememberedBadgesFollowEveryChange(t *testing.T) {
	env := rsStart(t)
	const topic = "rsmemo"
	const reader, other = int64(21), int64(22)
	env.group(topic, 502, "active")
	for _, u := range []int64{reader, other} {
		env.member(topic, u, "member", time.Time{})
	}
	admin := env.Token(99, "admin")
	m := &rsModel{msgs: map[int64]*rsMsg{}, hidden: map[int64][][2]int64{}, cursor: map[int64]int64{}}
	sent := 0
	send := func(from int64, mention bool) int64 {
		body := sendBody(fmt.Sprintf("m-%d", sent), "hello")
		msg := &rsMsg{from: from, status: "normal"}
		if mention {
			body["mentioned_user_ids"] = []string{strconv.FormatInt(reader, 10)}
			msg.mentions = []int64{reader}
		}
		sent++
		r := env.mustSend(env.Token(from, ""), topic, body)
		m.msgs[r.Seq], m.last = msg, r.Seq
		chWaitSettled(t, env.Env, topic)
		return r.Seq
	}
	remembered := func() float64 {
		return persistMetric(t, env.Env, "imshard_unread_counts_total", `source="memo"`)
	}
	check := func(step string) {
		t.Helper()
		n, men, _ := m.unread(reader)
		before := remembered()
		for read := range 2 {
			_, by := rsUnread(t, env, reader)
			if by[topic].Unread != n || by[topic].MentionUnread != men {
				t.Fatalf("%s, read %d: %+v, want %d unread, %d mentions", step, read, by[topic], n, men)
			}
		}
		if n > 0 && remembered() <= before {
			t.Fatalf("%s: the second read was not answered from the remembered count", step)
		}
	}
	for i := range 5 {
		send(other, i == 2)
	}
	check("five sends")
	send(other, true)
	check("a send mentioning the reader")
	if code, r := chRecall(t, env.Env, env.Token(other, ""), topic, 6, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r)
	}
	m.msgs[6].status = "recalled"
	check("a recall")
	if code, out := env.Do("DELETE", chSeqPath(topic, 2)+"?scope=all", admin, nil); code != 200 {
		t.Fatalf("delete: %d %s", code, out)
	}
	m.msgs[2].status = "deleted"
	check("a delete for everyone")
	if code, out := env.Do("POST", "/v1/topics/"+topic+"/deletions", env.Token(reader, ""), map[string]any{"low": 4, "hi": 5}); code != 200 {
		t.Fatalf("hide: %d %s", code, out)
	}
	m.hidden[reader] = append(m.hidden[reader], [2]int64{4, 5})
	check("a hide")
	if code, got := rsRead(t, env, reader, topic, 3); code != 200 || got != 3 {
		t.Fatalf("read: %d %d", code, got)
	}
	m.cursor[reader] = 3
	check("a cursor move")
	send(other, false)
	send(reader, false)
	check("the reader's own send")
	send(other, false)
	check("a send after the reader's own")
}

// TestReadStateRememberedRoutesFollowSends: a topic list read again takes
// its topics' route mirrors from what the query process remembered, and a
// message stored since, a pin and an unpin reorder the list on the very
// next read.
func TestReadStateRememberedRoutesFollowSends(t *testing.T) {
	env := rsStart(t)
	const reader, other = int64(31), int64(32)
	topics := []string{"rsroute-a", "rsroute-b", "rsroute-c"}
	for i, topic := range topics {
		env.group(topic, int64(600+i), "active")
		for _, u := range []int64{reader, other} {
			env.member(topic, u, "member", time.Time{})
		}
	}
	lastSeq := map[string]int64{}
	send := func(topic string) {
		r := env.mustSend(env.Token(other, ""), topic, sendBody(fmt.Sprintf("%s-%d", topic, lastSeq[topic]), "hi"))
		lastSeq[topic] = r.Seq
		chWaitSettled(t, env.Env, topic)
		time.Sleep(2 * time.Millisecond) // activity is kept to the millisecond
	}
	pin := func(topic string, pinned bool) {
		if code, out := env.Do("PUT", "/v1/topics/"+topic+"/me", env.Token(reader, ""), map[string]any{"pinned": pinned}); code != 200 {
			t.Fatalf("pin %s: %d %s", topic, code, out)
		}
	}
	for _, topic := range topics {
		send(topic)
	}
	check := func(step string, order ...string) {
		t.Helper()
		hits := persistMetric(t, env.Env, "imshard_query_route_memo_total", `result="hit"`)
		for read := range 2 {
			list := rsTopics(t, env, reader, 10)
			if len(list) != len(order) {
				t.Fatalf("%s: %d topics, want %d", step, len(list), len(order))
			}
			for i, e := range list {
				if e.Topic != order[i] || e.LastSeq != lastSeq[e.Topic] {
					t.Fatalf("%s, read %d: entry %d is %s at last_seq %d, want %s at %d", step, read, i, e.Topic, e.LastSeq, order[i], lastSeq[order[i]])
				}
			}
		}
		if persistMetric(t, env.Env, "imshard_query_route_memo_total", `result="hit"`) <= hits {
			t.Fatalf("%s: no mirror was remembered", step)
		}
	}
	check("three sends", "rsroute-c", "rsroute-b", "rsroute-a")
	send("rsroute-a")
	check("a send to the oldest", "rsroute-a", "rsroute-c", "rsroute-b")
	pin("rsroute-b", true)
	check("a pin", "rsroute-b", "rsroute-a", "rsroute-c")
	send("rsroute-c")
	send("rsroute-c")
	check("two sends beside the pinned one", "rsroute-b", "rsroute-c", "rsroute-a")
	pin("rsroute-b", false)
	check("an unpin", "rsroute-c", "rsroute-a", "rsroute-b")
}

// TestReadStateHeldEntryFollowsEveryWriter: once the query process holds a
// user's cached memberships as it read them, a badge reads only the
// entry's generation, and every writer of the entry — a cursor move from
// another device, a join, a leave, a preferences change, a dissolve —
// shows on the very next badge and list.
func TestReadStateHeldEntryFollowsEveryWriter(t *testing.T) {
	env := rsStart(t)
	const user, other = int64(51), int64(52)
	const a, b, c = "rsheld-a", "rsheld-b", "rsheld-c"
	for i, tp := range []string{a, b, c} {
		env.group(tp, int64(720+i), "active")
		env.member(tp, other, "member", time.Time{})
	}
	env.member(a, user, "member", time.Time{})
	env.member(b, user, "member", time.Time{})
	for i := range 4 {
		for _, tp := range []string{a, b, c} {
			env.mustSend(env.Token(other, ""), tp, sendBody(fmt.Sprintf("%s-%d", tp, i), "x"))
		}
	}
	for _, tp := range []string{a, b, c} {
		chWaitSettled(t, env.Env, tp)
	}
	held := func() float64 {
		return persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="held"`)
	}
	// counts: the user's topics and their unread (0: listed, no badge)
	want := func(step string, counts map[string]int, pinned string) {
		t.Helper()
		for read := range 2 {
			s, by := rsUnread(t, env, user)
			badges := 0
			for _, n := range counts {
				if n > 0 {
					badges++
				}
			}
			if len(s.Topics) != badges {
				t.Fatalf("%s, read %d: badges %+v, want %v", step, read, s.Topics, counts)
			}
			for tp, n := range counts {
				if by[tp].Unread != n {
					t.Fatalf("%s, read %d: badges %+v, want %v", step, read, s.Topics, counts)
				}
			}
			list := rsTopics(t, env, user, 10)
			if len(list) != len(counts) {
				t.Fatalf("%s, read %d: list %v, want %v", step, read, rsTopicNames(list), counts)
			}
			for _, e := range list {
				if _, ok := counts[e.Topic]; !ok || e.Unread != counts[e.Topic] || e.Pinned != (e.Topic == pinned) {
					t.Fatalf("%s, read %d: list entry %+v, want %v, pinned %q", step, read, e, counts, pinned)
				}
			}
		}
	}
	want("first reads", map[string]int{a: 4, b: 4}, "")
	before := held()
	want("held", map[string]int{a: 4, b: 4}, "")
	if held() <= before {
		t.Fatal("the entry was read whole again, not held")
	}
	// another device moves the cursor: the script moves the generation,
	// and the next badge reads the entry whole, keeping the last seqs
	moved := persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="moved"`)
	if code, got := rsRead(t, env, user, a, 3); code != 200 || got != 3 {
		t.Fatalf("read: %d %d", code, got)
	}
	want("a cursor move", map[string]int{a: 1, b: 4}, "")
	if persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="moved"`) <= moved {
		t.Fatal("the entry read after the cursor move did not keep the held copy's reads")
	}
	env.member(c, user, "member", time.Time{})
	want("a join", map[string]int{a: 1, b: 4, c: 0}, "")
	env.mustSend(env.Token(other, ""), c, sendBody("c-after-join", "x"))
	chWaitSettled(t, env.Env, c)
	want("a send after the join", map[string]int{a: 1, b: 4, c: 1}, "")
	code, out := env.Do("DELETE", fmt.Sprintf("/v1/topics/%s/members/%d", b, user), env.svc, nil)
	if code != 200 && code != 204 {
		t.Fatalf("leave: %d %s", code, out)
	}
	want("a leave", map[string]int{a: 1, c: 1}, "")
	if code, out := env.Do("PUT", "/v1/topics/"+c+"/me", env.Token(user, ""), map[string]any{"pinned": true}); code != 200 {
		t.Fatalf("pin: %d %s", code, out)
	}
	want("a pin", map[string]int{a: 1, c: 1}, c)
	env.group(a, 720, "dissolved")
	want("a dissolve", map[string]int{c: 1}, c)
	before = held()
	want("held again", map[string]int{c: 1}, c)
	if held() <= before {
		t.Fatal("the entry was not held again")
	}
}

// TestReadStateRememberedBadgesNeverOutliveALostVersion: a count is
// remembered only under message and deletion-range versions Redis holds.
// When Redis loses a version after a recall or a hide moved it (a flush, a
// restart), the badge shows the recall and the hide, never a count
// remembered before them.
func TestReadStateRememberedBadgesNeverOutliveALostVersion(t *testing.T) {
	env := rsStart(t)
	const topic = "rslost"
	const reader, other = int64(31), int64(32)
	env.group(topic, 503, "active")
	for _, u := range []int64{reader, other} {
		env.member(topic, u, "member", time.Time{})
	}
	for i := range 5 {
		env.mustSend(env.Token(other, ""), topic, sendBody(fmt.Sprintf("l-%d", i), "hello"))
	}
	chWaitSettled(t, env.Env, topic)
	keys := env.Keys()
	lose := func(key string) {
		t.Helper()
		if err := env.Redis.Do(context.Background(), env.Redis.B().Del().Key(key).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(step string, want int) {
		t.Helper()
		for read := range 2 {
			if _, by := rsUnread(t, env, reader); by[topic].Unread != want {
				t.Fatalf("%s, read %d: %d unread, want %d", step, read, by[topic].Unread, want)
			}
		}
	}
	expect("five sends", 5)
	if code, r := chRecall(t, env.Env, env.Token(other, ""), topic, 5, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r)
	}
	lose(keys.MessagesVersion(topic))
	expect("a recall, then the message version lost", 4)
	if code, out := env.Do("POST", "/v1/topics/"+topic+"/deletions", env.Token(reader, ""), map[string]any{"low": 1, "hi": 3}); code != 200 {
		t.Fatalf("hide: %d %s", code, out)
	}
	lose(keys.HiddenVersion(topic))
	expect("a hide, then the deletion-range version lost", 2)
}
