package routing

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
)

// Tables the completeness proof reads besides the catalog, the mirror and
// the month table. persist writes both (modules/persist); the proof only
// counts their rows of one month.
const (
	compensationTable = "im_group_message_compensation"
	deadLetterTable   = "im_group_message_dead_letters"
)

// Reasons a month is not proven complete (CompletenessProof.Waiting).
const (
	WaitConsumer     = "consumer"     // persist has not yet handled every event produced before the month could take its last one
	WaitDeadLetter   = "dead_letter"  // an event of the month sits in the dead-letter topic
	WaitCompensation = "compensation" // an event queued for the month while it was sealed is not replayed
	WaitRouteRepair  = "route_repair" // a committed batch of the month still has Redis follow-ups to redo
	WaitRouteCheck   = "route_check"  // the route mirror disagrees with the month table
	WaitStillActive  = "still_active" // the month has not stopped being active
	WaitUnknown      = "check_failed" // the proof itself could not be read
	reasonListLimit  = 3              // topics named in one route-check reason
)

// WaitReasons are every Wait* value, for exporting metrics at 0.
var WaitReasons = []string{WaitConsumer, WaitDeadLetter, WaitCompensation, WaitRouteRepair, WaitRouteCheck, WaitStillActive, WaitUnknown}

// CompletenessProof says whether every event of a month is in its table.
type CompletenessProof struct {
	Month   Month
	Reason  string // the first Wait* that holds ("" when complete)
	Detail  string // what the operator reads in `shard list`
	Checked time.Time
}

// Complete reports whether the proof holds.
func (p CompletenessProof) Complete() bool { return p.Reason == "" }

// ProveComplete checks that no event of month s can still arrive for its
// table, in this order (cheapest first; the first that fails is the
// answer):
//
//  1. the month stopped being active at deactivated_at, so every event of
//     it was allocated before then; one not acknowledged by Kafka within
//     produceTimeout of its allocation is abandoned as a gap — hence
//     nothing pending or in flight remains once persist reports (Redis
//     persisted_before) every record produced before deactivated_at +
//     produceTimeout stored, compensated or dead-lettered;
//  2. no event of the month is dead-lettered without being stored since
//     (a replayed dead letter that was stored resolves its row here);
//  3. no compensation entry of the month waits for a replay;
//  4. no route repair of the month waits (its Redis follow-ups);
//  5. the route mirror's per-topic seq range and count for the month
//     equal the month table's — the last and only full read of the table.
func ProveComplete(ctx context.Context, db *sql.DB, rdb rueidis.Client, keys Keys, s Shard, produceTimeout time.Duration) (CompletenessProof, error) {
	p := CompletenessProof{Month: s.Month, Checked: time.Now()}
	wait := func(reason, format string, args ...any) (CompletenessProof, error) {
		p.Reason, p.Detail = reason, fmt.Sprintf(format, args...)
		return p, nil
	}
	if !s.DeactivatedAt.Valid {
		return wait(WaitStillActive, "month %s has not stopped being active", s.Month)
	}
	need := s.DeactivatedAt.Time.Add(produceTimeout)
	ms, err := rdb.Do(ctx, rdb.B().Get().Key(keys.PersistedBefore()).Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		return p, fmt.Errorf("completeness %s: persisted_before: %w", s.Month, err)
	}
	if got := time.UnixMilli(ms); err != nil || got.Before(need) {
		return wait(WaitConsumer, "persist has handled events up to %s; needs %s", fmtMillis(ms), need.UTC().Format(time.RFC3339))
	}

	n, err := resolveDeadLetters(ctx, db, s.Table)
	if err != nil {
		return p, err
	}
	if n > 0 {
		return wait(WaitDeadLetter, "%d dead-lettered events of the month not stored (imshard dlq list)", n)
	}
	if n, err = countRows(ctx, db, compensationTable, sq.Eq{"shard_month": s.Month.String(), "status": "pending"}); err != nil {
		return p, err
	}
	if n > 0 {
		return wait(WaitCompensation, "%d compensation entries of the month wait for a replay (imshard dlq replay --month)", n)
	}
	if n, err = countRows(ctx, db, repairTable, sq.Eq{"shard_month": s.Month.String()}); err != nil {
		return p, err
	}
	if n > 0 {
		return wait(WaitRouteRepair, "%d route repairs of the month wait", n)
	}
	diffs, err := monthRouteDiffs(ctx, db, s.Table)
	if err != nil {
		return p, err
	}
	if len(diffs) > 0 {
		shown := diffs[:min(len(diffs), reasonListLimit)]
		return wait(WaitRouteCheck, "route mirror differs from the table for %d topics (%s); run imshard route check --fix", len(diffs), strings.Join(shown, ", "))
	}
	return p, nil
}

// AwaitComplete waits until month m of the tenant is proven complete
// while persist's progress is all the proof still waits for (the month
// stopped being active, and persist's published progress has not passed
// its deactivation plus produceTimeout yet): that progress only moves
// forward, so the wait ends once persist runs and has caught up. Any other
// reason is answered at once as an error, as is ctx's end.
func AwaitComplete(ctx context.Context, db *sql.DB, rdb rueidis.Client, keys Keys, m Month, produceTimeout, poll time.Duration) error {
	for {
		shards, err := ListShards(ctx, db)
		if err != nil {
			return err
		}
		s := Shard{Month: m}
		for _, x := range shards {
			if x.Month == m {
				s = x
			}
		}
		p, err := ProveComplete(ctx, db, rdb, keys, s, produceTimeout)
		switch {
		case err != nil:
			return err
		case p.Complete():
			return nil
		case p.Reason != WaitConsumer:
			return fmt.Errorf("completeness %s: %s: %s", m, p.Reason, p.Detail)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("completeness %s: %s: %w", m, p.Detail, ctx.Err())
		case <-time.After(poll):
		}
	}
}

func fmtMillis(ms int64) string {
	if ms <= 0 {
		return "never"
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

func countRows(ctx context.Context, db sq.BaseRunner, table string, where sq.Sqlizer) (int64, error) {
	var n int64
	if err := sq.Select("COUNT(*)").From(table).Where(where).RunWith(db).QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, fmt.Errorf("completeness: count %s: %w", table, err)
	}
	return n, nil
}

// resolveDeadLetters marks resolved the month's pending dead letters whose
// event is stored by now (replayed) and counts those still missing.
func resolveDeadLetters(ctx context.Context, db *sql.DB, t Table) (int64, error) {
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Update(deadLetterTable+" d").Set("d.status", "resolved").
			Where(sq.Eq{"d.shard_month": t.Month().String(), "d.status": "pending"}).
			Where(sq.Expr("EXISTS (SELECT 1 FROM " + t.Quoted() + " m WHERE m.topic = d.topic AND m.seqid = d.seqid)")).
			RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return 0, fmt.Errorf("completeness: resolve dead letters of %s: %w", t.Name(), err)
	}
	return countRows(ctx, db, deadLetterTable, sq.Eq{"shard_month": t.Month().String(), "status": "pending"})
}

// monthRouteDiffs is the route check of one month: the topics whose mirror
// row (seq range, count) differs from what the month table holds.
func monthRouteDiffs(ctx context.Context, db sq.BaseRunner, t Table) ([]string, error) {
	type rng struct{ min, max, n int64 }
	read := func(q sq.SelectBuilder) (map[string]rng, error) {
		rows, err := q.RunWith(db).QueryContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("completeness: route check %s: %w", t.Name(), err)
		}
		defer rows.Close()
		out := map[string]rng{}
		for rows.Next() {
			var topic string
			var r rng
			if err := rows.Scan(&topic, &r.min, &r.max, &r.n); err != nil {
				return nil, err
			}
			out[topic] = r
		}
		return out, rows.Err()
	}
	actual, err := read(sq.Select("topic", "MIN(seqid)", "MAX(seqid)", "COUNT(*)").From(t.Quoted()).GroupBy("topic"))
	if err != nil {
		return nil, err
	}
	mirror, err := read(sq.Select("topic", "min_seq", "max_seq", "message_count").From(mirrorTable).
		Where(sq.Eq{"shard_month": t.Month().String()}))
	if err != nil {
		return nil, err
	}
	var diffs []string
	for topic, a := range actual {
		if mirror[topic] != a {
			diffs = append(diffs, topic)
		}
	}
	for topic := range mirror {
		if _, ok := actual[topic]; !ok {
			diffs = append(diffs, topic)
		}
	}
	return diffs, nil
}

// DeadLetterRow is one dead-lettered event of a served tenant.
type DeadLetterRow struct {
	Topic  string
	Seq    int64
	Month  Month
	Reason string
}

// RecordDeadLetters notes events that went to the dead-letter topic
// (persist, after the broker took them); a redelivered one is noted once
// and is pending again.
func RecordDeadLetters(ctx context.Context, db TxBeginner, rows []DeadLetterRow) error {
	if len(rows) == 0 {
		return nil
	}
	q := sq.Insert(deadLetterTable).Columns("topic", "seqid", "shard_month", "reason")
	for _, r := range rows {
		q = q.Values(r.Topic, r.Seq, r.Month.String(), r.Reason)
	}
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := q.Suffix("ON DUPLICATE KEY UPDATE status = 'pending', reason = VALUES(reason), shard_month = VALUES(shard_month)").
			RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("dead letters: record: %w", err)
	}
	return nil
}
