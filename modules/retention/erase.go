package retention

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Deleter deletes one message for everyone through the changes module's
// path (app wires it): the row becomes a tombstone, a revision and a change
// event are recorded, caches and streams follow. actor 0 is the system.
type Deleter func(ctx context.Context, tenant, topic string, seq, actor int64, reason string) error

// userHeld refuses an erase of a held user (409 conflict, details.reason
// "legal_hold").
func userHeld(ctx context.Context, db *sql.DB, user int64) error {
	users, err := heldUsers(ctx, db)
	if err != nil {
		return err
	}
	if why, ok := users[user]; ok {
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

// erase makes every message the user sent, in every month not archived, a
// tombstone through the delete-for-everyone path, clears the content its
// revisions kept, then removes the user's read cursors, preferences and
// hidden ranges. Messages in a held topic are left and the topic named in
// the report. Walks each month by its sender index (from_user, topic,
// seqid) in batches, so a run taken over redoes at most what was not
// recorded; a delete of a tombstone changes nothing.
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
	reason := "user erase (job " + strconv.FormatInt(int64(p.job.ID), 10) + ")"
	for _, s := range shards {
		if s.Status == routing.StatusArchived {
			rep.PendingArchive = append(rep.PendingArchive, s.Month.String())
			continue
		}
		t, err := routing.TableFor(s.Month)
		if err != nil {
			return err
		}
		if err := ensureSenderIndex(ctx, db, t); err != nil {
			return err
		}
		month := s.Month.String()
		lastTopic, lastSeq := "", int64(0)
		for {
			msgs, err := sentBy(ctx, db, t, user, lastTopic, lastSeq)
			if err != nil || len(msgs) == 0 {
				if err != nil {
					return err
				}
				break
			}
			topics := []string{}
			for _, m := range msgs {
				if !slices.Contains(topics, m.topic) {
					topics = append(topics, m.topic)
				}
			}
			// a hold placed since the last batch: on the user stops
			// the job, on a topic leaves its messages
			if err := p.unheld(ctx); err != nil {
				return err
			}
			held, err := heldTopics(ctx, db, topics)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				lastTopic, lastSeq = m.topic, m.seq
				if _, ok := held[m.topic]; ok {
					if !slices.Contains(rep.HeldTopics, m.topic) {
						rep.HeldTopics = append(rep.HeldTopics, m.topic)
					}
					continue
				}
				if err := p.r.p.Delete(ctx, p.tenant, m.topic, m.seq, 0, reason); err != nil {
					return fmt.Errorf("erase: %s/%d: %w", m.topic, m.seq, err)
				}
				n, err := routing.FencedValue(ctx, db, func(tx *sql.Tx) (int64, error) {
					return readpath.EraseRevisionContent(ctx, tx, m.topic, m.seq)
				})
				if err != nil {
					return fmt.Errorf("erase: revisions of %s/%d: %w", m.topic, m.seq, err)
				}
				rep.Months[month]++
				rep.Side["revisions"] += n
				p.job.RowsRemoved++
				p.r.m.jobRows.WithLabelValues(p.tenant, KindErase).Inc()
			}
			if err := p.progress(ctx); err != nil {
				return err
			}
		}
	}
	if err := p.side(ctx, "hidden_ranges", func(tx *sql.Tx) (int64, error) { return readpath.DropUserHidden(ctx, tx, user, batch) }); err != nil {
		return err
	}
	if err := p.side(ctx, "read_cursors", func(tx *sql.Tx) (int64, error) { return acl.DropUserCursors(ctx, tx, user, batch) }); err != nil {
		return err
	}
	p.r.p.Log.Info().Str("tenant", p.tenant).Int64("user", user).Int64("messages", p.job.RowsRemoved).Msg("user erased")
	return p.record(ctx, StateDone)
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

type sentMsg struct {
	topic string
	seq   int64
}

// sentBy is the next batch of user's messages in table t after (topic,
// seq), in (topic, seqid) order: one range of the sender index.
func sentBy(ctx context.Context, db *sql.DB, t routing.Table, user int64, topic string, seq int64) ([]sentMsg, error) {
	rows, err := sq.Select("topic", "seqid").From(t.Quoted()+" FORCE INDEX ("+senderIndex+")").Where(sq.Eq{"from_user": user}).
		Where(sq.Or{sq.Gt{"topic": topic}, sq.And{sq.Eq{"topic": topic}, sq.Gt{"seqid": seq}}}).
		OrderBy("topic", "seqid").Limit(batch).RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("erase: messages of %d in %s: %w", user, t.Name(), err)
	}
	defer rows.Close()
	var out []sentMsg
	for rows.Next() {
		var m sentMsg
		if err := rows.Scan(&m.topic, &m.seq); err != nil {
			return nil, fmt.Errorf("erase: messages of %d in %s: %w", user, t.Name(), err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
