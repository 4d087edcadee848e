package inbox

// Remembered badges (docs/operations.md "Remembered badges").
//
// A topic's unread count, once the hot cache proved it, depends only on
// the topic's last issued seq, the caller's cursor, the messages above it
// (which change only through the change path, and that moves the topic's
// message version forward first), the caller's deletion ranges (every hide
// moves the topic's deletion-range version forward, before and after its
// insert) and, for the mentions, the mention index — complete up to the
// last seq once no seq up to it is pending, and changed after that only
// by the change path. So each query process remembers, per user, the
// counts it made with those inputs, and a later badge whose topic shows
// the same last seq and cursor reads the two versions (one GET each, in
// one round trip for all such topics) instead of the messages: equal
// versions answer the remembered count. Nothing is written per member;
// what is remembered is this process's own arithmetic.
//
// What moves a count with no version — mention-index rows or messages
// changed by hand, a dead-lettered message replayed into a seq that was a
// gap — shows once the remembered count expires: each lives between half
// and all of hot_cache.remembered_max_age, drawn, so a user's counts are made
// again a few at a time, not all in one call.

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/routing"
)

// memoKey names one user of one tenant.
type memoKey struct {
	tenant string
	user   int64
}

// remembered is a count and the inputs it was made with.
type remembered struct {
	last, cursor   int64 // the topic's last issued seq and the caller's cursor
	msgVer, hidVer int64 // the topic's message and deletion-range versions (never 0: none)
	until          int64 // unix nanoseconds after which it is made again
	readSeq, upTo  int64
	unread, ments  int32
	capped         bool
}

func (r remembered) count() unreadCount {
	return unreadCount{readSeq: r.readSeq, unread: int(r.unread), mentions: int(r.ments), capped: r.capped, upTo: r.upTo}
}

// userMemo is one user's remembered counts by topic, and their cache
// entry as this process last read it.
type userMemo struct {
	mu     sync.Mutex
	topics map[string]remembered
	entry  *entryCopy
}

// entryCopy is this process's copy of a user's cache entry (acl.Entry)
// as read whole: its generation (the field every script that writes the entry
// moves — a join's or a leave's drop deletes it), its "~" value, and its
// topics with their cursors and preferences. What it was read with never
// changes once copied (a newer read replaces the copy); the commands that read its
// topics' last seqs and versions are built once and pinned for reuse.
type entryCopy struct {
	gen, mark string
	until     int64 // unix nanoseconds after which it is read whole again
	topics    []topicCopy
	lasts     rueidis.Completed // lastCmd of its topics (none when it has none)
	// under the user's memo lock: memoStamps of topics[stampIdx], kept
	// while the next call reads the same ones
	stampIdx []int
	stamps   rueidis.Completed
}

// topicCopy is one topic of an entry's copy.
type topicCopy struct {
	topic   string
	readSeq int64
	pinned  bool
	muteMs  int64 // notify_muted_until in unix ms, 0 none
}

// keepCopy keeps a copy of the entry us was read from (gen and mark its
// "#" and "~" fields) and returns the command that reads the topics' last
// seqs — the copy's, pinned, when one is kept. An entry without a
// generation (written before it had one) is not copied.
func (b *badgeMemo) keepCopy(m *userMemo, gen, mark string, us []userTopic, lasts rueidis.Completed, now time.Time) rueidis.Completed {
	if m == nil || gen == "" {
		return lasts
	}
	if len(us) > 0 {
		lasts = lasts.Pin()
	}
	e := &entryCopy{gen: gen, mark: mark, until: lifetime(now, b.maxAge), topics: make([]topicCopy, len(us)), lasts: lasts}
	for i, u := range us {
		e.topics[i] = topicCopy{topic: u.topic, readSeq: u.readSeq, pinned: u.pinned}
		if u.notifyMute.Valid {
			e.topics[i].muteMs = u.notifyMute.Time.UnixMilli()
		}
	}
	m.mu.Lock()
	m.entry = e
	m.mu.Unlock()
	return lasts
}

// freshCopy is the copy of the user's entry when it is not too old, the indexes of
// its topics with a remembered count made at the same cursor (their
// versions are worth reading with the entry's generation: recall), and the
// command reading them when the previous call built it for the same ones.
func (m *userMemo) freshCopy(now time.Time) (e *entryCopy, idx []int, stamps rueidis.Completed, ok bool) {
	if m == nil {
		return nil, nil, stamps, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e = m.entry
	if e == nil || e.until <= now.UnixNano() {
		return nil, nil, stamps, false
	}
	for i, t := range e.topics {
		if r, ok := m.topics[t.topic]; ok && r.cursor == t.readSeq && r.until > now.UnixNano() {
			idx = append(idx, i) // the last seq is not read yet
		}
	}
	return e, idx, e.stamps, len(idx) > 0 && slices.Equal(idx, e.stampIdx)
}

// keepStamps keeps cmd, pinned, as the command reading the versions of
// e.topics[idx].
func (m *userMemo) keepStamps(e *entryCopy, idx []int, cmd rueidis.Completed) rueidis.Completed {
	cmd = cmd.Pin()
	m.mu.Lock()
	e.stampIdx, e.stamps = idx, cmd
	m.mu.Unlock()
	return cmd
}

// sameTopics reports whether an entry read whole names exactly e's
// topics.
func (e *entryCopy) sameTopics(read acl.Entry) bool {
	n := 0
	for range read.Topics() {
		n++
	}
	if n != len(e.topics) {
		return false
	}
	for _, t := range e.topics {
		if !read.Names(t.topic) {
			return false
		}
	}
	return true
}

// userTopics are the entry's topics with their cursors and preferences,
// in into's array when it is large enough.
func (e *entryCopy) userTopics(into []userTopic) []userTopic {
	us := slices.Grow(into[:0], len(e.topics))[:len(e.topics)]
	for i, t := range e.topics {
		us[i] = userTopic{topic: t.topic, readSeq: t.readSeq, pinned: t.pinned}
		if t.muteMs > 0 {
			us[i].notifyMute = sql.NullTime{Time: time.UnixMilli(t.muteMs).UTC(), Valid: true}
		}
	}
	return us
}

// badgeBuf is a badge call's arrays, kept for the next call (badgeBufs):
// a heavy user's call needs hundreds of topics, counts and versions, and
// making them afresh each time keeps the collector busy.
type badgeBuf struct {
	us  []userTopic
	pre []stamp
	out []unreadCount
}

var badgeBufs = sync.Pool{New: func() any { return new(badgeBuf) }}

// release keeps the arrays of us, pre and out (what they point to is
// dropped) and returns b to the pool.
func (b *badgeBuf) release(us []userTopic, pre []stamp, out []unreadCount) {
	clear(us)
	b.us, b.pre, b.out = us[:0], pre[:0], out[:0]
	badgeBufs.Put(b)
}

// stamp is a topic's message and deletion-range versions as read (read
// false: not read).
type stamp struct {
	msg, hid int64
	read     bool
}

// stampsFrom reads the versions of us[idx] from a memoStamps answer into
// a slice aligned with us (n long, in into's array when it is large
// enough; nil when the answer cannot be read).
func stampsFrom(res rueidis.RedisResult, n int, idx []int, into []stamp) []stamp {
	vals, err := res.ToArray()
	if err != nil {
		return nil
	}
	out := slices.Grow(into[:0], n)[:n]
	clear(out)
	for j, i := range idx {
		mv, ok1 := stampAt(vals, 2*j)
		hv, ok2 := stampAt(vals, 2*j+1)
		out[i] = stamp{msg: mv, hid: hv, read: ok1 && ok2}
	}
	return out
}

// badgeMemo is the process's remembered counts of up to users users (the
// least recently read go first); nil remembers nothing.
type badgeMemo struct {
	users  *lru.Cache[memoKey, *userMemo]
	maxAge time.Duration
}

func newBadgeMemo(users int, maxAge time.Duration) *badgeMemo {
	if users <= 0 || maxAge <= 0 {
		return nil
	}
	c, err := lru.New[memoKey, *userMemo](users)
	if err != nil {
		return nil // unreachable: users > 0
	}
	return &badgeMemo{users: c, maxAge: maxAge}
}

// userCount is how many users the memo remembers.
func (b *badgeMemo) userCount() int {
	if b == nil {
		return 0
	}
	return b.users.Len()
}

// of is the user's memo, created on first use.
func (b *badgeMemo) of(tenant string, user int64) *userMemo {
	if b == nil {
		return nil
	}
	k := memoKey{tenant, user}
	if m, ok := b.users.Get(k); ok {
		return m
	}
	fresh := &userMemo{topics: map[string]remembered{}}
	if prev, ok, _ := b.users.PeekOrAdd(k, fresh); ok {
		return prev
	}
	return fresh
}

// current reports whether r, remembered for u's topic, was made at u's last
// seq and cursor and is not too old (now in unix nanoseconds); the
// versions decide the rest.
func (r remembered) current(u userTopic, now int64) bool {
	return r.last == u.last && r.cursor == u.readSeq && r.until > now
}

// candidates are the indexes of us[hot] whose remembered count is current
// but for the versions (memoStamps).
func (m *userMemo) candidates(us []userTopic, hot []int, now time.Time) []int {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var idx []int
	for _, i := range hot {
		if r, ok := m.topics[us[i].topic]; ok && r.current(us[i], now.UnixNano()) {
			idx = append(idx, i)
		}
	}
	return idx
}

// answer sets out[i] to the remembered count of each of us[idx] that still
// is current under the versions read (pre, aligned with us), marks it in done,
// and returns how many it answered.
func (m *userMemo) answer(us []userTopic, idx []int, pre []stamp, out []unreadCount, done []bool, now time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, i := range idx {
		r, ok := m.topics[us[i].topic]
		if st := pre[i]; ok && r.current(us[i], now.UnixNano()) && st.read && st.msg == r.msgVer && st.hid == r.hidVer {
			out[i], done[i] = r.count(), true
			n++
		}
	}
	return n
}

// put remembers counts (by topic) and forgets the expired ones.
func (b *badgeMemo) put(m *userMemo, counts map[string]remembered, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for t, r := range m.topics {
		if r.until <= now.UnixNano() {
			delete(m.topics, t)
		}
	}
	for t, r := range counts {
		r.until = lifetime(now, b.maxAge)
		m.topics[t] = r
	}
}

// lifetime is when something remembered at now is made again: between
// half and all of maxAge later, drawn, so what was remembered together is
// not all made again in one call.
func lifetime(now time.Time, maxAge time.Duration) int64 {
	return now.Add(maxAge/2 + rand.N(maxAge/2+1)).UnixNano()
}

// memoStamps reads the message and deletion-range versions of us[idx],
// two per topic in one MGET (a tenant's keys share a slot).
func (s *Service) memoStamps(keys routing.Keys, us []userTopic, idx []int) rueidis.Completed {
	names := make([]string, 0, 2*len(idx))
	for _, i := range idx {
		names = append(names, keys.MessagesVersion(us[i].topic), keys.HiddenVersion(us[i].topic))
	}
	return s.p.Redis.B().Mget().Key(names...).Build()
}

// stampAt is the version at i of an MGET answer (0: none); ok is false
// when it cannot be read as one.
func stampAt(vals []rueidis.RedisMessage, i int) (int64, bool) {
	if i >= len(vals) {
		return 0, false
	}
	return stampOf(vals[i])
}

// stampOf reads a version (0: none); ok is false when it is not one.
func stampOf(m rueidis.RedisMessage) (int64, bool) {
	if m.IsNil() {
		return 0, true
	}
	n, err := m.AsInt64()
	return n, err == nil
}

// Remembered route mirrors (docs/operations.md "Remembered badges"): a
// topic list sorts every topic of the caller by its newest stored message,
// which its route mirror holds. Only storing a message moves a mirror's
// seqs and times, and every stored message took a seq first; so a mirror
// read once nothing up to the topic's last issued seq was pending holds
// until that seq moves. Each query process remembers such mirrors for
// hot_cache.local_routes topics, and a list reads MySQL only for the
// mirrors whose topic's last seq moved. What moves a mirror without a seq —
// a route check's fix, a legacy migration's copy (nothing is remembered
// while the tenant migrates) — shows within hot_cache.remembered_max_age,
// the entries' lifetime.

// routeMemo is the process's remembered mirrors by tenant and topic, at
// most max of them (when full, an arbitrary one goes: a list reads
// hundreds at a time, so reads take only a shared lock and move nothing);
// nil remembers nothing.
type routeMemo struct {
	mu       sync.RWMutex
	byTenant map[string]map[string]rememberedRoute
	n, max   int
	maxAge   time.Duration
}

// rememberedRoute is a mirror and the last issued seq it holds up to.
type rememberedRoute struct {
	m     routing.TopicMirror
	last  int64
	until int64 // unix nanoseconds
}

func newRouteMemo(topics int, maxAge time.Duration) *routeMemo {
	if topics <= 0 || maxAge <= 0 {
		return nil
	}
	return &routeMemo{byTenant: map[string]map[string]rememberedRoute{}, max: topics, maxAge: maxAge}
}

// topicCount is how many mirrors the memo remembers.
func (r *routeMemo) topicCount() int {
	if r == nil {
		return 0
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.n
}

// recall sets the mirror of each of us whose topic's last seq is the one
// remembered with it, and returns the indexes of the others.
func (r *routeMemo) recall(tenant string, us []userTopic, now time.Time) []int {
	var missed []int
	if r == nil {
		for i := range us {
			missed = append(missed, i)
		}
		return missed
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	topics := r.byTenant[tenant]
	for i, u := range us {
		if m, ok := topics[u.topic]; ok && u.last >= 0 && m.last == u.last && m.until > now.UnixNano() {
			us[i].mirror = m.m
			continue
		}
		missed = append(missed, i)
	}
	return missed
}

// add remembers m as topic's mirror up to last.
func (r *routeMemo) add(tenant, topic string, m routing.TopicMirror, last int64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	topics := r.byTenant[tenant]
	if topics == nil {
		topics = map[string]rememberedRoute{}
		r.byTenant[tenant] = topics
	}
	if _, ok := topics[topic]; !ok {
		if r.n >= r.max {
			r.evictOne()
		}
		r.n++
	}
	topics[topic] = rememberedRoute{m: m, last: last, until: lifetime(now, r.maxAge)}
}

// evictOne forgets one remembered mirror (whichever the map yields first).
func (r *routeMemo) evictOne() {
	for tenant, topics := range r.byTenant {
		for topic := range topics {
			delete(topics, topic)
			r.n--
			if len(topics) == 0 {
				delete(r.byTenant, tenant)
			}
			return
		}
	}
}

// listTopics is the caller's topics for a topic list: their memberships
// of groups not dissolved with cursors and preferences from the user's
// cache entry (MySQL when it is incomplete) and the last issued seqs
// (memberships), then the route mirrors — remembered where the topic's
// last seq did not move, the others read from MySQL and remembered when no
// seq up to that last one was pending before they were read. A tenant
// being migrated reads all of it from MySQL (loadTopics); read reports
// whether the last seqs and cursors were read (not then).
func (s *Service) listTopics(ctx context.Context, db *sql.DB, tenant string, user int64) (us []userTopic, read bool, err error) {
	st, err := s.p.Migrations.State(ctx, tenant)
	if err != nil {
		return nil, false, err
	}
	if st.DualRead() {
		us, err = s.loadTopics(ctx, db, user, false)
		return us, false, err
	}
	keys, err := s.p.KeySpace.Tenant(tenant)
	if err != nil {
		return nil, false, err
	}
	us, _, err = s.memberships(ctx, db, tenant, keys, user, nil)
	if err != nil || len(us) == 0 {
		return us, true, err
	}
	now := time.Now()
	missed := s.routes.recall(tenant, us, now)
	s.m.routeMemo.WithLabelValues("hit").Add(float64(len(us) - len(missed)))
	if len(missed) == 0 {
		return us, true, nil
	}
	s.m.routeMemo.WithLabelValues("miss").Add(float64(len(missed)))
	// the lowest pending seq of each, before the mirrors are read
	var pending []rueidis.RedisResult
	if s.routes != nil {
		cmds := make([]rueidis.Completed, len(missed))
		for j, i := range missed {
			cmds[j] = s.p.Flight.LowestPendingCmd(keys, us[i].topic)
		}
		pending = s.p.Redis.DoMulti(ctx, cmds...)
	}
	names := make([]string, len(missed))
	for j, i := range missed {
		names[j] = us[i].topic
	}
	var mirrors map[string]routing.TopicMirror
	if 4*len(missed) > len(us) {
		// many: the one statement of fixed shape through the user's
		// memberships, and by topic those it misses
		mirrors, err = acl.MemberMirrors(ctx, s.st, db, user)
		if err == nil {
			err = completeMirrors(ctx, db, mirrors, names)
		}
	} else {
		mirrors, err = routing.LoadMirrorMany(ctx, db, names)
	}
	if err != nil {
		return nil, false, err
	}
	for j, i := range missed {
		m := mirrors[us[i].topic]
		us[i].mirror = m
		if s.routes == nil {
			continue
		}
		if last := us[i].last; last > 0 && routing.NonePendingThrough(pending[j], last) {
			s.routes.add(tenant, us[i].topic, m, last, now)
		}
	}
	return us, true, nil
}
