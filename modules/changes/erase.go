package changes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// EraseMessages deletes the messages refs of month m for everyone as one
// change per topic (a batch of a user erase, by actor 0, the system): in
// one transaction the rows not deleted yet are made tombstones by the
// delete's rule (status deleted, content and head cleared, version + 1,
// updated_at now), their mention index entries dropped and their earlier
// revisions' content cleared; each topic of the batch takes one change_seq, one revision row
// (action erase, no content, the topic's seqs in seq_ids) and one change
// event (action erase, the seqs in seq_ids, no message: a reader rebuilds
// each tombstone by that rule); the caches are told before the commit and
// each topic's change frame (its seqs) published after it. before runs in
// the transaction (tx, for the caller's own writes) after its writes with
// what they changed (messages made tombstones, earlier revisions whose
// content was cleared); its error rolls the batch back and is answered as
// it is. A message already deleted, or no longer stored, is left out; one
// of an archived month changes its overlay row, as a change does.
//
// A month table's rows are not read first when none of refs was deleted
// before (tombstoneRows: one UPDATE that skips deleted rows, the mention
// entries dropped by (topic, seq)), and for their status only when some
// were; never their content: the tombstone is the same whatever they held.
// scan, when not nil, is the caller's read of archived month m that found
// refs: their tombstones are made from its rows while it is current
// (routing.ArchiveScan), without reading the archive again.
func (s *Service) EraseMessages(ctx context.Context, tenant string, m routing.Month, refs []routing.MessageRef, scan *routing.ArchiveScan, reason string,
	before func(tx *sql.Tx, messages, revisions int64) error) (messages, revisions int64, err error) {
	if len(refs) == 0 {
		return 0, 0, nil
	}
	if err := s.p.Migrations.GateChange(ctx, tenant); err != nil {
		return 0, 0, err
	}
	refs = slices.Clone(refs)
	routing.SortRefs(refs)
	keys, db, err := s.r.Open(ctx, httpapi.Principal{Tenant: tenant}, refs[0].Topic)
	if err != nil {
		return 0, 0, err
	}
	t, err := routing.TableFor(m)
	if err != nil {
		return 0, 0, err
	}
	var e erased
	err = runChange(ctx, db, func(tx *sql.Tx) error {
		var err error
		if e, err = s.eraseIn(ctx, tx, keys, t, tenant, refs, scan, reason); err != nil {
			return err
		}
		return before(tx, e.messages, e.revisionsCleared)
	}, true)
	if errors.Is(err, errUnchanged) || errors.Is(err, readpath.ErrNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	s.afterErase(context.WithoutCancel(ctx), keys, e)
	return e.messages, e.revisionsCleared, nil
}

// erased is what an erase batch's transaction wrote, for what follows its
// commit.
type erased struct {
	topics           []erasedTopic   // in topic order
	overlaid         []routing.Month // the archived month whose overlay the batch changed
	at               message.Time
	messages         int64
	revisionsCleared int64
}

// erasedTopic is one topic's change of an erase batch: its seqs
// (ascending) and the change_seq they took.
type erasedTopic struct {
	topic     string
	seqs      []int64
	changeSeq int64
}

// eraseIn is EraseMessages' transaction; errUnchanged when no message of
// refs is left to erase.
func (s *Service) eraseIn(ctx context.Context, tx *sql.Tx, keys routing.Keys, t routing.Table, tenant string, refs []routing.MessageRef,
	scan *routing.ArchiveScan, reason string) (erased, error) {
	e := erased{at: message.NewTime(time.Now())}
	// the month's catalog row, shared: an archive's mark waits for the
	// batch, and a batch after the mark changes the overlay instead
	open, archived, err := routing.LockForChange(ctx, tx, []routing.Table{t})
	if errors.Is(err, routing.ErrMonthRestoring) {
		return e, monthRestoring()
	}
	if err != nil {
		return e, err
	}
	fail := func(err error) (erased, error) {
		return e, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	at := e.at.Time
	up := sq.Update("").Set("status", message.StatusDeleted).Set("content", nil).Set("head", nil).
		Set("version", sq.Expr("version + 1")).Set("updated_at", at).Set("deleted_at", at)
	var live []routing.MessageRef
	switch {
	case len(open) > 0:
		live, err = tombstoneRows(ctx, tx, open[0], refs, up)
	case len(archived) > 0:
		e.overlaid = []routing.Month{archived[0].Month()}
		var done bool
		if live, done, err = s.tombstoneArchived(ctx, tx, tenant, archived[0].Month(), refs, scan, at); err != nil || done {
			break
		}
		var locked []lockedMsg
		locked, err = s.lockArchived(ctx, tx, tenant, archived, refs)
		for _, l := range locked {
			if l.msg.Status != message.StatusDeleted {
				live = append(live, routing.MessageRef{Topic: l.msg.Topic, Seq: l.msg.Seq})
			}
		}
		if err == nil && len(live) > 0 {
			if err = (tableOf{table: archived[0], overlay: true}).update(ctx, tx, up, live, false); err != nil {
				return fail(err)
			}
		}
	}
	if err != nil {
		return e, err
	}
	if len(live) == 0 {
		return e, errUnchanged
	}
	if err := routing.DropMentionsAt(ctx, tx, live); err != nil {
		return fail(err)
	}
	// before this change's revisions exist: those keep nothing anyway
	if e.revisionsCleared, err = readpath.EraseRevisionContent(ctx, tx, live); err != nil {
		return fail(err)
	}
	e.messages = int64(len(live))
	var runs []readpath.ChangeRun
	for i, r := range live {
		if i == 0 || live[i-1].Topic != r.Topic {
			runs = append(runs, readpath.ChangeRun{Topic: r.Topic, N: 1})
			e.topics = append(e.topics, erasedTopic{topic: r.Topic})
		}
		et := &e.topics[len(e.topics)-1]
		et.seqs = append(et.seqs, r.Seq)
	}
	starts, err := readpath.NextChangeSeqs(ctx, tx, runs)
	if err != nil {
		return fail(err)
	}
	revs := make([]readpath.NewRevision, len(e.topics))
	evs := make([]feed.Event, len(e.topics))
	for i := range e.topics {
		et := &e.topics[i]
		et.changeSeq = starts[i]
		revs[i] = readpath.NewRevision{Topic: et.topic, Month: t.Month(), Seq: et.seqs[len(et.seqs)-1], Action: message.ActionErase,
			Reason: reason, ChangeSeq: et.changeSeq, At: at, SeqIDs: et.seqs}
		evs[i] = feed.Event{Tenant: tenant, Topic: et.topic, ChangeSeq: et.changeSeq, Action: message.ActionErase,
			SeqID: et.seqs[0], ShardMonth: t.Month().String(), Reason: reason, At: e.at, SeqIDs: et.seqs}
	}
	if err := readpath.RecordRevisions(ctx, tx, revs); err != nil {
		return fail(err)
	}
	if err := feed.RecordAll(ctx, tx, evs); err != nil {
		return fail(err)
	}
	if _, err := s.tellCaches(ctx, keys, live); err != nil {
		return e, httpapi.Wrap(httpapi.CodeUnavailable, "the caches cannot be told (Redis unavailable): nothing changed, retry", err)
	}
	return e, nil
}

// eraseSavepoint is where tombstoneRows rolls its one-statement try back
// to when a row of the batch was deleted before.
const eraseSavepoint = "erase_rows"

// byTopicSeq names a month table's (topic, seqid) key in an erase batch's
// statements: left to choose, the optimizer weighs each of the four keys
// that begin with the topic, range by range over the batch's thousands of
// seqs, and on a month of a few tens of thousands of rows picked a scan of
// the whole table; named, the statement costs what a raw UPDATE of the same
// rows does (docs/performance.md, "Retention").
const byTopicSeq = " FORCE INDEX (uk_topic_seq)"

// tombstoneRows makes the rows refs (sorted) of month table t that are not
// deleted yet tombstones (up, without its table and condition) and answers
// them, in refs order. The usual batch (none of refs deleted before) is one
// UPDATE that skips deleted rows and reads nothing first: when it changed
// every row of refs, they are the answer. When it changed none, nothing is
// left to erase (a batch redone after a resume). Otherwise (a message
// deleted before, or no longer stored) it is rolled back to a savepoint and
// the rows are read locked first for their status, so the answer, and the
// batch's change, name exactly the rows the erase made tombstones.
func tombstoneRows(ctx context.Context, tx *sql.Tx, t routing.Table, refs []routing.MessageRef, up sq.UpdateBuilder) ([]routing.MessageRef, error) {
	fail := func(err error) ([]routing.MessageRef, error) {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	tombstone := func(refs []routing.MessageRef) (int64, error) {
		return routing.RowsOf(up.Table(t.Quoted() + byTopicSeq).Where(routing.RefsCond(refs, "topic", "seqid")).
			Where(sq.NotEq{"status": message.StatusDeleted}).RunWith(tx).ExecContext(ctx))
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+eraseSavepoint); err != nil {
		return fail(err)
	}
	n, err := tombstone(refs)
	switch {
	case err != nil:
		return fail(err)
	case n == int64(len(refs)):
		return refs, nil
	case n == 0:
		return nil, nil
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+eraseSavepoint); err != nil {
		return fail(err)
	}
	live, err := lockErasable(ctx, tx, t, refs)
	if err != nil || len(live) == 0 {
		return nil, err
	}
	if _, err := tombstone(live); err != nil {
		return fail(err)
	}
	return live, nil
}

// tombstoneArchived makes the messages refs (sorted) of archived month m
// tombstones in its overlay in the usual batch, where the overlay holds no
// row of any of them yet: the archive's rows are taken from scan while it
// is current, else read once (each row group once; archivedRows), and
// those not deleted in it are inserted as tombstones by
// the delete's rule (status deleted, content and head NULL, version + 1,
// updated_at and deleted_at at) in one INSERT — what the seed, the locked
// read and the UPDATE of a change leave, in one statement. done is false,
// with nothing written, when the overlay held a row of one of them (the
// INSERT's duplicate key, rolled back to a savepoint): the caller then
// seeds, locks and changes them as any change does, so a message changed
// since its archive is erased from its overlay row.
func (s *Service) tombstoneArchived(ctx context.Context, tx *sql.Tx, tenant string, m routing.Month, refs []routing.MessageRef,
	scan *routing.ArchiveScan, at time.Time) (live []routing.MessageRef, done bool, err error) {
	fail := func(err error) ([]routing.MessageRef, bool, error) {
		return nil, false, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	rows, err := s.archivedRows(ctx, tx, tenant, m, refs, scan)
	if err != nil {
		return nil, false, err
	}
	var tomb []routing.OverlayRow
	for _, r := range rows {
		if r.Status != message.StatusDeleted {
			tomb = append(tomb, routing.OverlayRow{Topic: r.Topic, Seq: r.Seq, Month: m, MessageID: r.MessageID,
				Status: message.StatusDeleted, Version: r.Version + 1, UpdatedAt: at})
			live = append(live, routing.MessageRef{Topic: r.Topic, Seq: r.Seq})
		}
	}
	if len(tomb) == 0 {
		return nil, false, nil
	}
	// before the rows commit: a reader that finds the month unmarked has
	// no overlay row of it to miss
	if err := s.r.MarkOverlay(ctx, tenant, []routing.Month{m}); err != nil {
		return nil, false, httpapi.Wrap(httpapi.CodeUnavailable, "cache unavailable", err)
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+eraseSavepoint); err != nil {
		return fail(err)
	}
	err = routing.InsertOverlay(ctx, tx, tomb, at)
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return live, true, nil
	case !errors.As(err, &me) || me.Number != erDupEntry:
		return fail(err)
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+eraseSavepoint); err != nil {
		return fail(err)
	}
	return nil, false, nil
}

// archivedRows are the rows of refs (sorted) in archived month m as its
// archive holds them, in refs' order: scan's, when the month is still
// archived at scan's epoch (checked under the catalog row's shared lock
// the transaction holds, so the archive cannot change before the batch
// commits), else read from the archive.
func (s *Service) archivedRows(ctx context.Context, tx *sql.Tx, tenant string, m routing.Month, refs []routing.MessageRef,
	scan *routing.ArchiveScan) ([]routing.ArchivedRow, error) {
	if scan != nil && scan.Month == m {
		current, err := scan.Current(ctx, tx)
		if err != nil {
			return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
		}
		if current {
			return scan.At(refs), nil
		}
	}
	rs, err := s.r.ArchiveRows(ctx, tenant, m, refs)
	if err != nil {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "archive unavailable", err)
	}
	out := make([]routing.ArchivedRow, len(rs))
	for i, r := range rs {
		out[i] = routing.ArchivedRow{Topic: r.Topic, Seq: r.Seq, MessageID: r.MessageID, Status: r.Status, Version: r.Version}
	}
	return out, nil
}

// erDupEntry is MySQL's duplicate key error (ER_DUP_ENTRY).
const erDupEntry = 1062

// lockErasable locks the rows refs (sorted) of month table t and answers
// those not deleted yet, in refs order. It reads only that: the refs and
// the status, not the content an erase throws away.
func lockErasable(ctx context.Context, tx *sql.Tx, t routing.Table, refs []routing.MessageRef) ([]routing.MessageRef, error) {
	query, args, err := sq.Select("m.topic", "m.seqid").From(t.Quoted()+" AS m"+byTopicSeq).
		Where(routing.RefsCond(refs, "m.topic", "m.seqid")).Where(sq.NotEq{"m.status": message.StatusDeleted}).
		OrderBy("m.topic", "m.seqid").Suffix("FOR UPDATE").ToSql()
	if err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	defer rows.Close()
	var live []routing.MessageRef
	for rows.Next() {
		var r routing.MessageRef
		if err := rows.Scan(&r.Topic, &r.Seq); err != nil {
			return nil, fmt.Errorf("changes: erase: %w", err)
		}
		live = append(live, r)
	}
	if err := rows.Err(); err != nil {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	return live, nil
}

// afterErase publishes each topic's change frame of an erase batch (action
// erase, its seqs), all in one round trip. Best effort, as afterChange:
// the caches were told before the commit (the erased messages are out of
// the hot cache, which reads them again from MySQL), and a consumer that
// missed a frame resumes from the revisions by change_seq.
func (s *Service) afterErase(ctx context.Context, keys routing.Keys, e erased) {
	ctx, cancel := context.WithTimeout(ctx, afterChangeTimeout)
	defer cancel()
	s.markOverlaidAgain(ctx, keys, e.overlaid)
	rdb := s.p.Redis
	pubs := make(rueidis.Commands, len(e.topics))
	for i, et := range e.topics {
		ev := message.ChangeFrame(message.Change{Topic: et.topic, Seq: et.seqs[0], Action: message.ActionErase,
			ChangeSeq: et.changeSeq, At: e.at, Seqs: et.seqs})
		pubs[i] = rdb.B().Spublish().Channel(keys.Realtime(et.topic)).Message(string(ev)).Build()
	}
	for i, r := range rdb.DoMulti(ctx, pubs...) {
		if err := r.Error(); err != nil {
			s.m.changeFollowups.WithLabelValues(stepPublish).Inc()
			s.p.Log.Warn().Err(err).Str("topic", e.topics[i].topic).Int64("change_seq", e.topics[i].changeSeq).
				Msg("erase event not published; consumers resume from the revisions")
		}
	}
}
