package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// rsModel is what the unread counts must be, computed from every
// operation the test made.
type rsModel struct {
	last   int64 // the topic's last seq, gaps included
	msgs   map[int64]*rsMsg
	hidden map[int64][][2]int64 // user → [low, hi)
	cursor map[int64]int64
}

type rsMsg struct {
	from     int64
	status   string
	mentions []int64
	all      bool
}

func (m *rsModel) hides(user, seq int64) bool {
	for _, r := range m.hidden[user] {
		if r[0] <= seq && seq < r[1] {
			return true
		}
	}
	return false
}

// unread is the expected (unread, mention_unread, read_seq) of user.
func (m *rsModel) unread(user int64) (int, int, int64) {
	c := m.cursor[user]
	for seq, msg := range m.msgs {
		if msg.from == user && seq > c {
			c = seq
		}
	}
	n, men := 0, 0
	for seq, msg := range m.msgs {
		if seq <= c || msg.status != "normal" || m.hides(user, seq) {
			continue
		}
		n++
		if msg.all || slices.Contains(msg.mentions, user) {
			men++
		}
	}
	return n, men, c
}

// newest is the seq of the newest message user may see (0: none).
func (m *rsModel) newest(user int64) int64 {
	var best int64
	for seq, msg := range m.msgs {
		if seq > best && msg.status != "deleted" && !m.hides(user, seq) {
			best = seq
		}
	}
	return best
}

// TestReadStateUnreadExact: random sends by three users (some mentioning),
// gaps, recalls, deletes for everyone, hides for one user and cursor moves
// from two devices; after each round every user's badge, cursor and last
// message equal the model's.
func TestReadStateUnreadExact(t *testing.T) {
	env := rsStart(t)
	const topic = "rsexact"
	users := []int64{11, 12, 13}
	env.group(topic, 501, "active")
	for _, u := range users {
		env.member(topic, u, "member", time.Time{})
	}
	admin := env.Token(99, "admin")
	m := &rsModel{msgs: map[int64]*rsMsg{}, hidden: map[int64][][2]int64{}, cursor: map[int64]int64{}}
	rng := rand.New(rand.NewPCG(15, 1))
	ctx := context.Background()
	sent := 0
	for round := range 6 {
		for range 12 {
			switch op := rng.IntN(100); {
			case op < 55: // a send
				from := users[rng.IntN(len(users))]
				body := sendBody(fmt.Sprintf("c-%d", sent), "hello")
				msg := &rsMsg{from: from, status: "normal"}
				if rng.IntN(4) == 0 {
					msg.mentions = []int64{users[rng.IntN(len(users))]}
					body["mentioned_user_ids"] = []string{strconv.FormatInt(msg.mentions[0], 10)}
				}
				if rng.IntN(10) == 0 {
					msg.all = true
					body["mention_all"] = true
				}
				sent++
				r := env.mustSend(env.Token(from, ""), topic, body)
				m.msgs[r.Seq], m.last = msg, r.Seq
			case op < 62: // a gap: a seq issued that no message will ever use, recorded as routing.Flight.RecordGap does
				n, err := env.Redis.Do(ctx, env.Redis.B().Incr().Key(env.Keys().Seq(topic)).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				v := strconv.FormatInt(n, 10)
				if err := env.Redis.Do(ctx, env.Redis.B().Zadd().Key(env.Keys().Gaps(topic)).ScoreMember().ScoreMember(float64(n), v).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				m.last = n
			case op < 72: // a recall by the sender
				if seq, msg := rsPick(rng, m, "normal"); msg != nil {
					chWaitSettled(t, env.Env, topic)
					if code, r := chRecall(t, env.Env, env.Token(msg.from, ""), topic, seq, nil); code != 200 {
						t.Fatalf("recall %d: %d %+v", seq, code, r)
					}
					msg.status = "recalled"
				}
			case op < 80: // a delete for everyone
				if seq, msg := rsPick(rng, m, ""); msg != nil && msg.status != "deleted" {
					chWaitSettled(t, env.Env, topic)
					code, out := env.Do("DELETE", chSeqPath(topic, seq)+"?scope=all", admin, nil)
					if code != 200 {
						t.Fatalf("delete %d: %d %s", seq, code, out)
					}
					msg.status = "deleted"
				}
			case op < 88: // user 11 hides a range
				if m.last > 0 {
					lo := 1 + rng.Int64N(m.last)
					hi := min(m.last+1, lo+1+rng.Int64N(3))
					code, out := env.Do("POST", "/v1/topics/"+topic+"/deletions", env.Token(11, ""), map[string]any{"low": lo, "hi": hi})
					if code != 200 {
						t.Fatalf("hide: %d %s", code, out)
					}
					m.hidden[11] = append(m.hidden[11], [2]int64{lo, hi})
				}
			default: // a cursor move from one of two devices of a random user
				if m.last > 0 {
					u := users[rng.IntN(len(users))]
					seq := rng.Int64N(m.last + 1)
					code, got := rsRead(t, env, u, topic, seq)
					m.cursor[u] = max(m.cursor[u], seq)
					if code != 200 || got != m.cursor[u] {
						t.Fatalf("read %d to %d: %d, cursor %d, want %d", u, seq, code, got, m.cursor[u])
					}
				}
			}
		}
		chWaitSettled(t, env.Env, topic)
		// each badge three times: from the hot cache, then from what this
		// process remembered of that count (the round's changes made it
		// afresh), then from the month tables with the hot cache moved
		// aside and the topic's message version moved forward, as a change
		// of its messages would, so nothing remembered answers
		hot := env.Keys().HotMessages(topic)
		for _, u := range users {
			n, men, rs := m.unread(u)
			for _, cold := range []bool{false, false, true} {
				var dump string
				if cold {
					var err error
					if dump, err = env.Redis.Do(ctx, env.Redis.B().Dump().Key(hot).Build()).ToString(); err != nil {
						t.Fatal(err)
					}
					if err := env.Redis.Do(ctx, env.Redis.B().Del().Key(hot).Build()).Error(); err != nil {
						t.Fatal(err)
					}
					rsMoveVersion(t, env, topic)
				}
				sum, by := rsUnread(t, env, u)
				if cold {
					if err := env.Redis.Do(ctx, env.Redis.B().Restore().Key(hot).Ttl(0).SerializedValue(dump).Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				if by[topic].Unread != n || by[topic].MentionUnread != men || sum.Total != n {
					t.Fatalf("round %d user %d (cold %v): unread %+v total %d, want %d (mentions %d)", round, u, cold, by[topic], sum.Total, n, men)
				}
			}
			list := rsTopics(t, env, u, 10)
			if len(list) != 1 {
				t.Fatalf("user %d: list %+v", u, list)
			}
			got := list[0]
			var lastSeq int64
			if got.LastMessage != nil {
				lastSeq = got.LastMessage.Seq
			}
			if got.Unread != n || got.MentionUnread != men || got.ReadSeq != rs || lastSeq != m.newest(u) {
				t.Fatalf("round %d user %d: list entry unread %d mentions %d read_seq %d last message %d; want %d %d %d %d",
					round, u, got.Unread, got.MentionUnread, got.ReadSeq, lastSeq, n, men, rs, m.newest(u))
			}
			if lm := got.LastMessage; lm != nil && lm.Status == "recalled" && len(lm.Content) > 0 {
				t.Fatalf("recalled last message carries its content: %s", lm.Content)
			}
		}
	}
	for _, src := range []string{"memo", "redis", "mysql"} {
		if n := persistMetric(t, env.Env, "imshard_unread_counts_total", `source="`+src+`"`); n == 0 {
			t.Errorf("no unread count came from %s", src)
		}
	}
	// mention_unread comes from the mention index alone: its entries are
	// exactly the mentions of the messages still normal, and once they are
	// gone every badge keeps its unread and loses its mentions, whether the
	// hot cache or the month tables count it
	var want []string
	for seq, msg := range m.msgs {
		if msg.status != "normal" {
			continue
		}
		if msg.all {
			want = append(want, fmt.Sprintf("0/%d", seq))
		}
		for _, u := range msg.mentions {
			want = append(want, fmt.Sprintf("%d/%d", u, seq))
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)
	if got := rsMentionEntries(t, env, topic); !slices.Equal(got, want) {
		t.Fatalf("mention index %v, want %v", got, want)
	}
	if persistMetric(t, env.Env, "imshard_mention_index_reads_total") == 0 {
		t.Fatal("no badge read the mention index")
	}
	if _, err := env.DB.Exec("DELETE FROM im_topic_mentions WHERE topic = ?", topic); err != nil {
		t.Fatal(err)
	}
	// the index changes only with the change path, which moves the topic's
	// message version; an edit by hand must do the same
	rsMoveVersion(t, env, topic)
	for _, u := range users {
		n, _, _ := m.unread(u)
		if _, by := rsUnread(t, env, u); by[topic].Unread != n || by[topic].MentionUnread != 0 {
			t.Fatalf("user %d without index entries: %+v, want %d unread and no mention", u, by[topic], n)
		}
	}
}

// rsMoveVersion moves topic's message version forward.
func rsMoveVersion(t *testing.T, env *sendEnv, topic string) {
	t.Helper()
	if err := env.Redis.Do(context.Background(), env.Redis.B().Incr().Key(env.Keys().MessagesVersion(topic)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// rsMentionEntries is the mention index of topic as "user/seq", sorted.
func rsMentionEntries(t *testing.T, env *sendEnv, topic string) []string {
	t.Helper()
	rows, err := env.DB.Query("SELECT user_id, seq FROM im_topic_mentions WHERE topic = ? ORDER BY 1, 2", topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u, seq int64
		if err := rows.Scan(&u, &seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d/%d", u, seq))
	}
	slices.Sort(out)
	return out
}

// rsPick is a random message of the model with status (any if "").
func rsPick(rng *rand.Rand, m *rsModel, status string) (int64, *rsMsg) {
	var seqs []int64
	for seq, msg := range m.msgs {
		if status == "" || msg.status == status {
			seqs = append(seqs, seq)
		}
	}
	if len(seqs) == 0 {
		return 0, nil
	}
	slices.Sort(seqs)
	seq := seqs[rng.IntN(len(seqs))]
	return seq, m.msgs[seq]
}

// TestReadCursorMonotonicAndBounded: concurrent moves from two devices end
// at the highest seq asked; a lower seq answers the cursor as it is; a seq
// above the topic's last is a 400 that changes nothing; a non-member is
// refused.
func TestReadCursorMonotonicAndBounded(t *testing.T) {
	env := rsStart(t)
	const topic = "rsmono"
	env.group(topic, 502, "active")
	env.member(topic, 21, "member", time.Time{})
	env.member(topic, 22, "member", time.Time{})
	var last int64
	for i := range 40 {
		last = env.mustSend(env.Token(22, ""), topic, sendBody(fmt.Sprintf("m-%d", i), "x")).Seq
	}
	var wg sync.WaitGroup
	for dev := range 2 {
		wg.Go(func() {
			for s := int64(dev + 1); s <= last; s += 2 {
				if code, got := rsRead(t, env, 21, topic, s); code != 200 || got < s {
					t.Errorf("read %d: %d cursor %d", s, code, got)
				}
			}
		})
	}
	wg.Wait()
	if code, got := rsRead(t, env, 21, topic, 3); code != 200 || got != last {
		t.Fatalf("lower seq: %d cursor %d, want %d", code, got, last)
	}
	if code, _ := rsRead(t, env, 21, topic, last+1); code != 400 {
		t.Fatalf("seq above the last: %d", code)
	}
	if code, _ := rsRead(t, env, 23, topic, 1); code != 403 {
		t.Fatalf("non-member: %d", code)
	}
	var n int64
	if err := env.DB.QueryRow("SELECT read_seq FROM im_user_read_cursors WHERE user_id = 21 AND topic = ?", topic).Scan(&n); err != nil || n != last {
		t.Fatalf("stored cursor %d (%v), want %d", n, err, last)
	}
}

// TestReadStateUnreadFromHotCache: a badge above a cursor the hot cache
// covers is counted from Redis alone — skipping the caller's hidden range,
// a recalled and a deleted-for-all message, counting a mention of everyone
// and not a hidden mention of the caller — and the caller's own message
// reads everything before it; no count falls back to the month tables.
func TestReadStateUnreadFromHotCache(t *testing.T) {
	env := rsStart(t)
	const topic = "rshot"
	env.group(topic, 504, "active")
	env.member(topic, 31, "member", time.Time{})
	env.member(topic, 32, "member", time.Time{})
	admin := env.Token(99, "admin")
	for i := 1; i <= 10; i++ {
		body := sendBody(fmt.Sprintf("h-%d", i), "hello")
		switch i {
		case 6:
			body["mentioned_user_ids"] = []string{"31"}
		case 10:
			body["mention_all"] = true
		}
		env.mustSend(env.Token(32, ""), topic, body)
	}
	chWaitSettled(t, env.Env, topic)
	if code, r := chRecall(t, env.Env, env.Token(32, ""), topic, 8, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r)
	}
	if code, out := env.Do("DELETE", chSeqPath(topic, 9)+"?scope=all", admin, nil); code != 200 {
		t.Fatalf("delete: %d %s", code, out)
	}
	if code, out := env.Do("POST", "/v1/topics/"+topic+"/deletions", env.Token(31, ""), map[string]any{"low": 5, "hi": 7}); code != 200 {
		t.Fatalf("hide: %d %s", code, out)
	}
	if code, _ := rsRead(t, env, 31, topic, 2); code != 200 {
		t.Fatalf("read: %d", code)
	}
	cold := persistMetric(t, env.Env, "imshard_unread_counts_total", `source="mysql"`)
	check := func(step string, unread, mentions int) {
		t.Helper()
		hot := persistMetric(t, env.Env, "imshard_unread_counts_total", `source="redis"`)
		if _, by := rsUnread(t, env, 31); by[topic].Unread != unread || by[topic].MentionUnread != mentions {
			t.Fatalf("%s: %+v, want %d unread, %d mentions", step, by[topic], unread, mentions)
		}
		if persistMetric(t, env.Env, "imshard_unread_counts_total", `source="redis"`) <= hot {
			t.Fatalf("%s: not counted from the hot cache", step)
		}
	}
	check("above the cursor", 4, 1) // 3, 4, 7, 10 (mentions everyone)
	env.mustSend(env.Token(31, ""), topic, sendBody("h-own", "mine"))
	chWaitSettled(t, env.Env, topic)
	env.mustSend(env.Token(32, ""), topic, sendBody("h-12", "after"))
	chWaitSettled(t, env.Env, topic)
	check("after the caller's own message", 1, 0)
	if n := persistMetric(t, env.Env, "imshard_unread_counts_total", `source="mysql"`); n != cold {
		t.Fatalf("%v counts fell back to the month tables", n-cold)
	}
}

// TestReadStateMentionOfCallerAndEveryoneCountsOnce: a message that names
// the caller and also mentions everyone has two entries in the mention
// index and is one mention, as it is one unread message.
func TestReadStateMentionOfCallerAndEveryoneCountsOnce(t *testing.T) {
	env := rsStart(t)
	const topic = "rsboth"
	env.group(topic, 505, "active")
	env.member(topic, 41, "member", time.Time{})
	env.member(topic, 42, "member", time.Time{})
	both := sendBody("b-1", "both")
	both["mentioned_user_ids"] = []string{"41"}
	both["mention_all"] = true
	env.mustSend(env.Token(42, ""), topic, both)
	env.mustSend(env.Token(42, ""), topic, sendBody("b-2", "plain"))
	chWaitSettled(t, env.Env, topic)
	if _, by := rsUnread(t, env, 41); by[topic].Unread != 2 || by[topic].MentionUnread != 1 {
		t.Fatalf("badge %+v, want 2 unread and 1 mention", by[topic])
	}
}

// TestReadStateUnreadCountsStoredMessagesMissingFromHotCache: messages
// stored whose sends never wrote them to the hot cache (emulated: their
// members taken out of the cache once persisted — a send whose Kafka ack
// came after it answered 503, its retry answering from the idempotency
// record) are not in flight: the badge and the list count them, from the
// month tables, instead of stopping at the newest cached message.
func TestReadStateUnreadCountsStoredMessagesMissingFromHotCache(t *testing.T) {
	env := rsStart(t)
	const topic, reader, sender = "rshotmiss", int64(33), int64(34)
	env.group(topic, 505, "active")
	env.member(topic, reader, "member", time.Time{})
	env.member(topic, sender, "member", time.Time{})
	var last int64
	for i := 1; i <= 3; i++ {
		last = env.mustSend(env.Token(sender, ""), topic, sendBody(fmt.Sprintf("hm-%d", i), "hello")).Seq
	}
	chWaitSettled(t, env.Env, topic)
	ctx := context.Background()
	if err := env.Redis.Do(ctx, env.Redis.B().Zremrangebyscore().Key(env.Keys().HotMessages(topic)).
		Min(strconv.FormatInt(last-1, 10)).Max(strconv.FormatInt(last, 10)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for read := range 2 {
		if _, by := rsUnread(t, env, reader); by[topic].Unread != 3 {
			t.Fatalf("read %d: the badge shows %+v, want 3 unread", read, by[topic])
		}
		for _, e := range rsTopics(t, env, reader, 10) {
			if e.Topic == topic && (e.Unread != 3 || e.LastSeq != last) {
				t.Fatalf("read %d: the list shows %+v, want 3 unread up to %d", read, e, last)
			}
		}
	}
}
