package routing

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Clock is Redis TIME: months come from the one clock every node shares,
// never from a node's own (invariant 3, docs/invariants.md).
type Clock struct {
	rdb rueidis.Client
}

// NewClock reads time from rdb.
func NewClock(rdb rueidis.Client) Clock { return Clock{rdb: rdb} }

// Now is the Redis server's time.
func (c Clock) Now(ctx context.Context) (time.Time, error) {
	return timeOf(c.rdb.Do(ctx, c.rdb.B().Time().Build()))
}

// timeOf reads the answer of a TIME command.
func timeOf(res rueidis.RedisResult) (time.Time, error) {
	vals, err := res.AsStrSlice()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis TIME: %w", err)
	}
	if len(vals) != 2 {
		return time.Time{}, fmt.Errorf("redis TIME: %d fields", len(vals))
	}
	sec, err1 := strconv.ParseInt(vals[0], 10, 64)
	usec, err2 := strconv.ParseInt(vals[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("redis TIME: malformed %q", vals)
	}
	return time.Unix(sec, usec*1000).UTC(), nil
}

// Month is the UTC month of Redis TIME.
func (c Clock) Month(ctx context.Context) (Month, error) {
	now, err := c.Now(ctx)
	if err != nil {
		return Month{}, err
	}
	m := MonthOf(now)
	if m.IsZero() {
		return Month{}, fmt.Errorf("redis TIME %s is outside the supported years", now.Format(time.RFC3339))
	}
	return m, nil
}
