package inbox

// The read state's Redis side (docs/operations.md "Read state").
//
// Memberships and cursors: each user's cached entry of their topics of
// groups not dissolved with their cursors and preferences is modules/acl's
// (acl.Entry): it is read here, whole (acl.EntryCmds) or only its
// generation (acl.HeldCmds), and filled from MySQL by acl.FillCursors
// when incomplete, so the badges read no MySQL membership.
//
// Counts: a topic's messages above a cursor are read from its hot cache
// (the newest day of messages, written by the send before its 201) in
// one pipelined round trip for all the user's topics with something above
// their cursor, walked with the same proof as a page (every seq cached or a
// recorded gap); a topic the cache cannot prove falls back to the month
// tables (countMany). The mentions come from the mention index in MySQL,
// read at the same time (mentionSeqs).

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// unreadSlack is how many cached seqs beyond the cap a count reads, for
// hidden, deleted and the caller's own messages.
const unreadSlack = 25

// raiseCursors raises each topic's readSeq — the cursor MySQL, the owner,
// holds, read with the memberships that named the topic — to the one the
// user's cache entry read by acl.EntryCmds holds, when higher: a move whose
// write is under way raised its field already. The entry only narrows: a
// topic it does not name (a join or leave committed between the two reads,
// its drop still to come), or an incomplete or unreadable entry, leaves
// MySQL's cursor as it is — the cache not naming a topic says nothing of
// its cursor, never that it is 0.
func raiseCursors(res []rueidis.RedisResult, us []userTopic) {
	e, _ := acl.ReadEntry(res)
	for i := range us {
		us[i].readSeq = max(us[i].readSeq, e.Raised(us[i].topic))
	}
}

// dropMalformed drops an entry holding a value that is neither a cursor nor
// preferences, best effort: the fill that follows would keep a higher
// stray value.
func (s *Service) dropMalformed(ctx context.Context, keys routing.Keys, user int64) {
	s.p.Log.Warn().Int64("user", user).Msg("malformed cached read cursors; dropped, reading MySQL")
	_ = s.p.ACL.DropCursors(ctx, keys, user)
}

// cursorsFromMySQL reads the user's memberships of groups not dissolved
// with their cursors from MySQL and, when Redis answered (fillCache), puts
// them in the cache entry (acl.FillCursors).
func (s *Service) cursorsFromMySQL(ctx context.Context, db *sql.DB, keys routing.Keys, user int64, fillCache bool) ([]userTopic, error) {
	if fillCache {
		s.m.cursorCache.WithLabelValues("miss").Inc()
	} else {
		s.m.cursorCache.WithLabelValues("error").Inc()
		s.p.Log.Warn().Int64("user", user).Msg("read-cursor cache unavailable; MySQL answers")
	}
	ms, err := s.p.ACL.FillCursors(ctx, s.st, db, keys, user, fillCache)
	if err != nil {
		return nil, err
	}
	return topicsOf(ms), nil
}

// cursorsFrom sets each topic's readSeq and preferences from a complete
// cache entry (0 for a topic it does not name); false if a value is not a
// cursor or a preferences field.
func cursorsFrom(e acl.Entry, us []userTopic) bool {
	for i := range us {
		st, ok := e.State(us[i].topic)
		if !ok {
			return false
		}
		us[i].readSeq, us[i].pinned, us[i].notifyMute = st.ReadSeq, st.Pinned, st.NotifyMute
	}
	return true
}

// memberships is the user's topics (groups not dissolved) with their
// cursors and last issued seqs, for the unread badges and the topic list:
// from the cache entry when it is complete — the entry's topics, then their
// last seqs in a second round trip — else from MySQL (filling the entry)
// and then the last seqs. No MySQL read while the entry is complete: it is
// dropped by every membership change and read again after every change of
// a group (the groups epoch). Once this process keeps a copy of the entry
// as it read it (the user's memo), a call reads only its generation and "~" fields,
// with the last seqs in the same round trip, and — with stamps — the
// versions of the topics with a count remembered at their cursor (aligned
// with us, for recall); an entry that moved since is read whole. A badge
// call passes its arrays (buf): the versions are read then, into them; a
// list's (nil) only its topics.
func (s *Service) memberships(ctx context.Context, db *sql.DB, tenant string, keys routing.Keys, user int64, buf *badgeBuf) ([]userTopic, []stamp, error) {
	memo := s.memo.of(tenant, user)
	now := time.Now()
	tried, ok := s.membershipsFromCopy(ctx, keys, memo, user, buf, now)
	if ok {
		return tried.us, tried.pre, nil
	}
	e, rerr := acl.ReadEntry(s.p.Redis.DoMulti(ctx, acl.EntryCmds(s.p.Redis, keys, user)...))
	if rerr == nil && e.Complete() {
		if tried != nil && tried.e.sameTopics(e) {
			// the entry moved (a cursor, a preference) but names the same
			// topics: the last seqs and versions read with the copy
			// stand, in its order, and so do its read commands
			us := tried.us
			if cursorsFrom(e, us) {
				s.m.cursorCache.WithLabelValues("moved").Inc()
				s.memo.keepCopy(memo, e.Gen(), e.Mark(), us, tried.e.lasts, now)
				return us, tried.pre, nil
			}
		}
		us := make([]userTopic, 0, e.Size())
		for t := range e.Topics() {
			us = append(us, userTopic{topic: t})
		}
		if cursorsFrom(e, us) {
			s.m.cursorCache.WithLabelValues("hit").Inc()
			var lasts rueidis.Completed
			if len(us) > 0 {
				lasts = s.lastCmd(keys, us)
			}
			lasts = s.memo.keepCopy(memo, e.Gen(), e.Mark(), us, lasts, now)
			if len(us) > 0 {
				applyLasts(s.p.Redis.Do(ctx, lasts), us)
			}
			return us, nil, nil
		}
		s.dropMalformed(ctx, keys, user)
	}
	us, err := s.cursorsFromMySQL(ctx, db, keys, user, rerr == nil)
	if err != nil {
		return nil, nil, err
	}
	for i := range us {
		// a move whose write is under way raised its field already
		us[i].readSeq = max(us[i].readSeq, e.Raised(us[i].topic))
	}
	s.readInputs(ctx, keys, user, us, false)
	return us, nil, nil
}

// copyRead is what a call read with an entry's copy: its topics with
// their last seqs (cursors and preferences as copied), and the versions
// (pre).
type copyRead struct {
	e   *entryCopy
	us  []userTopic
	pre []stamp
}

// membershipsFromCopy is memberships from this process's copy of the entry, when
// its generation and "~" are still the ones in Redis at the current groups
// epoch (ok). When they moved, the reads made with it are returned (not
// ok): an entry read whole that names the same topics reuses them. Nil
// when no copy is kept or Redis failed.
func (s *Service) membershipsFromCopy(ctx context.Context, keys routing.Keys, memo *userMemo, user int64, buf *badgeBuf, now time.Time) (tried *copyRead, ok bool) {
	e, idx, sc, built := memo.freshCopy(now)
	if e == nil {
		return nil, false
	}
	rdb := s.p.Redis
	var into []userTopic
	if buf != nil {
		into = buf.us
	}
	us := e.userTopics(into)
	cmds := acl.HeldCmds(rdb, keys, user)
	if len(us) > 0 {
		cmds = append(cmds, e.lasts)
	}
	if buf != nil && len(idx) > 0 {
		if !built {
			sc = memo.keepStamps(e, idx, s.memoStamps(keys, us, idx))
		}
		cmds = append(cmds, sc)
	}
	res := rdb.DoMulti(ctx, cmds...)
	h, ok := acl.ReadHeld(res[:2])
	if !ok {
		return nil, false
	}
	tried = &copyRead{e: e, us: us}
	if len(us) > 0 {
		applyLasts(res[2], us)
	}
	if len(cmds) > 3 {
		tried.pre = stampsFrom(res[3], len(us), idx, buf.pre)
	}
	if !h.Complete || h.Mark != e.mark || h.Gen != e.gen {
		return tried, false
	}
	s.m.cursorCache.WithLabelValues("held").Inc() // the metric's name for an answer from the copy
	return tried, true
}

// lastCmd reads the last issued seq of each topic (one MGET: a tenant's
// keys share a slot); applyLasts sets userTopic.last from it (-1: no
// counter).
func (s *Service) lastCmd(keys routing.Keys, us []userTopic) rueidis.Completed {
	names := make([]string, len(us))
	for i, u := range us {
		names[i] = keys.Seq(u.topic)
	}
	return s.p.Redis.B().Mget().Key(names...).Build()
}

func applyLasts(res rueidis.RedisResult, us []userTopic) {
	vals, err := res.ToArray()
	for i := range us {
		us[i].last = -1
		if err != nil || i >= len(vals) {
			continue
		}
		if n, err := vals[i].AsInt64(); err == nil {
			us[i].last = n
		}
	}
}

// readInputs learns, in one Redis round trip, each topic's last issued
// seq and (raise) the cursors of the user's cache entry above those us
// carries from MySQL (raiseCursors).
func (s *Service) readInputs(ctx context.Context, keys routing.Keys, user int64, us []userTopic, raise bool) {
	if len(us) == 0 {
		return
	}
	cmds := []rueidis.Completed{s.lastCmd(keys, us)}
	if raise {
		cmds = append(cmds, acl.EntryCmds(s.p.Redis, keys, user)...)
	}
	res := s.p.Redis.DoMulti(ctx, cmds...)
	applyLasts(res[0], us)
	if raise {
		raiseCursors(res[1:], us)
	}
}

// counts is the unread state of each of us (readSeq and last set by
// readInputs): remembered by this process where the inputs did not change
// (readstate_memo.go), else from the hot cache where it proves the answer,
// else from the month tables (loading the route mirrors of those topics
// unless mirrored). The mentions of the topics counted afresh come from
// the mention index, read beside the month tables' counts.
func (s *Service) counts(ctx context.Context, db *sql.DB, tenant string, keys routing.Keys, user int64, us []userTopic, mirrored bool, pre []stamp, into []unreadCount) ([]unreadCount, error) {
	out := slices.Grow(into[:0], len(us))[:len(us)]
	clear(out)
	var hot, cold []int
	for i, u := range us {
		out[i].readSeq = u.readSeq
		switch {
		case u.last < 0:
			cold = append(cold, i)
		case u.last > u.readSeq:
			hot = append(hot, i)
		}
	}
	now := time.Now()
	var memo *userMemo
	if len(hot) > 0 {
		if st, err := s.p.Migrations.State(ctx, tenant); err == nil && !st.DualRead() {
			memo = s.memo.of(tenant, user)
		}
	}
	hot = s.recall(ctx, keys, memo, us, hot, out, pre, now)
	fresh, cold, err := s.countHot(ctx, db, tenant, keys, user, us, hot, cold, out, memo != nil)
	if err != nil {
		return nil, err
	}
	// the mention index of the topics counted afresh with something
	// unread, and of those the month tables count, read beside them
	var names []string
	var after []int64
	for _, i := range hot {
		if out[i].unread > 0 {
			names, after = append(names, us[i].topic), append(after, us[i].readSeq)
		}
	}
	for _, i := range cold {
		names, after = append(names, us[i].topic), append(after, us[i].readSeq)
	}
	var mentions map[string][]int64
	var merr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		if len(names) > 0 {
			mentions, merr = s.st.mentionSeqs(ctx, db, user, names, after)
			s.m.mentionReads.Add(float64((len(names) + mentionBranches - 1) / mentionBranches))
		}
	}()
	err = s.countCold(ctx, db, tenant, user, us, mirrored, cold, out)
	<-read
	if err != nil {
		return nil, err
	}
	if merr != nil {
		return nil, merr
	}
	mentionCounts(us, mentions, out)
	if len(fresh) > 0 {
		byTopic := make(map[string]remembered, len(fresh))
		for i, r := range fresh {
			c := out[i]
			r.readSeq, r.upTo, r.unread, r.ments, r.capped = c.readSeq, c.upTo, int32(c.unread), int32(c.mentions), c.capped
			byTopic[us[i].topic] = r
		}
		s.memo.put(memo, byTopic, now)
	}
	return plusOne(out), nil
}

// recall answers the topics of us[hot] whose remembered count still holds
// (their versions: those pre holds, read with the memberships, and one MGET
// of the others) and returns the others. A failed read leaves them all to
// be counted.
func (s *Service) recall(ctx context.Context, keys routing.Keys, memo *userMemo, us []userTopic, hot []int, out []unreadCount, pre []stamp, now time.Time) []int {
	idx := memo.candidates(us, hot, now)
	if len(idx) == 0 {
		return hot
	}
	var unread []int
	for _, i := range idx {
		if pre == nil || !pre[i].read {
			unread = append(unread, i)
		}
	}
	if len(unread) > 0 {
		read := stampsFrom(s.p.Redis.Do(ctx, s.memoStamps(keys, us, unread)), len(us), unread, nil)
		if read == nil {
			return hot
		}
		if pre == nil {
			pre = read
		} else {
			for _, i := range unread {
				pre[i] = read[i]
			}
		}
	}
	done := make([]bool, len(us))
	s.m.unreadFrom.WithLabelValues("memo").Add(float64(memo.answer(us, idx, pre, out, done, now)))
	rest := hot[:0:0]
	for _, i := range hot {
		if !done[i] {
			rest = append(rest, i)
		}
	}
	return rest
}

// countHot makes the counts of us[hot] from the hot cache where it proves
// them into out, and returns the topics to count from the month tables
// (cold and those the cache could not prove). With remember, it also
// returns the inputs of the counts that may be remembered (by index of
// us): proven up to the counter read with them, under the versions read
// before the messages and ranges, with no seq up to the counter pending,
// so that the mention index read after this holds every mention up to it.
func (s *Service) countHot(ctx context.Context, db *sql.DB, tenant string, keys routing.Keys, user int64, us []userTopic, hot, cold []int, out []unreadCount, remember bool) (map[int]remembered, []int, error) {
	if len(hot) == 0 {
		return nil, cold, nil
	}
	rdb := s.p.Redis
	const per = readpath.NewestCmdCount
	n := len(hot)
	cmds := make([]rueidis.Completed, 0, (per+3)*n)
	for _, i := range hot {
		u := us[i]
		cmds = append(cmds, s.r.NewestCmds(keys, countRead(u))...)
	}
	if remember {
		// before the ranges: a hide moves it forward before and after its insert
		for _, i := range hot {
			cmds = append(cmds, rdb.B().Get().Key(keys.HiddenVersion(us[i].topic)).Build())
		}
	}
	for _, i := range hot {
		cmds = append(cmds, s.r.HiddenCmds(keys, us[i].topic, user)...)
	}
	if remember {
		// after the messages: the lowest seq not stored yet
		for _, i := range hot {
			cmds = append(cmds, s.p.Flight.LowestPendingCmd(keys, us[i].topic))
		}
	}
	res := rdb.DoMulti(ctx, cmds...)
	hidden := res[per*n:]
	if remember {
		hidden = res[(per+1)*n:]
	}
	reads := make([]hotRead, n)
	counters := make([]int64, n)
	// the deletion ranges only of the topics with something above the
	// cursor: a miss is filled from MySQL
	var above []int
	var names []string
	var hres []rueidis.RedisResult
	for j, i := range hot {
		r := &reads[j]
		r.c, r.err = readpath.ResolveNewest(res[j*per:(j+1)*per], countRead(us[i]))
		counters[j], r.bound = r.c.Counter(), r.c.Bound()
	}
	s.aboveCachedInFlight(ctx, tenant, keys, us, hot, reads, counters)
	for j, i := range hot {
		if r := &reads[j]; r.err == nil && r.above(us[i].readSeq) {
			above = append(above, j)
			names = append(names, us[i].topic)
			hres = append(hres, hidden[j])
		}
	}
	hvs, err := s.r.HiddenOfMany(ctx, db, keys, user, names, hres)
	if err != nil {
		return nil, nil, err
	}
	for k, j := range above {
		reads[j].hv = hvs[k]
	}
	var fresh map[int]remembered
	for j, i := range hot {
		c, ok := s.countHotOne(user, us[i], reads[j])
		if !ok {
			cold = append(cold, i)
			continue
		}
		out[i] = c
		if !remember || c.upTo != counters[j] {
			continue
		}
		m, err := res[per*n+j].ToMessage()
		hv, ok := stampOf(m)
		// remembered only under versions Redis holds: a missing one says
		// nothing of the changes made before it went missing
		versioned := reads[j].c.Version() != 0 && hv != 0
		if ok && versioned && (err == nil || rueidis.IsRedisNil(err)) && routing.NonePendingThrough(res[(per+2)*n+j], counters[j]) {
			if fresh == nil {
				fresh = map[int]remembered{}
			}
			fresh[i] = remembered{last: counters[j], cursor: us[i].readSeq, msgVer: reads[j].c.Version(), hidVer: hv}
		}
	}
	return fresh, cold, nil
}

// maxInFlightAbove is how many seqs above a topic's newest cached message
// a hot count checks are in flight (aboveCachedInFlight); more and the
// month tables count the topic.
const maxInFlightAbove = 16

// errNotInFlight marks a hot read whose seqs above the newest cached
// message are not all in flight: the cache cannot prove the count.
var errNotInFlight = errors.New("inbox: a seq above the newest cached message is not in flight")

// aboveCachedInFlight checks, for each read of us[hot] whose newest cached
// message lies below the topic's counter, that every seq between them that
// is not a recorded gap is still in flight (routing.Flight: one pipelined
// round trip for all of them), and marks the read unprovable
// (errNotInFlight) when one is not. A count from the hot cache stops at its
// newest cached message, taking what lies above as not stored yet; but a
// send writes the cache only once Kafka acknowledged it in time, so a
// message whose ack came after its send gave up (503) is stored by persist
// and never cached: above the newest cached message for good. A cache that
// lacks a seq says nothing of it, and the month tables count it; so they
// do when a check cannot be read.
func (s *Service) aboveCachedInFlight(ctx context.Context, tenant string, keys routing.Keys, us []userTopic, hot []int, reads []hotRead, counters []int64) {
	type check struct {
		j   int
		seq int64
	}
	var checks []check
	var cmds []rueidis.Completed
	for j, i := range hot {
		r := &reads[j]
		if r.err != nil || r.bound.Settled >= counters[j] {
			continue
		}
		if counters[j]-r.bound.Settled > maxInFlightAbove {
			r.err = errNotInFlight
			continue
		}
		for seq := r.bound.Settled + 1; seq <= counters[j]; seq++ {
			if !r.c.Gap(seq) {
				checks = append(checks, check{j, seq})
				cmds = append(cmds, s.p.Flight.InFlightCmds(keys, us[i].topic, seq)...)
			}
		}
	}
	if len(cmds) == 0 {
		return
	}
	res := s.p.Redis.DoMulti(ctx, cmds...)
	per := len(cmds) / len(checks)
	for k, c := range checks {
		if reads[c.j].err != nil {
			continue
		}
		flying, err := s.p.Flight.InFlightResolve(ctx, tenant, us[hot[c.j]].topic, c.seq, res[k*per:(k+1)*per])
		if err != nil || !flying {
			reads[c.j].err = errNotInFlight
		}
	}
}

// countCold counts us[cold] from the month tables (loading their route
// mirrors unless mirrored) into out.
func (s *Service) countCold(ctx context.Context, db *sql.DB, tenant string, user int64, us []userTopic, mirrored bool, cold []int, out []unreadCount) error {
	if len(cold) == 0 {
		return nil
	}
	s.m.unreadFrom.WithLabelValues("mysql").Add(float64(len(cold)))
	sub := make([]userTopic, len(cold))
	for j, i := range cold {
		sub[j] = us[i]
	}
	if !mirrored {
		names := make([]string, len(sub))
		for j, u := range sub {
			names[j] = u.topic
		}
		mirrors, err := routing.LoadMirrorMany(ctx, db, names)
		if err != nil {
			return err
		}
		for j := range sub {
			sub[j].mirror = mirrors[sub[j].topic]
		}
	}
	cs, err := s.countMany(ctx, db, tenant, user, sub)
	if err != nil {
		return err
	}
	for j, i := range cold {
		out[i] = cs[j]
	}
	return nil
}

// hotReadOf is how many cached members a count of u reads: what lies
// above the cursor, at most the cap and the slack.
func hotReadOf(u userTopic) int {
	return int(min(u.last-u.readSeq, UnreadCap+1)) + unreadSlack
}

// countRead is the hot-cache read of a count of u: newest first from the
// top down to the cursor, hotReadOf(u) members at most.
func countRead(u userTopic) readpath.NewestRead {
	return readpath.NewestRead{Topic: u.topic, Below: math.MaxInt64, Floor: u.readSeq, N: hotReadOf(u)}
}

// hotRead is a topic's hot-cache read for a count: the cache next to the
// cursor, how far the count may go (readpath.Newest.Bound: the counter's
// last seq, lowered to the newest cached message: seqs above it are in
// flight — aboveCachedInFlight checks they are — not answered yet, like
// those not stored yet in the month tables) and, when something lies
// above the cursor, the caller's deletion ranges.
type hotRead struct {
	c     readpath.Newest
	bound routing.Bound
	err   error
	hv    readpath.HiddenView
}

// above reports whether the count may reach above the read cursor.
func (r hotRead) above(readSeq int64) bool {
	_, ok := r.bound.Forward(readSeq)
	return ok
}

// countHotOne counts u from its hot-cache read as countMany would from the
// month tables: newest first down to the cursor, stopping at the caller's
// own newest message (any status: sending reads everything before it),
// counting messages neither recalled nor deleted nor hidden by the caller.
// ok is false when the cache cannot prove the answer (a seq neither cached
// nor a recorded gap, ranges not known).
func (s *Service) countHotOne(user int64, u userTopic, r hotRead) (unreadCount, bool) {
	out := unreadCount{readSeq: u.readSeq}
	n := hotReadOf(u)
	if r.err != nil || !r.bound.Counted {
		return out, false // Redis failed, or holds no counter
	}
	last, above := r.bound.Forward(u.readSeq)
	if !above {
		return out, true // nothing above the cursor
	}
	if !r.hv.Known {
		return out, false // too many ranges to cache
	}
	c, hv := r.c, r.hv
	// at most n rows: all the read may cover
	page, ok := c.Walk(last, u.readSeq+1, n-1, nil, true)
	if !ok {
		return out, false
	}
	settled := len(page) < n // the walk reached the cursor
	for _, m := range page {
		if out.take(user, m.Seq, int64(m.FromUser), !hv.Ranges.Hides(m.Seq) && m.Status == message.StatusNormal) {
			settled = true
			break
		}
	}
	if !settled {
		return unreadCount{readSeq: u.readSeq}, false
	}
	out.upTo = last
	s.m.unreadFrom.WithLabelValues("redis").Inc()
	return out, true
}

// lastMessageRead is the hot-cache read of u's last message: down from the
// last stored seq (the mirror's), the newest stored message and a few it
// may have to step over (deleted for everyone, hidden by the caller, gaps).
func lastMessageRead(u userTopic) readpath.NewestRead {
	return readpath.NewestRead{Topic: u.topic, Below: u.mirror.LastSeq() + 1, N: readpath.HotSlack + 1}
}

// lastMessages is the last message of each of us the caller may see (nil:
// none), as lastMessage answers it, and each topic's last stored seq: from
// the topics' hot caches in one pipelined round trip, walked down from the
// last stored seq with the same proof as a page, and through lastMessage
// for a topic the cache cannot prove or whose legacy table still holds
// messages (a tenant being migrated).
func (s *Service) lastMessages(ctx context.Context, db *sql.DB, tenant string, keys routing.Keys, user int64, us []userTopic) ([]*message.Message, []int64, error) {
	out := make([]*message.Message, len(us))
	lasts := make([]int64, len(us))
	var hot, cold []int
	for i, u := range us {
		lasts[i] = u.mirror.LastSeq()
		leg, err := s.p.Migrations.Legacy(ctx, tenant, u.topic)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case leg.Hi > 0:
			cold = append(cold, i)
		case lasts[i] > 0:
			hot = append(hot, i)
		}
	}
	if len(hot) > 0 {
		const per = readpath.NewestCmdCount
		cmds := make([]rueidis.Completed, 0, (per+1)*len(hot))
		for _, i := range hot {
			cmds = append(cmds, s.r.NewestCmds(keys, lastMessageRead(us[i]))...)
		}
		names := make([]string, len(hot))
		for j, i := range hot {
			names[j] = us[i].topic
			cmds = append(cmds, s.r.HiddenCmds(keys, us[i].topic, user)...)
		}
		res := s.p.Redis.DoMulti(ctx, cmds...)
		hvs, err := s.r.HiddenOfMany(ctx, db, keys, user, names, res[per*len(hot):])
		if err != nil {
			return nil, nil, err
		}
		for j, i := range hot {
			last := us[i].mirror.LastSeq()
			c, err := readpath.ResolveNewest(res[j*per:(j+1)*per], lastMessageRead(us[i]))
			if err != nil || !hvs[j].Known {
				cold = append(cold, i)
				continue
			}
			page, ok := c.Walk(last, 1, 0, hvs[j].Ranges, false)
			if !ok {
				cold = append(cold, i)
				continue
			}
			if len(page) > 0 {
				out[i] = &page[0]
			}
		}
	}
	err := parallel(ctx, len(cold), func(j int) error {
		i := cold[j]
		lm, last, err := s.lastMessage(ctx, db, tenant, user, us[i])
		out[i], lasts[i] = lm, last
		return err
	})
	return out, lasts, err
}
