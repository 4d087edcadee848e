package routing

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
)

// A topic's retention floor is the first seq not past retention: history
// begins there. Its record is im_topic_floors
// (sql/migrations/0014_retention.sql); readers check a copy of it in Redis
// (Keys.Floor), read in the same round trip as the rest of a page, so a
// page costs no MySQL read for it. Two rules keep the copy from ever
// serving a removed message:
//
//   - the record first: the retention raises the record, then the copy,
//     and removes a row only after both answered (an error from either
//     removes nothing, and the run retries);
//   - the copy never goes down: the retention's raise and a reader putting
//     back a record it read after a miss both run lua/floor_raise.lua, so a
//     put-back of a record read before a raise cannot undo the raise.
//
// A missing copy (expired, evicted, Redis restarted) is read from the
// record and put back: it is only ever as low as the record was when read.
const floorsTable = "im_topic_floors"

// FloorTTL keeps a floor's copy this long after it was written: a quiet
// topic's copy goes, the record stays.
const FloorTTL = 24 * time.Hour

// Floor is one topic's retention floor.
type Floor struct {
	Topic string
	Seq   int64 // the first seq not past retention
}

// floorBatch bounds the topics of one floor statement and of one
// pipeline of copies.
const floorBatch = 500

// Floors raises and reads retention floors: the record in the tenant's
// database and its copy in Redis.
type Floors struct {
	Redis   rueidis.Client
	Scripts *Scripts
}

// Raise moves each topic's floor up to its Seq (never down): the record
// in statements of at most floorBatch topics, then the copies in one
// pipeline per batch. Rows below a floor may be removed only after Raise
// returned nil.
func (f Floors) Raise(ctx context.Context, db TxBeginner, keys Keys, floors []Floor) error {
	for len(floors) > 0 {
		part := floors[:min(len(floors), floorBatch)]
		floors = floors[len(part):]
		q := sq.Insert(floorsTable).Columns("topic", "floor_seq")
		for _, fl := range part {
			q = q.Values(fl.Topic, fl.Seq)
		}
		if err := Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := q.Suffix("ON DUPLICATE KEY UPDATE floor_seq = GREATEST(floor_seq, VALUES(floor_seq))").
				RunWith(tx).ExecContext(ctx)
			return err
		}); err != nil {
			return fmt.Errorf("floors: raise: %w", err)
		}
		cmds := make(rueidis.Commands, len(part))
		for i, fl := range part {
			cmds[i] = f.Cmd(keys, fl.Topic, fl.Seq)
		}
		for i, res := range f.Redis.DoMulti(ctx, cmds...) {
			fl := part[i]
			if err := f.result(ctx, res, keys, fl.Topic, fl.Seq).Error(); err != nil {
				return fmt.Errorf("floors: copy %s: %w", fl.Topic, err)
			}
		}
	}
	return nil
}

// Cmd raises topic's copy to seq (never down), for a pipeline.
func (f Floors) Cmd(keys Keys, topic string, seq int64) rueidis.Completed {
	k, a := floorArgs(keys, topic, seq)
	return f.Scripts.FloorRaise.Cmd(f.Redis, k, a)
}

func (f Floors) result(ctx context.Context, res rueidis.RedisResult, keys Keys, topic string, seq int64) rueidis.RedisResult {
	k, a := floorArgs(keys, topic, seq)
	return f.Scripts.FloorRaise.Result(ctx, f.Redis, res, k, a)
}

func floorArgs(keys Keys, topic string, seq int64) ([]string, []string) {
	return []string{keys.Floor(topic)}, []string{strconv.FormatInt(seq, 10), strconv.Itoa(int(FloorTTL / time.Second))}
}

// CopyCmd reads topic's copy, for a pipeline; Resolve reads its answer.
func (f Floors) CopyCmd(keys Keys, topic string) rueidis.Completed {
	return f.Redis.B().Get().Key(keys.Floor(topic)).Build()
}

// Resolve is topic's floor from CopyCmd's answer; on a miss (or a Redis
// error) from the record, which it puts back as the copy (best effort: the
// next read tries again).
func (f Floors) Resolve(ctx context.Context, db sq.BaseRunner, keys Keys, topic string, res rueidis.RedisResult) (int64, error) {
	if v, err := res.AsInt64(); err == nil {
		return v, nil
	}
	fl, err := LoadFloor(ctx, db, topic)
	if err != nil {
		return 0, err
	}
	_ = f.result(ctx, f.Redis.Do(ctx, f.Cmd(keys, topic, fl)), keys, topic, fl).Error()
	return fl, nil
}

// Load is topic's floor: its copy, else the record.
func (f Floors) Load(ctx context.Context, db sq.BaseRunner, keys Keys, topic string) (int64, error) {
	return f.Resolve(ctx, db, keys, topic, f.Redis.Do(ctx, f.CopyCmd(keys, topic)))
}

// LoadFloor reads the topic's floor record (0: nothing of it expired).
func LoadFloor(ctx context.Context, db sq.BaseRunner, topic string) (int64, error) {
	var f int64
	err := sq.Select("COALESCE(MAX(floor_seq), 0)").From(floorsTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&f)
	if err != nil {
		return 0, fmt.Errorf("floors: load %s: %w", topic, err)
	}
	return f, nil
}
