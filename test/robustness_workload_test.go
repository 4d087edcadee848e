package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/test/robustness"
)

// rbUsers are the members of a run: user ids 1..rbUsers.
const rbUsers = 8

// rbSize is how much a run does.
type rbSize struct {
	topics   int           // groups at the start
	workload time.Duration // how long the actors and the faults run
	faults   bool          // inject faults (the broken-build runs do without)
	pace     time.Duration // mean pause between one actor's requests
	settle   time.Duration // at most this long waiting for persist to catch up before Quiesce
}

// rbState is what the actors believe about the system, from the answers
// they got: which topics are live, who is a member, which sends were
// acknowledged (with the version last seen) — enough to aim requests at
// real targets. The checkers never read it; they read the history.
type rbState struct {
	mu      sync.Mutex
	seed    uint64
	topics  []string         // live topics
	all     []string         // every topic ever created (admin walks)
	gids    map[string]int64 // topic's group id
	members map[string]map[int64]bool
	sent    map[string][]*rbSent
	nextGID int64
	nextCM  int
}

type rbSent struct {
	seq     int64
	id      string
	from    int64
	cmid    string
	version int64
}

func (s *rbState) pickTopic(r *rand.Rand, user int64) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var mine []string
	for _, tp := range s.topics {
		if s.members[tp][user] {
			mine = append(mine, tp)
		}
	}
	// now and then a topic the user is believed not to be in: the races
	// of a leave with the user's own requests are worth recording
	if len(mine) == 0 || r.IntN(8) == 0 {
		return s.topics[r.IntN(len(s.topics))], false
	}
	return mine[r.IntN(len(mine))], true
}

func (s *rbState) pickSent(r *rand.Rand, topic string, from int64) *rbSent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pool []*rbSent
	for _, m := range s.sent[topic] {
		if from == 0 || m.from == from {
			pool = append(pool, m)
		}
	}
	if len(pool) == 0 {
		return nil
	}
	// recent messages more often: that is where the races are
	if r.IntN(2) == 0 && len(pool) > 5 {
		pool = pool[len(pool)-5:]
	}
	return pool[r.IntN(len(pool))]
}

func (s *rbState) maxSeq(topic string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var top int64
	for _, m := range s.sent[topic] {
		top = max(top, m.seq)
	}
	return top
}

func (s *rbState) acked(op robustness.Op) {
	if !op.Acked() || len(op.Messages) == 0 {
		return
	}
	m := op.Messages[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, old := range s.sent[op.Topic] {
		if old.seq == m.Seq {
			return
		}
	}
	s.sent[op.Topic] = append(s.sent[op.Topic], &rbSent{seq: m.Seq, id: m.MessageID, from: op.User, cmid: op.ClientMsgID, version: 1})
}

func (s *rbState) versioned(op robustness.Op, sent *rbSent) {
	if op.Acked() && len(op.Messages) == 1 {
		s.mu.Lock()
		sent.version = max(sent.version, op.Messages[0].Version)
		s.mu.Unlock()
	}
}

func (s *rbState) cmid(user int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextCM++
	return fmt.Sprintf("s%d-u%d-%d", s.seed%1000, user, s.nextCM)
}

// rbRun is one run: the cluster, the recording client, the believed state.
type rbRun struct {
	t    *testing.T
	c    *rbCluster
	cl   *rbClient
	h    *robustness.History
	st   *rbState
	seed uint64
	size rbSize
}

func newRBRun(t *testing.T, c *rbCluster, seed uint64, size rbSize) *rbRun {
	h := &robustness.History{}
	run := &rbRun{t: t, c: c, cl: newRBClient(t, c, h), h: h, seed: seed, size: size,
		st: &rbState{seed: seed, gids: map[string]int64{}, members: map[string]map[int64]bool{}, sent: map[string][]*rbSent{}, nextGID: 100}}
	for i := range size.topics {
		// overlapping memberships: every user is in most topics, none in all
		run.create(0, fmt.Sprintf("g%d", i), func(u int64) bool { return (u+int64(i))%4 != 0 })
	}
	return run
}

// create makes topic's group (a fresh group id) with the members in, each
// join recorded.
func (run *rbRun) create(actor int, topic string, in func(int64) bool) {
	st := run.st
	st.mu.Lock()
	st.nextGID++
	gid := st.nextGID
	st.mu.Unlock()
	if op := run.cl.group(actor, 0, topic, gid, "active"); !op.Acked() {
		// a fault may be under way: the topic is tried again by its members
		run.t.Logf("create %s: %d %s", topic, op.Status, op.Err)
	}
	members := map[int64]bool{}
	for u := int64(1); u <= rbUsers; u++ {
		if !in(u) {
			continue
		}
		if op := run.cl.member(actor, 0, topic, u, true); op.Acked() {
			members[u] = true
		}
	}
	st.mu.Lock()
	st.topics = append(st.topics, topic)
	st.all = append(st.all, topic)
	st.gids[topic], st.members[topic] = gid, members
	st.mu.Unlock()
}

func (run *rbRun) pause(r *rand.Rand) {
	time.Sleep(run.size.pace/2 + time.Duration(r.Int64N(int64(run.size.pace)+1)))
}

// workload runs every actor until ctx ends, then waits for them.
func (run *rbRun) workload(ctx context.Context) {
	var wg sync.WaitGroup
	actor := 0
	spawn := func(f func(ctx context.Context, actor int, r *rand.Rand)) {
		actor++
		a := actor
		r := rand.New(rand.NewPCG(run.seed, uint64(a)))
		wg.Go(func() { f(ctx, a, r) })
	}
	for u := int64(1); u <= rbUsers; u++ {
		spawn(func(ctx context.Context, a int, r *rand.Rand) { run.member(ctx, a, r, u) })
	}
	spawn(run.admin)
	spawn(run.reader)
	spawn(func(ctx context.Context, a int, r *rand.Rand) { run.follower(ctx, a, r, 1, true) })
	spawn(func(ctx context.Context, a int, r *rand.Rand) { run.follower(ctx, a, r, 2, false) })
	spawn(func(ctx context.Context, a int, r *rand.Rand) { run.multi(ctx, a, r, 3) })
	wg.Wait()
}

// member is one user: sending (retrying with the same client_msg_id,
// sometimes repeating an old one), recalling, editing (often two edits on
// one version at once), hiding, moving the read cursor from two devices.
func (run *rbRun) member(ctx context.Context, actor int, r *rand.Rand, user int64) {
	cl, st := run.cl, run.st
	var sent []robustness.Op
	syncTokens := map[int]string{}
	for ctx.Err() == nil {
		run.pause(r)
		node := r.IntN(2)
		topic, _ := st.pickTopic(r, user)
		switch n := r.IntN(100); {
		case n < 35:
			cmid, text := st.cmid(user), ""
			// now and then mentioning one or two users, or everyone, so
			// mention_unread has something to count
			var mentions []int64
			mentionAll := r.IntN(12) == 0
			if r.IntN(3) == 0 {
				for range 1 + r.IntN(2) {
					if u := 1 + r.Int64N(rbUsers); !slices.Contains(mentions, u) {
						mentions = append(mentions, u)
					}
				}
			}
			if len(sent) > 0 && r.IntN(10) == 0 {
				// a deliberate repeat: answered with the original message
				// (its mentions kept, so the history names the stored ones)
				old := sent[r.IntN(len(sent))]
				topic, cmid, mentions, mentionAll = old.Topic, old.ClientMsgID, old.Mentions, old.MentionAll
				text = "again " + cmid
			} else {
				text = "text " + cmid
			}
			for attempt := 0; attempt < 4; attempt++ {
				op := cl.send(actor, node+attempt, user, topic, cmid, text, mentions, mentionAll)
				st.acked(op)
				if op.Acked() {
					sent = append(sent, op)
				}
				if !op.Unknown() {
					break
				}
			}
		case n < 40:
			if m := st.pickSent(r, topic, user); m != nil {
				st.versioned(cl.recall(actor, node, user, topic, m.seq), m)
			}
		case n < 50:
			m := st.pickSent(r, topic, user)
			if m == nil {
				continue
			}
			st.mu.Lock()
			v := m.version
			st.mu.Unlock()
			racers := 1 + r.IntN(2)
			var wg sync.WaitGroup
			for i := range racers {
				wg.Go(func() {
					st.versioned(cl.edit(actor, node+i, user, topic, m.seq, v, fmt.Sprintf("edit %d.%d %s", v, i, m.cmid)), m)
				})
			}
			wg.Wait()
		case n < 53:
			if top := st.maxSeq(topic); top > 0 {
				low := 1 + r.Int64N(top)
				cl.hide(actor, node, user, topic, low, min(top+1, low+1+r.Int64N(3)))
			}
		case n < 65:
			if top := st.maxSeq(topic); top > 0 {
				cl.cursor(actor, node, user, 1+r.IntN(2), topic, 1+r.Int64N(top))
			}
		case n < 72:
			cl.list(actor, node, user)
		case n < 79:
			cl.unread(actor, node, user)
		case n < 86:
			dev := 1 + r.IntN(2)
			_, syncTokens[dev], _ = cl.sync(actor, node, user, dev, syncTokens[dev])
		case n < 93:
			if m := st.pickSent(r, topic, 0); m != nil {
				cl.one(actor, node, user, "", 0, m.id)
			}
		default:
			if top := st.maxSeq(topic); top > 0 {
				cl.one(actor, node, user, topic, 1+r.Int64N(top), "")
			}
		}
	}
}

// admin joins and removes members, deletes messages for everyone, and
// once dissolves a group and creates a new one under a fresh topic.
func (run *rbRun) admin(ctx context.Context, actor int, r *rand.Rand) {
	cl, st := run.cl, run.st
	dissolved := false
	start := time.Now()
	for ctx.Err() == nil {
		run.pause(r)
		run.pause(r)
		node := r.IntN(2)
		st.mu.Lock()
		topic := st.topics[r.IntN(len(st.topics))]
		st.mu.Unlock()
		switch n := r.IntN(10); {
		case n < 5:
			user := 1 + r.Int64N(rbUsers)
			st.mu.Lock()
			in := st.members[topic][user]
			st.mu.Unlock()
			if op := cl.member(actor, node, topic, user, !in); op.Acked() {
				st.mu.Lock()
				st.members[topic][user] = !in
				st.mu.Unlock()
			}
		case n < 8:
			if m := st.pickSent(r, topic, 0); m != nil {
				st.versioned(cl.deleteAll(actor, node, topic, m.seq), m)
			}
		default:
			if dissolved || time.Since(start) < run.size.workload/3 {
				continue
			}
			dissolved = true
			st.mu.Lock()
			gid := st.gids[topic]
			st.mu.Unlock()
			if op := cl.group(actor, node, topic, gid, "dissolved"); op.Acked() {
				st.mu.Lock()
				st.topics = slices.DeleteFunc(st.topics, func(t string) bool { return t == topic })
				st.mu.Unlock()
				run.create(actor, fmt.Sprintf("r%d-%s", run.seed%1000, topic), func(u int64) bool { return u%3 != 0 })
			}
		}
	}
}

// reader walks since chains and before pages of topics as their members.
func (run *rbRun) reader(ctx context.Context, actor int, r *rand.Rand) {
	for ctx.Err() == nil {
		run.pause(r)
		user := 1 + r.Int64N(rbUsers)
		topic, _ := run.st.pickTopic(r, user)
		node := r.IntN(2)
		if r.IntN(2) == 0 {
			run.walkSince(ctx, actor, node, user, topic, 1+r.IntN(20))
			continue
		}
		var before int64
		for pages := 0; pages < 5 && ctx.Err() == nil; pages++ {
			op := run.cl.before(actor, node, user, topic, before, 1+r.IntN(20))
			if !op.Acked() || !op.HasMore || len(op.Messages) == 0 {
				break
			}
			before = op.Messages[len(op.Messages)-1].Seq
		}
	}
}

// walkSince follows topic's since chain from 0 until a page says there is
// no more (or an answer fails); false if it did not get there.
func (run *rbRun) walkSince(ctx context.Context, actor, node int, user int64, topic string, limit int) bool {
	var since int64
	for pages := 0; pages < 1000; pages++ {
		if ctx.Err() != nil {
			return false
		}
		op := run.cl.since(actor, node, user, topic, since, limit)
		if !op.Acked() {
			return false
		}
		if !op.HasMore {
			return true
		}
		since = op.NextSince
	}
	return false
}

// follower follows one topic at a time over a single-topic socket, with
// since (resuming from its kept cursors after every disconnect) or without.
func (run *rbRun) follower(ctx context.Context, actor int, r *rand.Rand, user int64, withSince bool) {
	cursors := map[string]*rbCursors{}
	for ctx.Err() == nil {
		topic, _ := run.st.pickTopic(r, user)
		cur := cursors[topic]
		if cur == nil {
			cur = &rbCursors{changes: -1}
			cursors[topic] = cur
		}
		q, open := url.Values{}, robustness.Op{Client: actor, User: user, Topic: topic, Since: -1, ChangesSince: -1}
		if withSince {
			open.Since = cur.seq
			q.Set("since", fmt.Sprint(cur.seq))
			if cur.changes >= 0 {
				open.ChangesSince = cur.changes
				q.Set("changes_since", fmt.Sprint(cur.changes))
			}
		}
		path := rbTopicPath(topic) + "/stream"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		run.cl.stream(ctx, open, r.IntN(2), path, time.Duration(500+r.IntN(2500))*time.Millisecond, cursors, nil)
		run.pause(r)
	}
}

// multi follows topics the user is believed to be in over one multi-topic
// socket, reconnecting now and then; while the socket is open
// it unsubscribes topics and subscribes others (from a since a little
// below their last acknowledged seq).
func (run *rbRun) multi(ctx context.Context, actor int, r *rand.Rand, user int64) {
	for ctx.Err() == nil {
		run.st.mu.Lock()
		var topics []string
		for _, tp := range run.st.topics {
			// most of the user's topics, and now and then another's: the
			// rest are there to subscribe to later
			if (run.st.members[tp][user] && r.IntN(3) != 0) || r.IntN(6) == 0 {
				topics = append(topics, tp)
			}
		}
		run.st.mu.Unlock()
		if len(topics) == 0 {
			run.pause(r)
			continue
		}
		cursors := map[string]*rbCursors{}
		for _, tp := range topics {
			cursors[tp] = &rbCursors{changes: -1}
		}
		open := robustness.Op{Client: actor, User: user, Since: -1, ChangesSince: -1, StreamTopics: topics}
		node, d := r.IntN(2), time.Duration(1000+r.IntN(3000))*time.Millisecond
		// r is the control's while the socket is open: this goroutine
		// waits in stream until it returned
		run.cl.stream(ctx, open, node, "/v1/stream?topics="+url.QueryEscape(strings.Join(topics, ",")), d, cursors,
			func(ctx context.Context, send func(robustness.Op, any) error) {
				run.subscriptions(ctx, r, topics, send)
			})
		run.pause(r)
	}
}

// subscriptions changes a multi-topic socket's topics until ctx ends: an
// unsubscribe of a followed topic or a subscribe of one it never followed
// (a topic followed again on the same socket could take a frame of its
// first subscription for one of the second).
func (run *rbRun) subscriptions(ctx context.Context, r *rand.Rand, topics []string, send func(robustness.Op, any) error) {
	following, seen := slices.Clone(topics), map[string]bool{}
	for _, tp := range topics {
		seen[tp] = true
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(3*run.size.pace + time.Duration(r.Int64N(int64(6*run.size.pace)+1))):
		}
		if len(following) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(following))
			tp := following[i]
			following = slices.Delete(following, i, i+1)
			if send(robustness.Op{Kind: robustness.StreamUnsubscribe, Topic: tp},
				map[string]any{"type": "unsubscribe", "topics": []string{tp}}) != nil {
				return
			}
			continue
		}
		run.st.mu.Lock()
		var fresh []string
		for _, tp := range run.st.topics {
			if !seen[tp] {
				fresh = append(fresh, tp)
			}
		}
		run.st.mu.Unlock()
		if len(fresh) == 0 {
			continue
		}
		tp := fresh[r.IntN(len(fresh))]
		since := max(0, run.st.maxSeq(tp)-r.Int64N(8))
		seen[tp], following = true, append(following, tp)
		if send(robustness.Op{Kind: robustness.StreamSubscribe, Topic: tp, Since: since, ChangesSince: -1},
			map[string]any{"type": "subscribe", "topics": map[string]any{tp: map[string]any{"since": since}}}) != nil {
			return
		}
	}
}
