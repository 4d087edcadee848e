package routing

import (
	"context"
	"database/sql"
	"fmt"

	sq "github.com/Masterminds/squirrel"
)

// floorsTable holds each topic's retention floor: every seq below it is
// past retention (sql/migrations/0014_retention.sql). Only the retention
// run raises it, and always before it removes the rows below it.
const floorsTable = "im_topic_floors"

// Floor is one topic's retention floor.
type Floor struct {
	Topic string
	Seq   int64 // the first seq not past retention
}

// floorBatch bounds the topics of one floor statement.
const floorBatch = 500

// RaiseFloors moves each topic's floor up to its Seq (never down), in
// statements of at most floorBatch topics.
func RaiseFloors(ctx context.Context, db TxBeginner, floors []Floor) error {
	for len(floors) > 0 {
		part := floors[:min(len(floors), floorBatch)]
		floors = floors[len(part):]
		q := sq.Insert(floorsTable).Columns("topic", "floor_seq")
		for _, f := range part {
			q = q.Values(f.Topic, f.Seq)
		}
		if err := Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := q.Suffix("ON DUPLICATE KEY UPDATE floor_seq = GREATEST(floor_seq, VALUES(floor_seq))").
				RunWith(tx).ExecContext(ctx)
			return err
		}); err != nil {
			return fmt.Errorf("floors: raise: %w", err)
		}
	}
	return nil
}

// LoadFloor reads the topic's floor (0: nothing of it expired).
func LoadFloor(ctx context.Context, db sq.BaseRunner, topic string) (int64, error) {
	var f int64
	err := sq.Select("COALESCE(MAX(floor_seq), 0)").From(floorsTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&f)
	if err != nil {
		return 0, fmt.Errorf("floors: load %s: %w", topic, err)
	}
	return f, nil
}
