package readpath

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	sq "github.com/Masterminds/squirrel"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// dellogTable is the fixed table of deletion ranges (never built from input).
const dellogTable = "im_dellog"

var Columns = []string{"m.topic", "m.seqid", "m.message_id", "m.group_id", "m.from_user", "m.client_msg_id",
	"m.msg_type", "m.status", "m.content", "m.head", "m.mentioned_user_ids", "m.mention_all", "m.reply_seqid",
	"m.root_seqid", "m.version", "m.created_at", "m.updated_at"}

// NotHiddenAt is the condition that the row whose topic and seq are the
// columns topic and seq (names from the code, never from a request) lies
// in none of the caller's deletion ranges [low, hi); its one placeholder is
// the caller. The ranges' alias is d.
//
// A caller's ranges of a topic are disjoint (AddHiddenRange merges every
// new range with those it overlaps or touches), so the only range that can
// hold a seq is the one starting last at or below it. MySQL finds it by
// reading the caller's ranges down the (topic, deletedfor, low) index from
// the newest: only the ranges above the row are read — none for the newest
// messages, which are what badges and first pages read — where "any range
// holding the seq" reads every range starting below it, all of them for
// the newest messages (a badge over 599 ranges took 489 ms that way).
func NotHiddenAt(topic, seq string) string {
	return "COALESCE((SELECT d.hi FROM " + dellogTable + " AS d WHERE d.topic = " + topic +
		" AND d.deletedfor = ? AND d.low <= " + seq + " ORDER BY d.low DESC LIMIT 1), 0) <= " + seq
}

// NotHidden drops message rows (alias m) inside one of the caller's
// deletion ranges: applied in every month table's query, so a run hidden
// by deletions is skipped by the index, never paged through.
var NotHidden = NotHiddenAt("m.topic", "m.seqid")

// MaxHiddenRanges bounds one caller's disjoint deletion ranges of one
// topic: what a cache entry, a badge and a page may have to consider stays
// bounded whatever one user does. A hide that would leave more is refused
// (ErrTooManyHidden); one that joins ranges is always taken.
const MaxHiddenRanges = 1000

// ErrTooManyHidden refuses a hide that would leave the caller more than
// MaxHiddenRanges disjoint ranges in the topic.
var ErrTooManyHidden = errors.New("readpath: too many deletion ranges")

// AddHiddenRange records in tx that user hid the seqs [low, hi) of topic,
// merged with every range of the user's it overlaps or touches: the rows
// of (topic, user) stay disjoint, which NotHiddenAt relies on. It locks
// the user's rows of the topic first, so concurrent hides of one user
// serialise (or one of them deadlocks and runs again: the caller retries).
func AddHiddenRange(ctx context.Context, tx *sql.Tx, topic string, user, low, hi int64) error {
	rows, err := sq.Select("id", "low", "hi").From(dellogTable).Where(sq.Eq{"topic": topic, "deletedfor": user}).
		Suffix("FOR UPDATE").RunWith(tx).QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("readpath: add hidden range: %w", err)
	}
	var absorbed []int64
	kept := 0
	for rows.Next() {
		var id, l, h int64
		if err := rows.Scan(&id, &l, &h); err != nil {
			rows.Close()
			return fmt.Errorf("readpath: add hidden range: %w", err)
		}
		if l <= hi && h >= low {
			absorbed = append(absorbed, id)
			low, hi = min(low, l), max(hi, h)
			continue
		}
		kept++
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("readpath: add hidden range: %w", err)
	}
	if kept+1 > MaxHiddenRanges {
		return ErrTooManyHidden
	}
	if len(absorbed) > 0 {
		if _, err := sq.Delete(dellogTable).Where(sq.Eq{"id": absorbed}).RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("readpath: add hidden range: %w", err)
		}
	}
	if _, err := sq.Insert(dellogTable).Columns("topic", "deletedfor", "low", "hi").Values(topic, user, low, hi).
		RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("readpath: add hidden range: %w", err)
	}
	return nil
}

// Store runs the read statements. Each distinct statement is prepared once
// per pool and reused: a page is then one round trip to MySQL instead of
// prepare, execute and close. Values, the page size included, are bound as
// parameters, so the statements are a handful of shapes per table, not one
// per limit.
type Store struct {
	stmts *lru.Cache[stmtKey, *sql.Stmt]
}

type stmtKey struct {
	db    *sql.DB
	query string
}

// maxStmts caps the prepared statements kept (MySQL's
// max_prepared_stmt_count is per server). Beyond it the least recently used
// one is closed — it is prepared again on its next use — so statements of
// pools closed since (evicted tenants) age out.
const maxStmts = 512

func newStore() *Store {
	c, err := lru.NewWithEvict(maxStmts, func(_ stmtKey, st *sql.Stmt) { _ = st.Close() })
	if err != nil {
		panic(err) // only for a size below 1
	}
	return &Store{stmts: c}
}

func (s *Store) close() { s.stmts.Purge() }

func (s *Store) stmt(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	k := stmtKey{db, query}
	if st, ok := s.stmts.Get(k); ok {
		return st, nil
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if old, ok, _ := s.stmts.PeekOrAdd(k, st); ok {
		// another reader prepared it meanwhile
		_ = st.Close()
		return old, nil
	}
	return st, nil
}

// forget drops a statement that failed (closed by an eviction meanwhile,
// or its pool closed), closing it.
func (s *Store) forget(db *sql.DB, query string) { s.stmts.Remove(stmtKey{db, query}) }

// Messages runs a SELECT of columns and scans every row.
func (s *Store) Messages(ctx context.Context, db *sql.DB, b sq.SelectBuilder) ([]message.Message, error) {
	query, args, err := b.ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := s.Run(ctx, db, query, args)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []message.Message
	for rows.Next() {
		m, err := ScanMessage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Exec runs a write of fixed shape as db's cached prepared statement in
// tx, a fenced transaction of db (routing.Fenced): no prepare per call,
// where an ad-hoc statement with arguments costs one. Like run it
// prepares afresh once when the statement was dropped, so the write must
// be one that may run twice.
func (s *Store) Exec(ctx context.Context, db *sql.DB, tx *sql.Tx, query string, args []any) (sql.Result, error) {
	return withStmt(ctx, s, db, query, func(st *sql.Stmt) (sql.Result, error) { return tx.StmtContext(ctx, st).ExecContext(ctx, args...) })
}

func (s *Store) Run(ctx context.Context, db *sql.DB, query string, args []any) (*sql.Rows, error) {
	return withStmt(ctx, s, db, query, func(st *sql.Stmt) (*sql.Rows, error) { return st.QueryContext(ctx, args...) })
}

// withStmt runs fn on the cached statement of query; if that fails, the
// statement may have been dropped meanwhile (cache full, pool closed): it
// is prepared afresh and fn runs once more.
func withStmt[T any](ctx context.Context, s *Store, db *sql.DB, query string, fn func(*sql.Stmt) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		st, err := s.stmt(ctx, db, query)
		if err != nil {
			var zero T
			return zero, err
		}
		out, err := fn(st)
		if err == nil || attempt > 0 || ctx.Err() != nil {
			return out, err
		}
		s.forget(db, query)
	}
}

// Row is one message row as a month table holds it, in the columns of
// Columns: what ScanMessage reads from MySQL and an archived month's rows
// are given as (ColdMonths), so both tiers render a message alike.
type Row struct {
	Topic                    string
	Seq                      int64
	MessageID, GroupID, From int64
	ClientMsgID              sql.NullString
	MsgType, Status          string
	Content, Head, Mentions  []byte // nil: NULL
	MentionAll               bool
	ReplySeqID, RootSeqID    sql.NullInt64
	Version                  int
	CreatedAt, UpdatedAt     time.Time
}

// Message is the row as the API renders it.
func (r *Row) Message() (message.Message, error) {
	m := message.Message{Topic: r.Topic, Seq: r.Seq, MessageID: message.ID(r.MessageID), GroupID: message.ID(r.GroupID),
		FromUser: message.ID(r.From), ClientMsgID: r.ClientMsgID.String, MsgType: r.MsgType, Status: r.Status,
		MentionAll: r.MentionAll, Version: r.Version,
		CreatedAt: message.NewTime(r.CreatedAt), UpdatedAt: message.NewTime(r.UpdatedAt)}
	if r.Content != nil {
		m.Content = json.RawMessage(r.Content)
	}
	if r.Head != nil {
		m.Head = json.RawMessage(r.Head)
	}
	if len(r.Mentions) > 0 {
		if err := json.Unmarshal(r.Mentions, &m.MentionedUserIDs); err != nil {
			return m, fmt.Errorf("readpath: mentioned_user_ids of %s/%d: %w", m.Topic, m.Seq, err)
		}
	}
	if r.ReplySeqID.Valid {
		m.ReplySeqID = &r.ReplySeqID.Int64
	}
	if r.RootSeqID.Valid {
		m.RootSeqID = &r.RootSeqID.Int64
	}
	return m.Normalized(), nil
}

func ScanMessage(rows *sql.Rows) (message.Message, error) {
	var r Row
	if err := rows.Scan(&r.Topic, &r.Seq, &r.MessageID, &r.GroupID, &r.From, &r.ClientMsgID, &r.MsgType, &r.Status,
		&r.Content, &r.Head, &r.Mentions, &r.MentionAll, &r.ReplySeqID, &r.RootSeqID, &r.Version, &r.CreatedAt,
		&r.UpdatedAt); err != nil {
		return message.Message{}, fmt.Errorf("readpath: scan: %w", err)
	}
	return r.Message()
}

// ListQuery is one month table's share of a list page.
type ListQuery struct {
	Topic       string
	User        int64
	Order       Order
	Bound       int64 // exclusive: seq < bound (Desc) or seq > bound (Asc)
	UpTo        int64 // Asc only: seq <= upTo (a since page's settled watermark; unbounded for context)
	Floor       int64 // Desc only, when above 0: seq > floor (month tables above a migration's cutover_seq, a search below the retention floor)
	Limit       int
	KeepDeleted bool // context keeps globally deleted rows as tombstones
	HidNothing  bool // the caller is known to have no deletion range: no anti-join
	Match       *TextMatch
}

// Unbounded is the upTo of a forward read that is no cursor walk (the
// messages after a context's target): a since page is always bounded by
// its settled watermark.
const Unbounded = math.MaxInt64

// TextMatch narrows a newest-first list to a search: messages neither
// recalled nor deleted, created in [from, to), whose content.text contains
// like's text (a LIKE … ESCAPE '!' pattern).
type TextMatch struct {
	From, To time.Time
	Like     string
}

// build is the statement for one table, given as its quoted name.
func (q ListQuery) build(table string) sq.SelectBuilder {
	from := table + " AS m"
	if q.Match != nil && table != routing.LegacyQuoted() {
		// a month table's rows of the window: (topic, created_at); the
		// legacy table may have no such index and is walked by seq
		from += " FORCE INDEX (idx_topic_created)"
	}
	b := sq.Select(Columns...).From(from).Where(sq.Eq{"m.topic": q.Topic})
	if m := q.Match; m != nil {
		b = b.Where(sq.Eq{"m.status": message.StatusNormal}).
			Where(sq.GtOrEq{"m.created_at": m.From}).Where(sq.Lt{"m.created_at": m.To}).
			Where("JSON_UNQUOTE(JSON_EXTRACT(m.content, '$.text')) LIKE ? ESCAPE '!'", m.Like)
	}
	if q.Order == Desc {
		b = b.Where(sq.Lt{"m.seqid": q.Bound})
		if q.Floor > 0 {
			b = b.Where(sq.Gt{"m.seqid": q.Floor})
		}
		b = b.OrderBy("m.seqid DESC")
	} else {
		b = b.Where(sq.Gt{"m.seqid": q.Bound})
		if q.UpTo < Unbounded {
			b = b.Where(sq.LtOrEq{"m.seqid": q.UpTo})
		}
		b = b.OrderBy("m.seqid ASC")
	}
	if !q.KeepDeleted {
		b = b.Where(sq.NotEq{"m.status": message.StatusDeleted})
	}
	if !q.HidNothing {
		b = b.Where(NotHidden, q.User)
	}
	return b.Suffix("LIMIT ?", q.Limit)
}

// SelectByID selects message id from the table quoted.
func SelectByID(quoted string, id int64) sq.SelectBuilder {
	return sq.Select(Columns...).From(quoted + " AS m").Where(sq.Eq{"m.message_id": id})
}

// One reads (topic, seq) from the table quoted unless the caller hid it.
func (s *Store) One(ctx context.Context, db *sql.DB, quoted, topic string, user, seq int64) (message.Message, bool, error) {
	ms, err := s.Messages(ctx, db, sq.Select(Columns...).From(quoted+" AS m").
		Where(sq.Eq{"m.topic": topic, "m.seqid": seq}).Where(NotHidden, user).Limit(1))
	if err != nil || len(ms) == 0 {
		return message.Message{}, false, err
	}
	return ms[0], true, nil
}

// HiddenRanges reads the caller's deletion ranges of topic that reach above lo,
// at most limit of them (0: all).
func (s *Store) HiddenRanges(ctx context.Context, db *sql.DB, topic string, user, lo int64, limit uint64) (Hidden, error) {
	b := sq.Select("low", "hi").From(dellogTable).Where(sq.Eq{"topic": topic, "deletedfor": user}).Where(sq.Gt{"hi": lo})
	if limit > 0 {
		b = b.Suffix("LIMIT ?", limit)
	}
	query, args, err := b.ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := s.Run(ctx, db, query, args)
	if err != nil {
		return nil, fmt.Errorf("readpath: dellog: %w", err)
	}
	defer rows.Close()
	var h Hidden
	for rows.Next() {
		var r [2]int64
		if err := rows.Scan(&r[0], &r[1]); err != nil {
			return nil, err
		}
		h = append(h, r)
	}
	return h, rows.Err()
}

// hiddenOfTopics reads the caller's deletion ranges of many topics in one
// statement (the (topic, deletedfor, low) index, one range per topic), at
// most hiddenReadMax of each topic as hidden reads them.
func (s *Store) hiddenOfTopics(ctx context.Context, db *sql.DB, topics []string, user int64) (map[string]Hidden, error) {
	rows, err := sq.Select("topic", "low", "hi").From(dellogTable).Where(sq.Eq{"topic": topics, "deletedfor": user}).
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("readpath: dellog: %w", err)
	}
	defer rows.Close()
	out := map[string]Hidden{}
	for rows.Next() {
		var t string
		var r [2]int64
		if err := rows.Scan(&t, &r[0], &r[1]); err != nil {
			return nil, err
		}
		if uint64(len(out[t])) < hiddenReadMax {
			out[t] = append(out[t], r)
		}
	}
	return out, rows.Err()
}
