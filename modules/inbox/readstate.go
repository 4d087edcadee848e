package inbox

// Read state (docs/api.md "Read state"): each user's read cursor per
// topic, shared by all their devices; exact unread counts; the topic list
// a client opens with; one-call sync for a device that was away.
//
// Groups are read-diffusion: a message is stored once, and nothing is
// written per member when it is sent. Everything here is computed at read
// time from what exists anyway: the user's cursors (im_user_read_cursors,
// cached per user: readstate_cache.go), their memberships, each topic's hot
// cache, and where that cannot prove an answer the route mirror persist
// keeps in the transaction that stores the rows (the last stored seq and
// newest created_at of each topic) and the month tables' (topic, seqid) and
// (topic, from_user, seqid) indexes. The unread count of a topic is the
// walk down from its newest message to the cursor, capped at UnreadCap;
// the mention count reads the per-topic mention index
// (routing.AddMentions, written once per message by persist, its
// entries dropped by a recall or delete for everyone) read beside the
// counts, never the messages' own mention fields.

import (
	"context"
	"database/sql"
	"encoding/json"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
)

// UnreadCap is the largest unread count answered exactly; a topic with
// more answers UnreadCap with unread_capped (a client shows "999+").
const UnreadCap = 999

// Limits of the topic list and sync pages.
const (
	DefaultTopicsLimit = 50
	MaxTopicsLimit     = 200
	// readWorkers is how many topics of one request are counted at once.
	readWorkers = 4
	// SyncHorizon is the oldest sync token answered with changes; an
	// older one answers reset (refetch the topic list).
	SyncHorizon = 30 * 24 * time.Hour
)

// InboxTopic is one topic of the caller's list, or of a sync.
type InboxTopic struct {
	Topic         string           `json:"topic"`
	Removed       bool             `json:"removed,omitempty"` // sync only: left, removed or dissolved
	LastSeq       int64            `json:"last_seq"`
	LastMessage   *message.Message `json:"last_message"`
	ReadSeq       int64            `json:"read_seq"`
	Unread        int              `json:"unread"`
	UnreadCapped  bool             `json:"unread_capped"`
	MentionUnread int              `json:"mention_unread"`
	Pinned        bool             `json:"pinned"`
	MutedUntil    *message.Time    `json:"muted_until"`
	ActivityAt    message.Time     `json:"activity_at"`
}

// TopicsPage is a page of the topic list.
type TopicsPage struct {
	Topics     []InboxTopic `json:"topics"`
	NextCursor *string      `json:"next_cursor"`
}

// UnreadTopic is one badge.
type UnreadTopic struct {
	Topic         string `json:"topic"`
	Unread        int    `json:"unread"`
	UnreadCapped  bool   `json:"unread_capped"`
	MentionUnread int    `json:"mention_unread"`
}

// UnreadSummary is every badge of the caller: topics with nothing unread
// are left out; Total is the sum (TotalCapped when a topic is capped).
type UnreadSummary struct {
	Total       int           `json:"total"`
	TotalCapped bool          `json:"total_capped"`
	Topics      []UnreadTopic `json:"topics"`
}

// ReadCursor is the answer of a cursor move.
type ReadCursor struct {
	Topic   string `json:"topic"`
	ReadSeq int64  `json:"read_seq"`
}

// SyncPage is the answer of a device sync.
type SyncPage struct {
	Reset   bool         `json:"reset"`
	Topics  []InboxTopic `json:"topics"`
	Token   string       `json:"token"`
	HasMore bool         `json:"has_more"`
}

// MarkRead moves the caller's cursor of topic to seq: members only, never
// above the topic's last issued seq, never down (a lower seq answers the
// cursor as it is). One pipelined Redis round trip (membership, and the
// cached cursor raised within the last seq: acl.MoveCursor) and one
// MySQL statement; the answer follows the commit, and so does the read
// frame to the caller's sockets (publishRead).
func (s *Service) MarkRead(ctx context.Context, p httpapi.Principal, topic string, seq int64) (ReadCursor, error) {
	start := time.Now()
	keys, db, err := s.r.Open(ctx, p, topic)
	if err != nil {
		return ReadCursor{}, err
	}
	mv, err := s.p.ACL.MoveCursor(ctx, keys, p.Tenant, topic, p.UserID, seq)
	if err != nil {
		return ReadCursor{}, err
	}
	last := mv.Last
	if mv.Lost() {
		tr, err := s.p.Router.Route(ctx, p.Tenant, topic)
		if err != nil {
			return ReadCursor{}, err
		}
		last = tr.MaxSeq()
	}
	if seq > last {
		return ReadCursor{}, httpapi.Errorf(httpapi.CodeInvalidArgument, "seq is above the topic's last seq").
			WithDetails(map[string]any{"last_seq": last})
	}
	cur, err := acl.MarkRead(ctx, s.st, db, p.UserID, topic, seq)
	if err != nil {
		// the cache may hold a cursor MySQL does not: drop it
		_ = s.p.ACL.DropCursors(ctx, keys, p.UserID)
		return ReadCursor{}, httpapi.Wrap(httpapi.CodeUnavailable, "read cursor store unavailable", err)
	}
	// no field raised: the entry is dropped once MySQL committed, as a fill
	// may have read MySQL between the script and the commit
	unraised := mv.Lost() || mv.Absent
	if unraised {
		if err := s.p.ACL.DropCursors(ctx, keys, p.UserID); err != nil {
			return ReadCursor{}, acl.CursorCacheUnavailable(err)
		}
	}
	if mv.Raised || (unraised && cur == seq) {
		s.publishRead(keys, p.UserID, topic, cur)
	}
	s.m.readState.WithLabelValues("read").Observe(time.Since(start).Seconds())
	return ReadCursor{Topic: topic, ReadSeq: testhook.Break(testhook.CursorEcho, seq, cur)}, nil
}

// readFrameTimeout bounds the publication of a read frame once its
// cursor committed.
const readFrameTimeout = 5 * time.Second

// publishRead sends {"type":"read",topic,seq} to every socket of user once
// the cursor committed, without holding the answer back (the move's one
// Redis round trip is the script's): a frame never announces a cursor that
// could still roll back. Frames of two moves may arrive in either order;
// each carries the cursor it committed, and a client keeps the highest.
// Close waits for the publications under way.
func (s *Service) publishRead(keys routing.Keys, user int64, topic string, seq int64) {
	frame, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Topic string `json:"topic"`
		Seq   int64  `json:"seq"`
	}{"read", topic, seq})
	s.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), readFrameTimeout)
		defer cancel()
		rdb := s.p.Redis
		if err := rdb.Do(ctx, rdb.B().Spublish().Channel(keys.ReadFrames(user)).Message(string(frame)).Build()).Error(); err != nil {
			s.m.readFrames.WithLabelValues("failed").Inc()
			s.p.Log.Warn().Err(err).Int64("user", user).Str("topic", topic).Msg("read frame not published; the user's other devices see the cursor on their next sync")
			return
		}
		s.m.readFrames.WithLabelValues("published").Inc()
	})
}

// Prefs is a preferences change; a nil field stays as it is.
type Prefs = acl.PrefsChange

// SetPrefs sets the caller's own preferences of topic and answers the
// topic as the list shows it.
func (s *Service) SetPrefs(ctx context.Context, p httpapi.Principal, topic string, pr Prefs) (InboxTopic, error) {
	start := time.Now()
	if err := s.r.Authorize(ctx, p, topic); err != nil {
		return InboxTopic{}, err
	}
	keys, db, err := s.r.Open(ctx, p, topic)
	if err != nil {
		return InboxTopic{}, err
	}
	if err := acl.PutPrefs(ctx, db, p.UserID, topic, pr); err != nil {
		return InboxTopic{}, httpapi.Wrap(httpapi.CodeUnavailable, "read state store unavailable", err)
	}
	// the user's cache entry holds the preferences the topic list sorts by:
	// dropped once they committed, so the next read fills it from MySQL
	if err := s.p.ACL.DropCursors(ctx, keys, p.UserID); err != nil {
		return InboxTopic{}, httpapi.Wrap(httpapi.CodeUnavailable, "read-cursor cache unavailable; the change may not show in the topic list yet, retry it", err)
	}
	rs, err := acl.ReadStateOf(ctx, db, p.UserID, topic)
	if err != nil {
		return InboxTopic{}, err
	}
	mirrors, err := routing.LoadMirrorMany(ctx, db, []string{topic})
	if err != nil {
		return InboxTopic{}, err
	}
	u := userTopic{topic: topic, readSeq: rs.ReadSeq, pinned: rs.Pinned, notifyMute: rs.NotifyMute, mirror: mirrors[topic]}
	out := []InboxTopic{{}}
	if err := s.listEntries(ctx, db, p, []userTopic{u}, out, false); err != nil {
		return InboxTopic{}, err
	}
	s.m.readState.WithLabelValues("prefs").Observe(time.Since(start).Seconds())
	return out[0], nil
}

// Unread is every badge of the caller: their cached memberships with
// their cursors (MySQL only when the entry is not complete) and then the
// last seqs of those topics, two Redis round trips; one pipelined round
// trip reading the hot cache of the topics with something above the cursor
// (beside one statement per 128 of them reading the mention index); the
// month tables only for topics the cache cannot prove.
func (s *Service) Unread(ctx context.Context, p httpapi.Principal) (UnreadSummary, error) {
	start := time.Now()
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return UnreadSummary{}, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return UnreadSummary{}, err
	}
	buf := badgeBufs.Get().(*badgeBuf)
	all, pre, err := s.memberships(ctx, db, p.Tenant, keys, p.UserID, buf)
	if err != nil {
		return UnreadSummary{}, err
	}
	counts, err := s.counts(ctx, db, p.Tenant, keys, p.UserID, all, false, pre, buf.out)
	defer buf.release(all, pre, counts)
	if err != nil {
		return UnreadSummary{}, err
	}
	out := UnreadSummary{Topics: []UnreadTopic{}}
	for i, c := range counts {
		if c.unread == 0 {
			continue
		}
		out.Total += c.unread
		out.TotalCapped = out.TotalCapped || c.capped
		out.Topics = append(out.Topics, UnreadTopic{Topic: all[i].topic, Unread: c.unread, UnreadCapped: c.capped, MentionUnread: c.mentions})
	}
	slices.SortFunc(out.Topics, func(a, b UnreadTopic) int { return compareStrings(a.Topic, b.Topic) })
	s.m.readState.WithLabelValues("unread").Observe(time.Since(start).Seconds())
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// listEntries computes the list entries of us into out (same length):
// counts and last messages, read at the same time; first, unless inputs
// says us carries them already, the last seqs, and the cursors us carries
// from MySQL raised by the cache entry.
func (s *Service) listEntries(ctx context.Context, db *sql.DB, p httpapi.Principal, us []userTopic, out []InboxTopic, inputs bool) error {
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return err
	}
	if !inputs {
		s.readInputs(ctx, keys, p.UserID, us, true)
	}
	if err := s.legacyActivity(ctx, db, p.Tenant, us, time.Now()); err != nil {
		return err
	}
	// the last messages are read while the counts are made
	var lms []*message.Message
	var lasts []int64
	var lerr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		lms, lasts, lerr = s.lastMessages(ctx, db, p.Tenant, keys, p.UserID, us)
	}()
	counts, err := s.counts(ctx, db, p.Tenant, keys, p.UserID, us, true, nil, nil)
	<-read
	if err != nil {
		return err
	}
	if lerr != nil {
		return lerr
	}
	for i, u := range us {
		c := counts[i]
		st := InboxTopic{Topic: u.topic, LastSeq: lasts[i], LastMessage: lms[i], ReadSeq: c.readSeq,
			Unread: c.unread, UnreadCapped: c.capped, MentionUnread: c.mentions, Pinned: u.pinned,
			ActivityAt: message.NewTime(u.activity())}
		if u.notifyMute.Valid {
			t := message.NewTime(u.notifyMute.Time)
			st.MutedUntil = &t
		}
		out[i] = st
	}
	return nil
}

// parallel runs fn(0..n-1), readWorkers at a time; the first error wins.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := 0
	for range min(n, readWorkers) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil || i >= n || ctx.Err() != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// listed is a topic's sort key at the snapshot, and its index among the
// caller's topics (small: a list sorts hundreds).
type listed struct {
	topic  string
	pinned bool
	act    time.Time
	i      int
}

// before reports whether a sorts before b: pinned first, then newest
// activity, then topic.
func (a listed) before(b listed) bool {
	if a.pinned != b.pinned {
		return a.pinned
	}
	if !a.act.Equal(b.act) {
		return a.act.After(b.act)
	}
	return a.topic < b.topic
}

// Topics is a page of the caller's topic list: every group they are a
// member of that is not dissolved, pinned first, then newest activity. The
// cursor pins the first page's moment: a topic active since is placed by
// its activity at that moment, so later messages do not reshuffle the
// pages being read (they arrive through sync).
func (s *Service) Topics(ctx context.Context, p httpapi.Principal, limit int, cursor string) (TopicsPage, error) {
	start := time.Now()
	cur := listCursor{Snapshot: start.UnixMilli()}
	if cursor != "" {
		var err error
		if cur, err = parseListCursor(cursor, start); err != nil {
			return TopicsPage{}, err
		}
	}
	snap := time.UnixMilli(cur.Snapshot)
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return TopicsPage{}, err
	}
	all, inputs, err := s.listTopics(ctx, db, p.Tenant, p.UserID)
	if err != nil {
		return TopicsPage{}, err
	}
	if err := s.legacyActivity(ctx, db, p.Tenant, all, snap); err != nil {
		return TopicsPage{}, err
	}
	// the join time places a topic without messages, and decides whether
	// one whose messages all came after the snapshot was joined before it
	err = s.joinedTimes(ctx, db, p.UserID, all, func(u userTopic) bool {
		return u.status != acl.GroupDissolved && (u.activity().IsZero() || u.activity().Truncate(time.Millisecond).After(snap))
	})
	if err != nil {
		return TopicsPage{}, err
	}
	ls := make([]listed, 0, len(all))
	for i, u := range all {
		if u.status == acl.GroupDissolved {
			continue
		}
		act, ok, err := s.activityAt(ctx, db, p.Tenant, u, snap)
		if err != nil {
			return TopicsPage{}, err
		}
		if ok {
			ls = append(ls, listed{u.topic, u.pinned, act, i})
		}
	}
	slices.SortFunc(ls, func(a, b listed) int {
		if a.before(b) {
			return -1
		}
		return 1
	})
	if cursor != "" {
		after := listed{topic: cur.Topic, pinned: cur.Pinned, act: time.UnixMilli(cur.Activity)}
		i, _ := slices.BinarySearchFunc(ls, after, func(e, t listed) int {
			if e.topic == t.topic && e.pinned == t.pinned && e.act.Equal(t.act) {
				return 0
			}
			if e.before(t) {
				return -1
			}
			return 1
		})
		for i < len(ls) && !after.before(ls[i]) {
			i++
		}
		ls = ls[i:]
	}
	page := TopicsPage{Topics: []InboxTopic{}}
	if len(ls) > limit {
		last := ls[limit-1]
		next := encodeOpaque(listCursor{Snapshot: cur.Snapshot, Pinned: last.pinned, Activity: last.act.UnixMilli(), Topic: last.topic})
		page.NextCursor = &next
		ls = ls[:limit]
	}
	us := make([]userTopic, len(ls))
	for i, l := range ls {
		us[i] = all[l.i]
	}
	page.Topics = make([]InboxTopic, len(us))
	if err := s.listEntries(ctx, db, p, us, page.Topics, inputs); err != nil {
		return TopicsPage{}, err
	}
	for i, l := range ls {
		page.Topics[i].ActivityAt = message.NewTime(l.act)
	}
	s.m.readState.WithLabelValues("topics").Observe(time.Since(start).Seconds())
	return page, nil
}

// activityAt is u's activity as it was at snap (truncated to ms): its
// newest stored message created at or before snap, else when the caller
// joined; ok is false for a topic joined after snap. Only a topic active
// since snap costs a read (the (topic, created_at) index of its newest
// months; an archived month's rows of the topic from its archive).
func (s *Service) activityAt(ctx context.Context, db *sql.DB, tenant string, u userTopic, snap time.Time) (time.Time, bool, error) {
	if act := u.activity().Truncate(time.Millisecond); !act.After(snap) {
		return act, true, nil
	}
	var months []routing.Month
	for _, r := range slices.Backward(u.mirror.Rows) {
		if !r.MinCreatedAt.After(snap) {
			months = append(months, r.Month)
		}
	}
	tables, err := s.p.Router.Tables(ctx, tenant, months)
	if err != nil {
		return time.Time{}, false, err
	}
	for _, t := range tables {
		archived, err := s.r.Archived(ctx, tenant, t.Month())
		if err != nil {
			return time.Time{}, false, err
		}
		newestAt := s.st.newestAt
		if archived {
			newestAt = func(ctx context.Context, db *sql.DB, t routing.Table, topic string, at time.Time) (time.Time, bool, error) {
				return s.coldNewestAt(ctx, db, tenant, t, topic, at)
			}
		}
		at, ok, err := newestAt(ctx, db, t, u.topic, snap)
		if err != nil {
			return time.Time{}, false, err
		}
		if ok {
			return at.Truncate(time.Millisecond), true, nil
		}
	}
	if u.joinedAt.After(snap) {
		return time.Time{}, false, nil
	}
	return u.joinedAt.Truncate(time.Millisecond), true, nil
}

// Sync answers the caller's topics whose last seq, read cursor, membership
// or preferences changed after the token (all of them without one),
// oldest change first, with the token to pass next time.
func (s *Service) Sync(ctx context.Context, p httpapi.Principal, token string, limit int) (SyncPage, error) {
	start := time.Now()
	var tok syncToken
	if token != "" {
		var err error
		if tok, err = parseSyncToken(token, start); err != nil {
			return SyncPage{}, err
		}
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return SyncPage{}, err
	}
	// the next token's time first: a change stamped before it and not
	// committed yet belongs to a transaction still running, which the
	// horizon stays below
	horizon, err := syncHorizon(ctx, db)
	if err != nil {
		return SyncPage{}, err
	}
	if token != "" && horizon.Sub(time.UnixMilli(tok.Since)) > SyncHorizon {
		s.m.readState.WithLabelValues("sync").Observe(time.Since(start).Seconds())
		return SyncPage{Reset: true, Topics: []InboxTopic{}, Token: encodeOpaque(syncToken{Since: horizon.UnixMilli()})}, nil
	}
	all, err := s.loadTopics(ctx, db, p.UserID, true)
	if err != nil {
		return SyncPage{}, err
	}
	if err := s.addTopicChanges(ctx, db, all); err != nil {
		return SyncPage{}, err
	}
	left, err := acl.ChangedSince(ctx, db, p.UserID, time.UnixMilli(tok.Since))
	if err != nil {
		return SyncPage{}, err
	}
	type change struct {
		at      int64
		u       userTopic
		removed bool
	}
	var chs []change
	member := map[string]bool{}
	for _, u := range all {
		member[u.topic] = true
		chs = append(chs, change{u.changedAt.UnixMilli(), u, u.status == acl.GroupDissolved})
	}
	for _, l := range left {
		if !member[l.Topic] {
			chs = append(chs, change{l.At.UnixMilli(), userTopic{topic: l.Topic}, true})
		}
	}
	chs = slices.DeleteFunc(chs, func(c change) bool {
		return token != "" && (c.at < tok.Since || (c.at == tok.Since && c.u.topic <= tok.Topic))
	})
	slices.SortFunc(chs, func(a, b change) int {
		if a.at != b.at {
			return int(math.Max(-1, math.Min(1, float64(a.at-b.at))))
		}
		return compareStrings(a.u.topic, b.u.topic)
	})
	out := SyncPage{Topics: []InboxTopic{}}
	next := syncToken{Since: horizon.UnixMilli()}
	if len(chs) > limit {
		chs = chs[:limit]
		last := chs[limit-1]
		next, out.HasMore = syncToken{Since: last.at, Topic: last.u.topic}, true
	}
	var live []userTopic
	var at []int
	out.Topics = make([]InboxTopic, len(chs))
	for i, c := range chs {
		if c.removed {
			out.Topics[i] = InboxTopic{Topic: c.u.topic, Removed: true, ActivityAt: message.NewTime(c.u.activity())}
			continue
		}
		live, at = append(live, c.u), append(at, i)
	}
	states := make([]InboxTopic, len(live))
	if err := s.listEntries(ctx, db, p, live, states, false); err != nil {
		return SyncPage{}, err
	}
	for j, i := range at {
		out.Topics[i] = states[j]
	}
	out.Token = encodeOpaque(next)
	s.m.readState.WithLabelValues("sync").Observe(time.Since(start).Seconds())
	return out, nil
}
