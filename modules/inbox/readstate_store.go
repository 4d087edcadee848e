package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// unreadWalkRow is how many rows one statement of the unread walk reads.
const unreadWalkRow = 256

// userTopic is one topic of the caller's list as MySQL holds it: the
// membership, the group's status, the caller's cursor and preferences, and
// what the route mirror says of the stored messages.
type userTopic struct {
	topic      string
	status     string // the group's
	readSeq    int64
	pinned     bool
	notifyMute sql.NullTime
	joinedAt   time.Time
	changedAt  time.Time // newest of membership, group, cursor and stored messages
	mirror     routing.TopicMirror
	last       int64 // the last issued seq (Redis), -1 unknown; set by readInputs
	// legacyAt is the newest legacy message's created_at of a topic whose
	// mirror holds none while the tenant migrates (legacyActivity)
	legacyAt time.Time
}

// activity is what the topic list sorts by: the newest stored message
// (the legacy table's while only it holds the topic's messages), else the
// moment the caller joined.
func (u userTopic) activity() time.Time {
	if t := u.mirror.LastAt(); !t.IsZero() {
		return t
	}
	if !u.legacyAt.IsZero() {
		return u.legacyAt
	}
	return u.joinedAt
}

// topicsOf are the list entries of memberships MySQL holds.
func topicsOf(ms []acl.MemberTopic) []userTopic {
	out := make([]userTopic, len(ms))
	for i, m := range ms {
		out[i] = userTopic{topic: m.Topic, status: m.GroupStatus, readSeq: m.ReadSeq, pinned: m.Pinned,
			notifyMute: m.NotifyMute, joinedAt: m.JoinedAt, changedAt: m.ChangedAt}
	}
	return out
}

// loadTopics reads every topic user is a member of (acl.MembersOf) and,
// at the same time, their mirrors (acl.MemberMirrors, completed by
// completeMirrors); dissolved groups are kept, flagged by status, for
// sync. Without times, joinedAt and changedAt are left zero (joinedTimes
// reads the join times a caller needs).
func (s *Service) loadTopics(ctx context.Context, db *sql.DB, user int64, times bool) ([]userTopic, error) {
	var mirrors map[string]routing.TopicMirror
	var merr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		mirrors, merr = acl.MemberMirrors(ctx, s.st, db, user)
	}()
	ms, err := acl.MembersOf(ctx, s.st, db, user, times)
	<-read
	if err != nil {
		return nil, err
	}
	if merr != nil {
		return nil, merr
	}
	out := topicsOf(ms)
	names := make([]string, len(out))
	for i, u := range out {
		names[i] = u.topic
	}
	if err := completeMirrors(ctx, db, mirrors, names); err != nil {
		return nil, err
	}
	for i := range out {
		out[i].mirror = mirrors[out[i].topic]
		if out[i].mirror.ChangedAt.After(out[i].changedAt) {
			out[i].changedAt = out[i].mirror.ChangedAt
		}
	}
	return out, nil
}

// completeMirrors adds to mirrors — read through the user's memberships
// (acl.MemberMirrors) — those of topics it does not hold, read by topic
// (none when it holds them all). A read through the memberships leaves out
// a topic the user stopped being a member of after the read that named it
// (the membership read beside it, the user's cache entry: a leave
// committed in between, its drop of the entry still to come), and that
// absence says nothing of the topic's stored messages: taken as no mirror,
// the topic would show no last seq nor message, and as a remembered route
// (routeMemo) it would to every user of the tenant. A topic with no
// stored messages costs the read by topic too.
func completeMirrors(ctx context.Context, db *sql.DB, mirrors map[string]routing.TopicMirror, topics []string) error {
	var missed []string
	for _, t := range topics {
		if _, ok := mirrors[t]; !ok {
			missed = append(missed, t)
		}
	}
	if len(missed) == 0 {
		return nil
	}
	read, err := routing.LoadMirrorMany(ctx, db, missed)
	if err != nil {
		return err
	}
	maps.Copy(mirrors, read)
	return nil
}

// joinedTimes sets joinedAt of the topics of us that need reports true
// (one statement naming them; none when no topic does).
func (s *Service) joinedTimes(ctx context.Context, db *sql.DB, user int64, us []userTopic, need func(userTopic) bool) error {
	idx := map[string]int{}
	var names []string
	for i, u := range us {
		if need(u) {
			idx[u.topic] = i
			names = append(names, u.topic)
		}
	}
	if len(names) == 0 {
		return nil
	}
	at, err := acl.JoinTimes(ctx, db, user, names)
	for t, a := range at {
		us[idx[t]].joinedAt = a
	}
	return err
}

// unreadCount is the caller's unread state of one topic.
type unreadCount struct {
	readSeq  int64 // the cursor, moved up to the caller's own newest message
	unread   int
	mentions int  // from the mention index (mentionCounts)
	capped   bool // more than UnreadCap unread: unread is UnreadCap
	// legacyMentions are the counted legacy rows that mention the caller
	// or everyone (unreadRows), added to the index's entries by
	// mentionCounts
	legacyMentions []int64
	// upTo is the newest seq the count covers (0: every stored one): a
	// hot-cache count leaves out the seqs in flight above the newest cached
	// message, and so do its mentions
	upTo int64
}

// take counts a message above the cursor (newest first) from user's
// view: their own message reads everything before it (and moves readSeq
// to it), a countable one (normal, not hidden by them) counts; it reports
// the count settled — their own message, or one more past the cap.
func (c *unreadCount) take(user, seq, from int64, countable bool) bool {
	if from == user {
		c.readSeq = seq
		return true
	}
	if !countable {
		return false
	}
	if c.unread == UnreadCap {
		c.capped = true
		return true
	}
	c.unread++
	return false
}

// countUnread counts the messages of u the caller has not read: stored,
// above the cursor and above the caller's own newest message (sending
// reads everything before it), neither recalled nor deleted for everyone,
// not hidden by the caller. Gaps have no row, so they never count. It
// walks the sources holding seqs above the cursor newest first — the month
// tables and, while the tenant migrates, the legacy table, bounded as a
// page bounds them (readpath.PlanCount) — and stops at UnreadCap+1: a badge costs at
// most that many index entries. An archived month is read through the read
// path (its archive with its overlay, coldWalk), never from a table it may
// have kept: that table does not see the month's changes since.
func (s *Service) countUnread(ctx context.Context, db *sql.DB, tenant string, user int64, u userTopic) (unreadCount, error) {
	out := unreadCount{readSeq: u.readSeq}
	leg, err := s.p.Migrations.Legacy(ctx, tenant, u.topic)
	if err != nil {
		return out, err
	}
	pl := readpath.PlanCount(u.topic, user, u.readSeq, u.mirror, leg)
	if pl.None {
		return out, nil
	}
	srcs, err := s.r.Sources(ctx, tenant, pl)
	if err != nil {
		return out, err
	}
	for _, src := range srcs {
		var own int64
		if src.Cold {
			// the SQL's view: every status, hidden ones included
			err = s.coldWalk(ctx, db, tenant, src.Source, u.readSeq, func(q *readpath.ListQuery) { q.KeepDeleted, q.HidNothing = true, true },
				func(m message.Message) bool {
					if int64(m.FromUser) == user {
						own = m.Seq
					}
					return own > 0
				})
		} else {
			own, err = s.st.ownNewest(ctx, db, src.Source, user, u.readSeq)
		}
		if err != nil {
			return out, err
		}
		if own > 0 {
			out.readSeq = own
			break
		}
	}
	for _, src := range srcs {
		if src.Cold {
			err := s.coldWalk(ctx, db, tenant, src.Source, out.readSeq, func(*readpath.ListQuery) {}, func(m message.Message) bool {
				return out.take(user, m.Seq, int64(m.FromUser), m.Status == message.StatusNormal)
			})
			if err != nil || out.capped {
				return out, err
			}
			continue
		}
		bound := src.Q.Bound
		for {
			n, last, err := s.st.unreadRows(ctx, db, src.Source, user, out.readSeq, bound, &out)
			if err != nil || out.capped {
				return out, err
			}
			if n < unreadWalkRow {
				break
			}
			bound = last
		}
	}
	return out, nil
}

// coldWalk hands fn the messages of src — an archived month's source —
// above after, newest first, read from the archive with its overlay
// unreadWalkRow at a time (set tunes each read's query: tombstones, the
// caller's deletion ranges), until fn says it has its answer.
func (s *Service) coldWalk(ctx context.Context, db *sql.DB, tenant string, src readpath.Source, after int64,
	set func(*readpath.ListQuery), fn func(message.Message) bool) error {
	q := src.Q
	q.Floor, q.Limit = max(q.Floor, after), unreadWalkRow
	set(&q)
	for {
		ms, err := s.r.ReadSource(ctx, db, tenant, readpath.Source{Table: src.Table, Month: src.Month, Q: q})
		if err != nil {
			return err
		}
		for _, m := range ms {
			if fn(m) {
				return nil
			}
		}
		if len(ms) < unreadWalkRow {
			return nil
		}
		q.Bound = ms[len(ms)-1].Seq
	}
}

// lastMessage is the newest stored message of u the caller may see (a
// recalled one as its tombstone; deleted for everyone and hidden ones are
// skipped), read through the same walk as a page, and the topic's last
// stored seq: the mirror's, or higher while the legacy table still holds
// the topic's newest rows.
func (s *Service) lastMessage(ctx context.Context, db *sql.DB, tenant string, user int64, u userTopic) (*message.Message, int64, error) {
	last := u.mirror.LastSeq()
	leg, err := s.p.Migrations.Legacy(ctx, tenant, u.topic)
	if err != nil {
		return nil, last, err
	}
	page, _, err := s.r.Walk(ctx, db, tenant, readpath.PlanLast(u.topic, user, u.mirror, leg))
	if leg.Split {
		last = max(last, leg.Hi)
	}
	if err != nil || len(page) == 0 {
		return nil, last, err
	}
	return &page[0], max(last, page[0].Seq), nil
}

// ownNewest is the caller's newest seq above after in src (0: none), from
// the (topic, from_user, seqid) index alone.
func (s store) ownNewest(ctx context.Context, db *sql.DB, src readpath.Source, user, after int64) (int64, error) {
	b := sq.Select("COALESCE(MAX(seqid), 0)").From(src.Table).
		Where(sq.Eq{"topic": src.Q.Topic, "from_user": user}).Where(sq.Gt{"seqid": max(after, src.Q.Floor)})
	if src.Q.Bound < math.MaxInt64 {
		b = b.Where(sq.Lt{"seqid": src.Q.Bound})
	}
	query, args, err := b.ToSql()
	if err != nil {
		return 0, err
	}
	rows, err := s.Run(ctx, db, query, args)
	if err != nil {
		return 0, fmt.Errorf("inbox: own newest of %s: %w", src.Q.Topic, err)
	}
	defer rows.Close()
	var seq int64
	for rows.Next() {
		if err := rows.Scan(&seq); err != nil {
			return 0, err
		}
	}
	return seq, rows.Err()
}

// unreadRows reads up to unreadWalkRow rows of src with after < seq <
// before (within the source's bounds) the caller did not hide, newest
// first, and adds the unread among them to c (stopping once c is capped).
// Of the legacy table it also reads whether each row mentions the caller
// or everyone: the mention index holds a legacy row only once the
// backfill copied it, so the unread legacy rows' mentions are taken from
// the rows the walk reads anyway (legacyMentions). It returns the rows
// read and the lowest seq.
func (s store) unreadRows(ctx context.Context, db *sql.DB, src readpath.Source, user, after, before int64, c *unreadCount) (int, int64, error) {
	topic := src.Q.Topic
	legacy := src.Table == routing.LegacyQuoted()
	b := sq.Select("m.seqid", "m.status")
	if legacy {
		b = b.Column(sq.Expr(routing.LegacyMentioning("m"), user))
	}
	query, args, err := b.From(src.Table+" AS m").
		Where(sq.Eq{"m.topic": topic}).Where(sq.Gt{"m.seqid": max(after, src.Q.Floor)}).Where(sq.Lt{"m.seqid": min(before, src.Q.Bound)}).
		Where(readpath.NotHidden, user).OrderBy("m.seqid DESC").Limit(unreadWalkRow).ToSql()
	if err != nil {
		return 0, 0, err
	}
	rows, err := s.Run(ctx, db, query, args)
	if err != nil {
		return 0, 0, fmt.Errorf("inbox: unread of %s: %w", topic, err)
	}
	defer rows.Close()
	n, last := 0, before
	for rows.Next() {
		var seq int64
		var status string
		var mentioned bool
		dest := []any{&seq, &status}
		if legacy {
			dest = append(dest, &mentioned)
		}
		if err := rows.Scan(dest...); err != nil {
			return 0, 0, err
		}
		n, last = n+1, seq
		if status != message.StatusNormal || c.capped {
			continue
		}
		if c.unread == UnreadCap {
			c.capped = true
			continue
		}
		c.unread++
		if mentioned {
			c.legacyMentions = append(c.legacyMentions, seq)
		}
	}
	return n, last, rows.Err()
}

// newestAt is the created_at of topic's newest message in t created at or
// before at ((topic, created_at) index).
func (s store) newestAt(ctx context.Context, db *sql.DB, t routing.Table, topic string, at time.Time) (time.Time, bool, error) {
	query, args, err := sq.Select("MAX(created_at)").From(t.Quoted()).
		Where(sq.Eq{"topic": topic}).Where(sq.LtOrEq{"created_at": at.UTC()}).ToSql()
	if err != nil {
		return time.Time{}, false, err
	}
	rows, err := s.Run(ctx, db, query, args)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("inbox: activity of %s: %w", topic, err)
	}
	defer rows.Close()
	var v sql.NullTime
	for rows.Next() {
		if err := rows.Scan(&v); err != nil {
			return time.Time{}, false, err
		}
	}
	return v.Time, v.Valid, rows.Err()
}

// coldNewestAt is newestAt of an archived month, read from its archive
// (the table may be gone): every row of the topic in the month, deleted
// ones included as the table's MAX counts them — created_at follows seq
// only roughly, so no row can be skipped.
func (s *Service) coldNewestAt(ctx context.Context, db *sql.DB, tenant string, t routing.Table, topic string, at time.Time) (time.Time, bool, error) {
	var newest time.Time
	src := readpath.Source{Table: t.Quoted(), Month: t.Month(), Q: readpath.ListQuery{Topic: topic, Order: readpath.Desc, Bound: math.MaxInt64}}
	err := s.coldWalk(ctx, db, tenant, src, 0, func(q *readpath.ListQuery) { q.KeepDeleted, q.HidNothing = true, true },
		func(m message.Message) bool {
			if c := m.CreatedAt.Time; !c.After(at) && c.After(newest) {
				newest = c
			}
			return false
		})
	return newest, !newest.IsZero(), err
}

// syncSafety is how far below MySQL's clock a sync token stays when the
// running transactions cannot be read (no PROCESS privilege), and the least
// it stays below in any case: a statement stamps updated_at when it starts
// and commits a moment later.
const (
	syncFallbackMargin = 5 * time.Second
	syncMinMargin      = 50 * time.Millisecond
)

// syncHorizon is the time a new sync token may carry: below every change
// not committed yet — MySQL's clock, and not after the start of the oldest
// transaction still running in the tenant's database (its changes are
// stamped after it started and become visible only when it commits).
func syncHorizon(ctx context.Context, db *sql.DB) (time.Time, error) {
	var now time.Time
	if err := db.QueryRowContext(ctx, "SELECT NOW(3)").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("inbox: sync horizon: %w", err)
	}
	var oldest sql.NullTime
	err := sq.Select("MIN(t.trx_started)").From("information_schema.innodb_trx AS t").
		Join("information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id").
		Where("p.db = DATABASE()").RunWith(db).QueryRowContext(ctx).Scan(&oldest)
	if err != nil {
		return now.Add(-syncFallbackMargin), nil
	}
	h := now.Add(-syncMinMargin)
	if oldest.Valid && oldest.Time.Add(-time.Millisecond).Before(h) {
		h = oldest.Time.Add(-time.Millisecond)
	}
	return h, nil
}

// addTopicChanges moves each topic's change time up to its last message
// change (recall, edit, delete for everyone: im_topic_changes).
func (s *Service) addTopicChanges(ctx context.Context, db *sql.DB, us []userTopic) error {
	names := make([]string, len(us))
	for i, u := range us {
		names[i] = u.topic
	}
	at, err := readpath.ChangeTimes(ctx, db, names)
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	for i := range us {
		if t, ok := at[us[i].topic]; ok && t.After(us[i].changedAt) {
			us[i].changedAt = t
		}
	}
	return nil
}

// unreadBranches is how many topics one statement of countMany reads: a
// statement of fixed shape (absent topics pad it) is prepared once per
// month table and reused.
const unreadBranches = 128

// unreadRowsPerTopic bounds a topic's branch: enough to reach the cap
// past a few hidden or deleted rows; a topic whose branch fills up without
// an answer is walked on its own (countUnread).
const unreadRowsPerTopic = UnreadCap + 25

// unreadBranch is one topic's part of a countMany statement: its rows above
// the cursor, newest first, each with whether the caller hid it.
var unreadBranch = "(SELECT ? AS i, m.seqid, m.from_user, m.status, " +
	readpath.NotHidden + " FROM %s AS m WHERE m.topic = ? AND m.seqid > ? ORDER BY m.seqid DESC LIMIT %d)"

// countMany is countUnread for many topics at once: the topics whose seqs
// above the cursor all lie in one month table are read with one statement
// per unreadBranches of them; the others (and a topic the bounded read
// does not settle) are walked one by one.
func (s *Service) countMany(ctx context.Context, db *sql.DB, tenant string, user int64, us []userTopic) ([]unreadCount, error) {
	out := make([]unreadCount, len(us))
	byMonth := map[routing.Month][]int{}
	var alone []int
	for i, u := range us {
		out[i].readSeq = u.readSeq
		leg, err := s.p.Migrations.Legacy(ctx, tenant, u.topic)
		if err != nil {
			return nil, err
		}
		pl := readpath.PlanCount(u.topic, user, u.readSeq, u.mirror, leg)
		if pl.None {
			continue
		}
		if m, ok := pl.OneMonth(); ok {
			byMonth[m] = append(byMonth[m], i)
		} else {
			alone = append(alone, i)
		}
	}
	type chunk struct {
		t   routing.Table
		idx []int
	}
	var chunks []chunk
	for m, idx := range byMonth {
		archived, err := s.r.Archived(ctx, tenant, m)
		if err != nil {
			return nil, err
		}
		if archived {
			// read from its archive: walked one by one
			alone = append(alone, idx...)
			continue
		}
		tables, err := s.p.Router.Tables(ctx, tenant, []routing.Month{m})
		if err != nil {
			return nil, err
		}
		if len(tables) == 0 {
			continue // an unregistered month holds no rows
		}
		for lo := 0; lo < len(idx); lo += unreadBranches {
			chunks = append(chunks, chunk{tables[0], idx[lo:min(len(idx), lo+unreadBranches)]})
		}
	}
	var mu sync.Mutex
	err := parallel(ctx, len(chunks), func(j int) error {
		unsettled, err := s.st.unreadMany(ctx, db, chunks[j].t, user, us, chunks[j].idx, out)
		mu.Lock()
		alone = append(alone, unsettled...)
		mu.Unlock()
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, parallel(ctx, len(alone), func(j int) error {
		i := alone[j]
		c, err := s.countUnread(ctx, db, tenant, user, us[i])
		out[i] = c
		return err
	})
}

// unreadMany reads the topics us[idx] of t in one statement and sets their
// counts in out; it returns those whose rows ran past the branch bound
// before an answer.
func (s store) unreadMany(ctx context.Context, db *sql.DB, t routing.Table, user int64, us []userTopic, idx []int, out []unreadCount) ([]int, error) {
	branch := fmt.Sprintf(unreadBranch, t.Quoted(), unreadRowsPerTopic)
	parts := make([]string, unreadBranches)
	args := make([]any, 0, 4*unreadBranches)
	for k := range unreadBranches {
		parts[k] = branch
		if k < len(idx) {
			args = append(args, idx[k], user, us[idx[k]].topic, us[idx[k]].readSeq)
		} else {
			args = append(args, -1, user, "", math.MaxInt64) // matches no row
		}
	}
	rows, err := s.Run(ctx, db, strings.Join(parts, " UNION ALL "), args)
	if err != nil {
		return nil, fmt.Errorf("inbox: unread of %d topics: %w", len(idx), err)
	}
	defer rows.Close()
	type row struct {
		seq, from int64
		status    string
		vis       bool
	}
	got := map[int][]row{}
	for rows.Next() {
		var i int
		var r row
		if err := rows.Scan(&i, &r.seq, &r.from, &r.status, &r.vis); err != nil {
			return nil, err
		}
		got[i] = append(got[i], r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var unsettled []int
	for _, i := range idx {
		rs := got[i]
		slices.SortFunc(rs, func(a, b row) int { return cmp.Compare(b.seq, a.seq) })
		c := unreadCount{readSeq: us[i].readSeq}
		settled := len(rs) < unreadRowsPerTopic
		for _, r := range rs {
			if c.take(user, r.seq, r.from, r.vis && r.status == message.StatusNormal) {
				settled = true
				break
			}
		}
		if !settled {
			unsettled = append(unsettled, i)
			continue
		}
		out[i] = c
	}
	return unsettled, nil
}

// mentionBranches is how many topics one statement of mentionSeqs reads:
// a statement of fixed shape (absent topics pad it) is prepared once and
// reused.
const mentionBranches = 128

// mentionQuery reads the caller's entries of the mention index above the
// cursor of each of mentionBranches topics, leaving out what the caller hid.
var mentionQuery = routing.MentionsAboveQuery(mentionBranches, readpath.NotHiddenAt("x.topic", "x.seq"))

// mentionSeqs reads the seqs mentioning user (or everyone) above after[i]
// in topics[i] that user did not hide, by topic.
func (s store) mentionSeqs(ctx context.Context, db *sql.DB, user int64, topics []string, after []int64) (map[string][]int64, error) {
	out := map[string][]int64{}
	var mu sync.Mutex
	chunks := (len(topics) + mentionBranches - 1) / mentionBranches
	err := parallel(ctx, chunks, func(j int) error {
		args := make([]any, 0, 2+2*mentionBranches)
		args = append(args, user)
		for k := j * mentionBranches; k < (j+1)*mentionBranches; k++ {
			if k < len(topics) {
				args = append(args, topics[k], after[k])
			} else {
				args = append(args, "", math.MaxInt64) // matches no entry
			}
		}
		args = append(args, user)
		rows, err := s.Run(ctx, db, mentionQuery, args)
		if err != nil {
			return fmt.Errorf("inbox: mentions of %d: %w", user, err)
		}
		defer rows.Close()
		for rows.Next() {
			var t string
			var seq int64
			if err := rows.Scan(&t, &seq); err != nil {
				return err
			}
			mu.Lock()
			out[t] = append(out[t], seq)
			mu.Unlock()
		}
		return rows.Err()
	})
	return out, err
}

// mentionCounts sets each count's mentions from the index entries read by
// mentionSeqs and, while the tenant migrates, the counted legacy rows
// that mention the caller (a row the backfill copied meanwhile is in both,
// and counts once): those above the count's cursor (moved up to the
// caller's own newest message) and within what it covers, never more than
// the unread (a change committing between the two reads cannot make a
// badge show more mentions than messages).
func mentionCounts(us []userTopic, seqs map[string][]int64, out []unreadCount) {
	for i := range out {
		c := &out[i]
		if c.unread == 0 {
			continue
		}
		for _, seq := range withLegacy(seqs[us[i].topic], c.legacyMentions) {
			if seq > c.readSeq && (c.upTo == 0 || seq <= c.upTo) && c.mentions < c.unread {
				c.mentions++
			}
		}
	}
}

// withLegacy is the index's mention seqs with the legacy ones not among
// them.
func withLegacy(index, legacy []int64) []int64 {
	if len(legacy) == 0 {
		return index
	}
	out := slices.Clone(index)
	in := make(map[int64]bool, len(index))
	for _, seq := range index {
		in[seq] = true
	}
	for _, seq := range legacy {
		if !in[seq] {
			out = append(out, seq)
		}
	}
	return out
}
