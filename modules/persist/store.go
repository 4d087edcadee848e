package persist

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// compensationTable is the fixed table of events held for sealed months
// (sql/migrations/0002_persist_queues.sql).
const compensationTable = "im_group_message_compensation"

// writeResult sorts a batch's records by what the transaction did with them.
type writeResult struct {
	inserted []*record     // new rows, counted in the mirror
	ranges   []*topicRange // inserted, by topic
	replayed []*record     // this (topic, seq) was already stored: a redelivery
	dedup    []*record     // this client_msg_id is stored under another seq
}

// errInsertCollision is a batch whose slow path still inserted fewer rows than it
// classified as new: a row collides on a key the slow path does not read
// (see classify).
var errInsertCollision = errors.New("persist: rows collide on a unique key with rows the batch did not find")

// writeBatch stores one tenant+month batch in one transaction (invariant 8,
// docs/invariants.md), the cheapest scheme that keeps exactly-once:
//
//   - No consume-log row per message: the month table's uk_topic_seq already
//     makes a redelivered event a no-op, and the mirror counts only the rows
//     the insert actually added, so a replayed batch changes nothing. Kafka
//     offsets are not stored in the database: one partition carries many
//     tenants' databases.
//   - The insert is `INSERT … ON DUPLICATE KEY UPDATE seqid = seqid`, not
//     INSERT IGNORE: both skip a row that hits a unique key, but IGNORE would
//     also turn "data too long" or invalid JSON into a silently truncated row.
//   - Cross-month dedup writes no row either: a client_msg_id retried across
//     the boundary (Redis forgot the first attempt, so the retry got a new seq
//     in the next month) is caught by probing the unique key
//     uk_topic_sender_client_mid of the neighbouring months' tables (previous,
//     and next for late events: an original held in the compensation queue
//     may be stored after its retry) — only where a duplicate is possible,
//     see Service.neighbours — one indexed read per event in one statement
//     per neighbour, with shared locks so that two writers racing across the
//     boundary serialise (one of them deadlocks, retries and then sees the
//     other). Within a month the same unique key catches it. The probe
//     reaches one month back; the dedup window (persist.dedup_retention,
//     7 days) is shorter than a month, so this keeps the dedup table's
//     guarantee without its row per message.
//
// The common case is one probe per neighbour, one insert and one mirror
// upsert (and, when a message mentions someone, one insert into the
// mention index: an entry per mention, never per member). Only when the insert added fewer rows than expected (a redelivery,
// or a same-month duplicate) is the batch rolled back and redone on the slow
// path, which reads the existing keys first to know exactly which rows are
// new.
func writeBatch(ctx context.Context, db *sql.DB, table routing.Table, neighbours []routing.Table, recs []*record) (writeResult, error) {
	slices.SortFunc(recs, func(a, b *record) int {
		if c := strings.Compare(a.ev.Topic, b.ev.Topic); c != 0 {
			return c
		}
		return cmp.Compare(a.ev.SeqID, b.ev.SeqID)
	})
	res, ok, err := writeTx(ctx, db, table, neighbours, recs, false)
	if err != nil || ok {
		return res, err
	}
	res, ok, err = writeTx(ctx, db, table, neighbours, recs, true)
	if err == nil && !ok {
		err = errInsertCollision
	}
	return res, err
}

// errShortInsert rolls a batch back whose insert added fewer rows than it
// was given.
var errShortInsert = errors.New("persist: the insert added fewer rows than given")

// writeTx runs the transaction (routing.Fenced: the placement fence is its
// first statement, so its shared lock covers the whole transaction); ok
// is false (and the transaction rolled back) when the insert added fewer
// rows than it was given.
func writeTx(ctx context.Context, db *sql.DB, table routing.Table, neighbours []routing.Table, recs []*record, slow bool) (writeResult, bool, error) {
	var res writeResult
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		res = writeResult{}
		return writeIn(ctx, tx, table, neighbours, recs, slow, &res)
	})
	switch {
	case errors.Is(err, errShortInsert):
		return writeResult{}, false, nil
	case err != nil:
		return res, false, err
	}
	return res, true, nil
}

func writeIn(ctx context.Context, tx *sql.Tx, table routing.Table, neighbours []routing.Table, recs []*record, slow bool, res *writeResult) error {
	todo := recs
	var err error
	for _, n := range neighbours {
		var hits []*record
		if todo, hits, err = probeOtherMonth(ctx, tx, n, todo); err != nil {
			return err
		}
		res.dedup = append(res.dedup, hits...)
	}
	if slow {
		var replayed, dups []*record
		if todo, replayed, dups, err = splitExisting(ctx, tx, table, todo); err != nil {
			return err
		}
		res.replayed = append(res.replayed, replayed...)
		res.dedup = append(res.dedup, dups...)
	}
	if len(todo) > 0 {
		n, err := insertRows(ctx, tx, table, todo)
		if err != nil {
			return err
		}
		if n != int64(len(todo)) {
			return errShortInsert
		}
		res.ranges = topicRanges(todo)
		if err := upsertMirror(ctx, tx, table.Month(), res.ranges); err != nil {
			return err
		}
		if err := routing.AddMentions(ctx, tx, mentionsOf(todo)); err != nil {
			return err
		}
	}
	res.inserted = todo
	return nil
}

func senderKey(r *record) sq.Eq {
	return sq.Eq{"topic": r.ev.Topic, "from_user": int64(r.ev.FromUser), "client_msg_id": r.ev.ClientMsgID}
}

type dedupKey struct {
	topic    string
	fromUser int64
	cmid     string
}

func keyOf(r *record) dedupKey {
	return dedupKey{r.ev.Topic, int64(r.ev.FromUser), r.ev.ClientMsgID}
}

// probeOtherMonth splits recs into those whose client_msg_id is not stored
// in table t (another month) and those that are (dedup hits).
func probeOtherMonth(ctx context.Context, tx *sql.Tx, t routing.Table, recs []*record) (rest, hits []*record, err error) {
	if len(recs) == 0 {
		return recs, nil, nil
	}
	or := make(sq.Or, 0, len(recs))
	for _, r := range recs {
		or = append(or, senderKey(r))
	}
	rows, err := sq.Select("topic", "from_user", "client_msg_id").From(t.Quoted()).Where(or).
		Suffix("LOCK IN SHARE MODE").RunWith(tx).QueryContext(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("persist: dedup probe %s: %w", t.Name(), err)
	}
	defer rows.Close()
	found := map[dedupKey]bool{}
	for rows.Next() {
		var k dedupKey
		if err := rows.Scan(&k.topic, &k.fromUser, &k.cmid); err != nil {
			return nil, nil, fmt.Errorf("persist: dedup probe %s: %w", t.Name(), err)
		}
		found[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("persist: dedup probe %s: %w", t.Name(), err)
	}
	if len(found) == 0 {
		return recs, nil, nil
	}
	rest = make([]*record, 0, len(recs))
	for _, r := range recs {
		if found[keyOf(r)] {
			hits = append(hits, r)
		} else {
			rest = append(rest, r)
		}
	}
	return rest, hits, nil
}

type seqKey struct {
	topic string
	seq   int64
}

// splitExisting reads, with locks, which of recs the month table already
// holds by (topic, seq) — a redelivery — or by client_msg_id under another
// seq — a duplicate send; duplicates inside the batch itself keep the first.
func splitExisting(ctx context.Context, tx *sql.Tx, t routing.Table, recs []*record) (fresh, replayed, dups []*record, err error) {
	or := make(sq.Or, 0, 2*len(recs))
	for _, r := range recs {
		or = append(or, sq.Eq{"topic": r.ev.Topic, "seqid": r.ev.SeqID}, senderKey(r))
	}
	rows, err := sq.Select("topic", "seqid", "from_user", "client_msg_id").From(t.Quoted()).Where(or).
		Suffix("FOR UPDATE").RunWith(tx).QueryContext(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("persist: read existing %s: %w", t.Name(), err)
	}
	defer rows.Close()
	seqs := map[seqKey]bool{}
	senders := map[dedupKey]bool{}
	for rows.Next() {
		var sk seqKey
		var dk dedupKey
		var cmid sql.NullString
		if err := rows.Scan(&sk.topic, &sk.seq, &dk.fromUser, &cmid); err != nil {
			return nil, nil, nil, fmt.Errorf("persist: read existing %s: %w", t.Name(), err)
		}
		dk.topic, dk.cmid = sk.topic, cmid.String
		seqs[sk] = true
		if cmid.Valid {
			senders[dk] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("persist: read existing %s: %w", t.Name(), err)
	}
	for _, r := range recs {
		sk, dk := seqKey{r.ev.Topic, r.ev.SeqID}, keyOf(r)
		switch {
		case seqs[sk]:
			replayed = append(replayed, r)
		case senders[dk]:
			dups = append(dups, r)
		default:
			seqs[sk], senders[dk] = true, true
			fresh = append(fresh, r)
		}
	}
	return fresh, replayed, dups, nil
}

var insertColumns = []string{"message_id", "topic", "group_id", "seqid", "from_user", "client_msg_id", "msg_type",
	"content", "head", "mentioned_user_ids", "mention_all", "reply_seqid", "root_seqid", "content_size",
	"created_at", "updated_at"}

// insertRows adds recs to the month table and returns how many rows it
// really added (a row that hits a unique key is left as it is and counts 0).
func insertRows(ctx context.Context, tx *sql.Tx, t routing.Table, recs []*record) (int64, error) {
	q, err := insertQuery(t.Quoted(), recs)
	if err != nil {
		return 0, err
	}
	res, err := q.Suffix("ON DUPLICATE KEY UPDATE seqid = seqid").RunWith(tx).ExecContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("persist: insert %s: %w", t.Name(), err)
	}
	return res.RowsAffected()
}

// insertQuery is the multi-row insert of recs into quoted, a month table.
func insertQuery(quoted string, recs []*record) (sq.InsertBuilder, error) {
	q := sq.Insert(quoted).Columns(insertColumns...)
	for _, r := range recs {
		e := r.ev
		var head, mentions any
		if len(e.Head) > 0 && string(e.Head) != "null" {
			head = string(e.Head)
		}
		if len(e.MentionedUserIDs) > 0 {
			b, err := json.Marshal(e.MentionedUserIDs)
			if err != nil {
				return q, err
			}
			mentions = string(b)
		}
		created := e.CreatedAt.UTC()
		q = q.Values(int64(e.MessageID), e.Topic, int64(e.GroupID), e.SeqID, int64(e.FromUser), e.ClientMsgID, e.MsgType,
			string(e.Content), head, mentions, e.MentionAll, e.ReplySeqID, e.RootSeqID, len(e.Content), created, created)
	}
	return q, nil
}

// upsertMirror widens the topics' ranges in the MySQL route mirror by the
// rows just inserted, trs (one row per topic).
func upsertMirror(ctx context.Context, tx *sql.Tx, m routing.Month, trs []*topicRange) error {
	rows := make([]routing.MirrorRow, len(trs))
	for i, tr := range trs {
		rows[i] = routing.MirrorRow{Topic: tr.topic, MonthRange: tr.MonthRange, MinCreatedAt: tr.minAt, MaxCreatedAt: tr.maxAt}
		rows[i].Month = m
	}
	if err := routing.WidenMirror(ctx, tx, rows); err != nil {
		return fmt.Errorf("persist: %s: %w", m, err)
	}
	return nil
}

// mentionsOf is the mention index entries of recs (rows the transaction
// inserted: a replayed or duplicate record adds none), in topic order.
func mentionsOf(recs []*record) []routing.Mention {
	var out []routing.Mention
	for _, r := range recs {
		e := r.ev
		if !e.MentionAll && len(e.MentionedUserIDs) == 0 {
			continue
		}
		users := make([]int64, len(e.MentionedUserIDs))
		for i, id := range e.MentionedUserIDs {
			users[i] = int64(id)
		}
		out = append(out, routing.MentionsOf(e.Topic, e.SeqID, users, e.MentionAll)...)
	}
	return out
}

// topicRange is one topic's part of a batch: its month range and times.
type topicRange struct {
	topic string
	routing.MonthRange
	minAt, maxAt time.Time
	recs         []*record
}

// topicRanges groups records by topic, in topic order (the same order every
// writer locks mirror rows in, so concurrent batches do not deadlock on it).
func topicRanges(recs []*record) []*topicRange {
	by := map[string]*topicRange{}
	var out []*topicRange
	for _, r := range recs {
		tr := by[r.ev.Topic]
		at := r.ev.CreatedAt.UTC()
		if tr == nil {
			tr = &topicRange{topic: r.ev.Topic, MonthRange: routing.MonthRange{Month: r.month, MinSeq: r.ev.SeqID, MaxSeq: r.ev.SeqID},
				minAt: at, maxAt: at}
			by[r.ev.Topic] = tr
			out = append(out, tr)
		}
		tr.MinSeq, tr.MaxSeq = min(tr.MinSeq, r.ev.SeqID), max(tr.MaxSeq, r.ev.SeqID)
		if at.Before(tr.minAt) {
			tr.minAt = at
		}
		if at.After(tr.maxAt) {
			tr.maxAt = at
		}
		tr.Count++
		tr.recs = append(tr.recs, r)
	}
	slices.SortFunc(out, func(a, b *topicRange) int { return strings.Compare(a.topic, b.topic) })
	return out
}
