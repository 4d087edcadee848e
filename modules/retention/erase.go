package retention

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"

	sq "github.com/Masterminds/squirrel"
	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
)

// Eraser deletes messages of month m for everyone, by the system, through
// the changes module's delete-for-everyone path as one batch (app wires
// it): in one transaction the rows become tombstones, revisions without
// content and change events are recorded and the messages' earlier
// revisions lose their content; caches and streams follow. before runs in
// that transaction (tx) after its writes, with what they changed
// (messages, revisions without content), and its error rolls the batch
// back. A message already a tombstone is left out. scan, for an archived
// month, is the read of its archive that found refs: the tombstones are
// made from its rows while the archive is still the one it read.
type Eraser func(ctx context.Context, tenant string, m routing.Month, refs []routing.MessageRef, scan *routing.ArchiveScan, reason string,
	before func(tx *sql.Tx, messages, revisions int64) error) (messages, revisions int64, err error)

// userHeld refuses an erase of a held user (409 conflict, details.reason
// "legal_hold").
func userHeld(ctx context.Context, db *sql.DB, user int64) error {
	why, _, err := eraseHolds(ctx, db, user, nil)
	if err != nil {
		return err
	}
	if why != "" {
		return heldConflict("user", why)
	}
	return nil
}

// heldConflict is the refusal of a job on what a legal hold keeps: 409
// conflict, details.reason "legal_hold", the hold's reason in the message.
func heldConflict(what, why string) error {
	return httpapi.Errorf(httpapi.CodeConflict, what+" is under legal hold: "+why).
		WithDetails(map[string]any{"reason": "legal_hold"})
}

// StartErase queues the erase of everything user sent in the tenant; the
// shard managers' job loop runs it. Refused while a hold names the user.
func (r *Retention) StartErase(ctx context.Context, tenant string, user int64) (Job, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Job{}, err
	}
	if err := userHeld(ctx, db, user); err != nil {
		return Job{}, err
	}
	return r.queue(ctx, tenant, db, KindErase, strconv.FormatInt(int64(user), 10))
}

// erase makes every message the user sent, in every month, a tombstone
// through the delete-for-everyone path, its revisions' content cleared,
// then removes the user's read cursors, preferences and hidden ranges.
// Messages in a held topic are left and the topic named in the report.
// Walks each month table by its sender index (from_user, topic, seqid), an
// archived month by a scan of its archive (the tombstones go to the
// month's overlay, never into the archive), and erases each batch in one
// transaction (eraseBatch), so a run taken over redoes at most the batch
// under way; a tombstone is left as it is. A batch shorter than
// eraseBatchSize is the month's last: its walk is not read again. Months
// go oldest first, one after the other: a topic's erase changes follow its
// seqs.
func (p *jobRun) erase(ctx context.Context) error {
	user, db := int64(p.job.UserID), p.db
	if err := p.unheld(ctx); err != nil {
		return err
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return err
	}
	rep := &p.job.Report
	rep.PendingArchive = rep.PendingArchive[:0]
	for _, s := range shards {
		next, scan, err := p.sentIn(ctx, s, user)
		if err != nil {
			return err
		}
		last := routing.MessageRef{}
		for {
			refs, err := next(last)
			if err != nil || len(refs) == 0 {
				if err != nil {
					return err
				}
				break
			}
			if err := p.eraseBatch(ctx, s.Month, refs, scan); err != nil {
				return err
			}
			last = refs[len(refs)-1]
			testhook.CrashAfterJobBatch()
			if len(refs) < eraseBatchSize {
				break
			}
		}
	}
	return p.eraseSide(ctx)
}

// eraseSide removes the user's hidden ranges and read cursors, up to a
// batch of each per transaction, with the job's progress in it (a hold on
// the user placed meanwhile rolls it back and fails the job); the
// transaction that finds fewer than a batch of both left records the job
// done.
func (p *jobRun) eraseSide(ctx context.Context) error {
	user, side := int64(p.job.UserID), p.job.Report.Side
	for {
		var hidden, cursors int64
		done := false
		err := routing.Fenced(ctx, p.db, func(tx *sql.Tx) error {
			var err error
			if hidden, err = readpath.DropUserHidden(ctx, tx, user, batch); err != nil {
				return err
			}
			if cursors, err = acl.DropUserCursors(ctx, tx, user, batch); err != nil {
				return err
			}
			if err := userHeld(ctx, p.db, user); err != nil {
				return err
			}
			side["hidden_ranges"] += hidden
			side["read_cursors"] += cursors
			done = hidden < batch && cursors < batch
			state := p.job.State
			if done {
				state = StateDone
			}
			if err := p.recordIn(ctx, tx, state); err != nil {
				side["hidden_ranges"] -= hidden
				side["read_cursors"] -= cursors
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
		if done {
			p.r.p.Log.Info().Str("tenant", p.tenant).Int64("user", user).Int64("messages", p.job.RowsRemoved).Msg("user erased")
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// sentIn answers the batches of what user sent in month s, each the next
// after last: from the archive of an archived month (read once; with the
// scan, which the batches make their tombstones from), or from the month
// table's sender index (also when the month was restored before its scan
// began).
func (p *jobRun) sentIn(ctx context.Context, s routing.Shard, user int64) (func(last routing.MessageRef) ([]routing.MessageRef, error), *routing.ArchiveScan, error) {
	var scan *routing.ArchiveScan
	if s.Status == routing.StatusArchived {
		var err error
		// nil, with nothing read, when the month is no longer archived
		scan, err = routing.ScanArchived(ctx, p.db, s.Month, func() ([]routing.ArchivedRow, error) {
			return p.r.p.ArchivedSentBy(ctx, p.tenant, s.Month, user)
		})
		if err != nil {
			return nil, nil, fmt.Errorf("erase: messages of %d in the archive of %s: %w", user, s.Month, err)
		}
	}
	if scan != nil {
		all := scan.Rows
		return func(last routing.MessageRef) ([]routing.MessageRef, error) {
			from, _ := slices.BinarySearchFunc(all, last, func(r routing.ArchivedRow, l routing.MessageRef) int {
				return cmp.Or(cmp.Compare(r.Topic, l.Topic), cmp.Compare(r.Seq, l.Seq+1))
			})
			refs := make([]routing.MessageRef, 0, min(len(all)-from, eraseBatchSize))
			for _, r := range all[from:min(len(all), from+eraseBatchSize)] {
				refs = append(refs, routing.MessageRef{Topic: r.Topic, Seq: r.Seq})
			}
			return refs, nil
		}, scan, nil
	}
	t, err := routing.TableFor(s.Month)
	if err != nil {
		return nil, nil, err
	}
	return func(last routing.MessageRef) ([]routing.MessageRef, error) {
		refs, err := sentBy(ctx, p.db, t, user, last)
		if !noSuchKey(err) {
			return refs, err
		}
		// a month table made before the template had the sender index
		if err := ensureSenderIndex(ctx, p.db, t); err != nil {
			return nil, err
		}
		return sentBy(ctx, p.db, t, user, last)
	}, nil, nil
}

// noSuchKey reports whether err is the server's refusal of an index hint
// naming a key the table lacks (ER_KEY_DOES_NOT_EXITS, 1176).
func noSuchKey(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1176
}

// eraseBatchSize is how many of the user's messages one erase batch
// changes, in one transaction: five times the other jobs' batch, since a
// batch's fixed cost (its holds read again, its progress, one change_seq,
// revision and event per topic, two Redis round trips, the commit) came
// to about half of a batch of 1,000 (docs/performance.md, "Retention").
// Its locks delay no send: they are the user's rows (read and updated by
// key, no range), the change_seq rows of the batch's topics (a recall,
// edit or delete there waits for the batch) and the job's row; a send's
// persist inserts new rows and takes none of them.
const eraseBatchSize = 5 * batch

// errHeldMeanwhile: a topic of the batch came under a hold after the batch
// read the holds; the batch rolls back and runs again without it.
var errHeldMeanwhile = errors.New("erase: a topic of the batch was held meanwhile")

// eraseBatch erases one batch of the user's messages in month m (refs,
// sorted) in one transaction, those of held topics left out and the
// topics reported. Before the batch commits the holds are read again (a
// hold on the user rolls it back and fails the job; one on a topic rolls
// it back and runs it again without the topic) and the job's progress is
// recorded with the batch counted. scan is an archived month's (sentIn).
func (p *jobRun) eraseBatch(ctx context.Context, m routing.Month, refs []routing.MessageRef, scan *routing.ArchiveScan) error {
	rep, db := &p.job.Report, p.db
	month := m.String()
	topics := []string{}
	for _, r := range refs { // sorted: a topic's refs are together
		if len(topics) == 0 || topics[len(topics)-1] != r.Topic {
			topics = append(topics, r.Topic)
		}
	}
	reason := "user erase (job " + strconv.FormatInt(int64(p.job.ID), 10) + ")"
	baseMonth, baseRevs, baseRows := rep.Months[month], rep.Side["revisions"], p.job.RowsRemoved
	count := func(n, revs int64) {
		rep.Months[month], rep.Side["revisions"], p.job.RowsRemoved = baseMonth+n, baseRevs+revs, baseRows+n
	}
	user := int64(p.job.UserID)
	for {
		why, held, err := eraseHolds(ctx, db, user, topics)
		if err != nil {
			return err
		}
		if why != "" {
			return fmt.Errorf("erase: %s: %w", month, heldConflict("user", why))
		}
		free := make([]routing.MessageRef, 0, len(refs))
		for _, r := range refs {
			if _, ok := held[r.Topic]; !ok {
				free = append(free, r)
			}
		}
		for _, t := range topics {
			if _, ok := held[t]; ok && !slices.Contains(rep.HeldTopics, t) {
				rep.HeldTopics = append(rep.HeldTopics, t)
			}
		}
		committing := false
		n, _, err := p.r.p.Erase(ctx, p.tenant, m, free, scan, reason, func(tx *sql.Tx, n, revs int64) error {
			committing = true
			// the holds read again, the user's and the batch's topics' in
			// one statement
			why, now, err := eraseHolds(ctx, db, user, topics)
			switch {
			case err != nil:
				return err
			case why != "":
				return heldConflict("user", why)
			case !sameKeys(now, held):
				return errHeldMeanwhile
			}
			count(n, revs)
			return p.recordIn(ctx, tx, p.job.State)
		})
		if errors.Is(err, errHeldMeanwhile) {
			count(0, 0)
			continue
		}
		if err != nil {
			count(0, 0)
			return fmt.Errorf("erase: %s: %w", month, err)
		}
		p.r.m.jobRows.WithLabelValues(p.tenant, KindErase).Add(float64(n))
		if !committing {
			// nothing left to change in the batch: the holds and the lease
			// are checked all the same
			count(0, 0)
			return routing.Fenced(ctx, db, func(tx *sql.Tx) error { return p.progress(ctx, tx) })
		}
		return nil
	}
}

// sameKeys reports whether a and b hold the same keys.
func sameKeys(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// senderIndex is the month tables' (from_user, topic, seqid) index: an
// erase's batch is one range of it, never a scan of the month.
const senderIndex = "idx_from_topic_seq"

// ensureSenderIndex gives t the sender index when it lacks it (a month
// table made before the template had it): one online ALTER per table,
// sends and persist going on meanwhile; every later erase finds it.
func ensureSenderIndex(ctx context.Context, db *sql.DB, t routing.Table) error {
	var n int
	if err := sq.Select("COUNT(*)").From("information_schema.STATISTICS").Where("TABLE_SCHEMA = DATABASE()").
		Where(sq.Eq{"TABLE_NAME": t.Name(), "INDEX_NAME": senderIndex}).RunWith(db).QueryRowContext(ctx).Scan(&n); err != nil {
		return fmt.Errorf("erase: indexes of %s: %w", t.Name(), err)
	}
	if n > 0 {
		return nil
	}
	if err := routing.FencedDDL(ctx, db, t.SenderIndexDDL()); err != nil {
		return fmt.Errorf("erase: sender index of %s: %w", t.Name(), err)
	}
	return nil
}

// sentBy is the next batch of user's messages in table t after last, in
// (topic, seqid) order: one range of the sender index.
func sentBy(ctx context.Context, db *sql.DB, t routing.Table, user int64, last routing.MessageRef) ([]routing.MessageRef, error) {
	rows, err := sq.Select("topic", "seqid").From(t.Quoted()+" FORCE INDEX ("+senderIndex+")").Where(sq.Eq{"from_user": user}).
		Where(sq.Or{sq.Gt{"topic": last.Topic}, sq.And{sq.Eq{"topic": last.Topic}, sq.Gt{"seqid": last.Seq}}}).
		OrderBy("topic", "seqid").Limit(eraseBatchSize).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("erase: messages of %d in %s: %w", user, t.Name(), err)
	}
	defer rows.Close()
	var out []routing.MessageRef
	for rows.Next() {
		var m routing.MessageRef
		if err := rows.Scan(&m.Topic, &m.Seq); err != nil {
			return nil, fmt.Errorf("erase: messages of %d in %s: %w", user, t.Name(), err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
