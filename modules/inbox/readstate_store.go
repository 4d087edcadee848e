package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// Fixed tables of the read state (never built from input).
const (
	cursorsTable  = acl.CursorsTable
	membersTable  = acl.MembersTable
	groupsTable   = acl.GroupsTable
	unreadWalkRow = 256 // rows one statement of the unread walk reads
)

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

// loadTopics reads every topic user is a member of (one index range of
// im_group_members joined with the group and the cursor) and, at the same
// time, their mirrors (the same range joined with the route mirror);
// dissolved groups are kept, flagged by status, for sync. Both are cached
// prepared statements of fixed shape, whatever the number of topics.
// Without times, joinedAt and changedAt are left zero (joinedTimes reads
// the join times a caller needs): the range then stays within the
// members' (user_id) index, not a row lookup per membership.
func (s *Service) loadTopics(ctx context.Context, db *sql.DB, user int64, times bool) ([]userTopic, error) {
	var mirrors map[string]routing.TopicMirror
	var merr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		mirrors, merr = s.userMirrors(ctx, db, user)
	}()
	out, err := s.loadMembersOf(ctx, db, user, times)
	<-read
	if err != nil {
		return nil, err
	}
	if merr != nil {
		return nil, merr
	}
	for i := range out {
		out[i].mirror = mirrors[out[i].topic]
		if out[i].mirror.ChangedAt.After(out[i].changedAt) {
			out[i].changedAt = out[i].mirror.ChangedAt
		}
	}
	return out, nil
}

// userMirrors reads the route mirrors of every topic user is a member of
// (one statement of fixed shape, through the members' (user_id) index).
func (s *Service) userMirrors(ctx context.Context, db *sql.DB, user int64) (map[string]routing.TopicMirror, error) {
	query, args, err := routing.MirrorOf(membersTable+" AS m", "m.topic", sq.Eq{"m.user_id": user}).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := s.st.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("inbox: mirrors of %d: %w", user, err)
	}
	mirrors := map[string]routing.TopicMirror{}
	return mirrors, routing.ScanMirror(rows, mirrors)
}

// loadMembersOf is loadTopics' memberships, without the mirrors.
func (s *Service) loadMembersOf(ctx context.Context, db *sql.DB, user int64, times bool) ([]userTopic, error) {
	cols := []string{"m.topic", "g.status", "COALESCE(c.read_seq, 0)", "COALESCE(c.pinned, 0)", "c.notify_muted_until"}
	if times {
		cols = append(cols, "m.created_at", "GREATEST(m.updated_at, g.updated_at, COALESCE(c.updated_at, m.updated_at))")
	}
	query, args, err := sq.Select(cols...).
		From(membersTable + " AS m").
		Join(groupsTable + " AS g ON g.topic = m.topic").
		LeftJoin(cursorsTable + " AS c ON c.user_id = m.user_id AND c.topic = m.topic").
		Where(sq.Eq{"m.user_id": user}).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := s.st.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("inbox: topics of %d: %w", user, err)
	}
	defer rows.Close()
	var out []userTopic
	for rows.Next() {
		var u userTopic
		dest := []any{&u.topic, &u.status, &u.readSeq, &u.pinned, &u.notifyMute}
		if times {
			dest = append(dest, &u.joinedAt, &u.changedAt)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("inbox: topics of %d: %w", user, err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
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
	rows, err := sq.Select("topic", "created_at").From(membersTable).
		Where(sq.Eq{"user_id": user, "topic": names}).RunWith(db).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("inbox: join times of %d: %w", user, err)
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var at time.Time
		if err := rows.Scan(&t, &at); err != nil {
			return fmt.Errorf("inbox: join times of %d: %w", user, err)
		}
		us[idx[t]].joinedAt = at
	}
	return rows.Err()
}

// loadMemberships reads the topics user is a member of that are not
// dissolved, with their cursors and preferences (one index range of
// im_group_members joined with the group and the cursor): what the user's
// cache entry of memberships and cursors holds (cursorsFromMySQL).
func (s *Service) loadMemberships(ctx context.Context, db *sql.DB, user int64) ([]userTopic, error) {
	query, args, err := sq.Select("m.topic", "COALESCE(c.read_seq, 0)", "COALESCE(c.pinned, 0)", "c.notify_muted_until").From(membersTable + " AS m").
		Join(groupsTable + " AS g ON g.topic = m.topic").
		LeftJoin(cursorsTable + " AS c ON c.user_id = m.user_id AND c.topic = m.topic").
		Where(sq.Eq{"m.user_id": user}).Where(sq.NotEq{"g.status": acl.GroupDissolved}).ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := s.st.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("inbox: memberships of %d: %w", user, err)
	}
	defer rows.Close()
	var out []userTopic
	for rows.Next() {
		var u userTopic
		if err := rows.Scan(&u.topic, &u.readSeq, &u.pinned, &u.notifyMute); err != nil {
			return nil, fmt.Errorf("inbox: memberships of %d: %w", user, err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
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
// page bounds them (sources) — and stops at UnreadCap+1: a badge costs at
// most that many index entries.
func (s *Service) countUnread(ctx context.Context, db *sql.DB, tenant string, user int64, u userTopic) (unreadCount, error) {
	out := unreadCount{readSeq: u.readSeq}
	leg, err := s.p.Migrations.Legacy(ctx, tenant, u.topic)
	if err != nil {
		return out, err
	}
	if u.mirror.LastSeq() <= u.readSeq && leg.Hi <= u.readSeq {
		return out, nil
	}
	tables, err := s.tablesAbove(ctx, tenant, u.mirror, u.readSeq)
	if err != nil {
		return out, err
	}
	srcs := readpath.Sources(readpath.ListQuery{Topic: u.topic, User: user, Order: readpath.Desc, Bound: math.MaxInt64}, tables, leg)
	for _, src := range srcs {
		own, err := s.st.ownNewest(ctx, db, src, user, u.readSeq)
		if err != nil {
			return out, err
		}
		if own > 0 {
			out.readSeq = own
			break
		}
	}
	for _, src := range srcs {
		bound := src.Q.Bound
		for {
			n, last, err := s.st.unreadRows(ctx, db, src, user, out.readSeq, bound, &out)
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

// tablesAbove is the month tables that hold seqs above seq, newest first
// (the mirror is written in the transaction that stores the rows, so its
// max_seq is exact).
func (s *Service) tablesAbove(ctx context.Context, tenant string, m routing.TopicMirror, seq int64) ([]routing.Table, error) {
	var months []routing.Month
	for _, r := range slices.Backward(m.Rows) {
		if r.MaxSeq > seq {
			months = append(months, r.Month)
		}
	}
	return s.p.Router.Tables(ctx, tenant, months)
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
	tables, err := s.tablesAbove(ctx, tenant, u.mirror, 0)
	if err != nil {
		return nil, last, err
	}
	q := readpath.ListQuery{Topic: u.topic, User: user, Order: readpath.Desc, Bound: math.MaxInt64, Limit: 1}
	page, _, err := s.r.WalkSources(ctx, db, q, readpath.Sources(q, tables, leg))
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

// markRead moves the caller's cursor of topic up to seq (never down) in
// one statement and returns the cursor it holds afterwards: the
// LAST_INSERT_ID(expr) form hands the row's value back with the result.
// It is a cached prepared statement: one round trip, and running it twice
// is the same as once.
func (s store) markRead(ctx context.Context, db *sql.DB, user int64, topic string, seq int64) (int64, error) {
	query, args, err := sq.Insert(cursorsTable).Columns("user_id", "topic", "read_seq").Values(user, topic, seq).
		Suffix("ON DUPLICATE KEY UPDATE read_seq = LAST_INSERT_ID(GREATEST(read_seq, VALUES(read_seq)))").ToSql()
	if err != nil {
		return 0, err
	}
	res, err := s.Exec(ctx, db, query, args)
	if err != nil {
		return 0, fmt.Errorf("inbox: read cursor %s/%d: %w", topic, user, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return seq, nil // inserted
	}
	return res.LastInsertId()
}

// putPrefs sets the caller's preferences of topic; nil leaves one as it is.
func putPrefs(ctx context.Context, db *sql.DB, user int64, topic string, pinned *bool, mute *time.Time, clearMute bool) error {
	cols, vals, upd := []string{"user_id", "topic"}, []any{user, topic}, ""
	if pinned != nil {
		cols, vals = append(cols, "pinned"), append(vals, *pinned)
		upd = "pinned = VALUES(pinned)"
	}
	if mute != nil || clearMute {
		var v any
		if mute != nil {
			v = mute.UTC()
		}
		cols, vals = append(cols, "notify_muted_until"), append(vals, v)
		if upd != "" {
			upd += ", "
		}
		upd += "notify_muted_until = VALUES(notify_muted_until)"
	}
	_, err := sq.Insert(cursorsTable).Columns(cols...).Values(vals...).
		Suffix("ON DUPLICATE KEY UPDATE " + upd).RunWith(db).ExecContext(ctx)
	if err != nil {
		return fmt.Errorf("inbox: preferences %s/%d: %w", topic, user, err)
	}
	return nil
}

// readState is the caller's cursor row of one topic (zero if none).
func readState(ctx context.Context, db *sql.DB, user int64, topic string) (readSeq int64, pinned bool, mute sql.NullTime, err error) {
	err = sq.Select("read_seq", "pinned", "notify_muted_until").From(cursorsTable).
		Where(sq.Eq{"user_id": user, "topic": topic}).RunWith(db).QueryRowContext(ctx).Scan(&readSeq, &pinned, &mute)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return readSeq, pinned, mute, err
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
	idx := make(map[string]int, len(us))
	names := make([]string, len(us))
	for i, u := range us {
		idx[u.topic], names[i] = i, u.topic
	}
	for lo := 0; lo < len(names); lo += 500 {
		rows, err := sq.Select("topic", "updated_at").From(readpath.TopicChangesTable).
			Where(sq.Eq{"topic": names[lo:min(len(names), lo+500)]}).RunWith(db).QueryContext(ctx)
		if err != nil {
			return fmt.Errorf("inbox: topic changes: %w", err)
		}
		for rows.Next() {
			var t string
			var at time.Time
			if err := rows.Scan(&t, &at); err != nil {
				rows.Close()
				return err
			}
			if u := &us[idx[t]]; at.After(u.changedAt) {
				u.changedAt = at
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// leftTopic is a cursor row changed after a time (a leave touches it).
type leftTopic struct {
	topic string
	at    time.Time
}

// leftTopics lists the caller's cursor rows changed after since; the
// caller keeps those of topics it is no longer a member of.
func leftTopics(ctx context.Context, db *sql.DB, user int64, since time.Time) ([]leftTopic, error) {
	rows, err := sq.Select("topic", "updated_at").From(cursorsTable).
		Where(sq.Eq{"user_id": user}).Where(sq.Gt{"updated_at": since.UTC()}).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("inbox: cursors of %d: %w", user, err)
	}
	defer rows.Close()
	var out []leftTopic
	for rows.Next() {
		var l leftTopic
		if err := rows.Scan(&l.topic, &l.at); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
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
const unreadBranch = "(SELECT ? AS i, m.seqid, m.from_user, m.status, " +
	"NOT EXISTS (SELECT 1 FROM " + readpath.DellogTable + " AS d WHERE d.topic = m.topic AND d.deletedfor = ? AND d.low <= m.seqid AND d.hi > m.seqid) " +
	"FROM %s AS m WHERE m.topic = ? AND m.seqid > ? ORDER BY m.seqid DESC LIMIT %d)"

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
		if leg.Hi > u.readSeq {
			// the legacy table holds seqs above the cursor: walked alone
			alone = append(alone, i)
			continue
		}
		if u.mirror.LastSeq() <= u.readSeq {
			continue
		}
		var months []routing.Month
		for _, r := range u.mirror.Rows {
			if r.MaxSeq > u.readSeq {
				months = append(months, r.Month)
			}
		}
		if len(months) == 1 {
			byMonth[months[0]] = append(byMonth[months[0]], i)
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

// mentionQuery reads the caller's entries of the mention index — theirs
// and everyone's (user 0) — above the cursor of each of mentionBranches
// topics, leaving out what the caller hid: two ranges of the primary key
// (topic, user_id, seq) per topic. Recalled and deleted messages have no
// entries (the change drops them) and neither do gaps.
var mentionQuery = "SELECT x.topic, x.seq FROM " + routing.MentionsTable + " AS x WHERE x.user_id IN (?, 0) AND (" +
	strings.Repeat("(x.topic = ? AND x.seq > ?) OR ", mentionBranches-1) + "(x.topic = ? AND x.seq > ?)) " +
	"AND NOT EXISTS (SELECT 1 FROM " + readpath.DellogTable + " AS d WHERE d.topic = x.topic AND d.deletedfor = ? AND d.low <= x.seq AND d.hi > x.seq)"

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
