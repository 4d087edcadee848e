package readpath

import (
	"context"
	"database/sql"
	"fmt"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
)

// DropMonthRevisions deletes up to limit revisions of month (YYYYMM) and
// reports how many went: retention calls it until it reports 0.
func DropMonthRevisions(ctx context.Context, tx *sql.Tx, month string, limit uint64) (int64, error) {
	return routing.RowsOf(sq.Delete(revisionsTable).Where(sq.Eq{"shard_month": month}).Limit(limit).RunWith(tx).ExecContext(ctx))
}

// DropRevisionsUpTo deletes up to limit revisions of topic's seqs up to
// last, reporting how many went.
func DropRevisionsUpTo(ctx context.Context, tx *sql.Tx, topic string, last int64, limit uint64) (int64, error) {
	return routing.RowsOf(sq.Delete(revisionsTable).Where(sq.Eq{"topic": topic}).Where(sq.LtOrEq{"seqid": last}).
		Limit(limit).RunWith(tx).ExecContext(ctx))
}

// DropHiddenBelow deletes up to limit hidden ranges of the floors'
// topics that end at or below their topic's floor (nothing they hide
// stays), many topics in one statement, reporting how many went.
func DropHiddenBelow(ctx context.Context, tx *sql.Tx, floors []routing.Floor, limit uint64) (int64, error) {
	if len(floors) == 0 {
		return 0, nil
	}
	gone := make(sq.Or, len(floors))
	for i, f := range floors {
		gone[i] = sq.And{sq.Eq{"topic": f.Topic}, sq.LtOrEq{"hi": f.Seq}}
	}
	return routing.RowsOf(sq.Delete(dellogTable).Where(gone).Limit(limit).RunWith(tx).ExecContext(ctx))
}

// CutHiddenAt starts every hidden range of the floors' topics that
// reaches below its topic's floor at the floor, in one statement: ranges
// stay disjoint, and none names an expired seq.
func CutHiddenAt(ctx context.Context, tx *sql.Tx, floors []routing.Floor) error {
	if len(floors) == 0 {
		return nil
	}
	low := sq.Case("topic")
	below := make(sq.Or, len(floors))
	for i, f := range floors {
		low = low.When(sq.Expr("?", f.Topic), sq.Expr("?", f.Seq))
		below[i] = sq.And{sq.Eq{"topic": f.Topic}, sq.Lt{"low": f.Seq}}
	}
	if _, err := sq.Update(dellogTable).Set("low", low).Where(below).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("readpath: hidden ranges below the floors of %d topics: %w", len(floors), err)
	}
	return nil
}

// EraseRevisionContent clears the content and head every revision of the
// messages refs (sorted, routing.SortRefs) kept (a user erase: the message
// is a tombstone, and its history keeps no copy of what it said), in one
// statement by a few ranges of the revisions' (topic, seqid) key
// (routing.RefsSpanCond), reporting how many revisions were cleared.
func EraseRevisionContent(ctx context.Context, tx *sql.Tx, refs []routing.MessageRef) (int64, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	// the key named, as the erase's UPDATE of the month rows does: the
	// optimizer's weighing of each key by the batch's thousands of seqs
	// cost more than the statement
	return routing.RowsOf(sq.Update(revisionsTable+" FORCE INDEX (idx_topic_seq)").Set("content", nil).Set("head", nil).
		Where(routing.RefsSpanCond(refs, "topic", "seqid")).Where("(content IS NOT NULL OR head IS NOT NULL)").RunWith(tx).ExecContext(ctx))
}

// DropUserHidden deletes up to limit of user's hidden ranges (in every
// topic), reporting how many went.
func DropUserHidden(ctx context.Context, tx *sql.Tx, user int64, limit uint64) (int64, error) {
	return routing.RowsOf(sq.Delete(dellogTable).Where(sq.Eq{"deletedfor": user}).Limit(limit).RunWith(tx).ExecContext(ctx))
}
