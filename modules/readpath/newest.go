package readpath

import (
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// NewestRead is the plan of a newest-first read of one topic's hot cache,
// the kind the inbox pipelines for many topics at once (unread badges, the
// topic list's last message): the cached messages and recorded gaps below
// Below down to, not including, Floor (0: no floor), at most N of each.
type NewestRead struct {
	Topic string
	Below int64
	Floor int64
	N     int
}

// NewestCmdCount is how many commands NewestCmds gives for one read.
const NewestCmdCount = 4

// NewestCmds are the Redis commands of r, to be sent in one pipeline with
// others; ResolveNewest reads their NewestCmdCount results.
func (s *Reader) NewestCmds(keys routing.Keys, r NewestRead) []rueidis.Completed {
	return s.hotCmds(keys, r.Topic, Desc, r.Below, r.Floor, r.N)
}

// Newest is what a NewestRead found: the cache read and the topic's seq
// counter as Redis held them. Only its methods read it, so a caller cannot
// take a seq the read did not prove for a stored one.
type Newest struct {
	c       Cached
	counter int64
}

// ResolveNewest reads the results of r's NewestCmds.
func ResolveNewest(res []rueidis.RedisResult, r NewestRead) (Newest, error) {
	c, counter, err := hotResolve(res, Desc, r.Below, r.Floor, r.N)
	return Newest{c: c, counter: counter}, err
}

// Counter is the topic's last issued seq (0: Redis holds no counter).
func (n Newest) Counter() int64 { return n.counter }

// Version is the topic's message version read before the cache
// (unversioned, 0, when Redis held none).
func (n Newest) Version() int64 { return n.c.Version }

// Gap reports whether seq is a recorded gap the read found.
func (n Newest) Gap(seq int64) bool { return n.c.Gaps[seq] }

// Bound is how far a count over the read may go (the unread badges): the
// seq counter lowered to the newest cached message — a seq above it is not
// answered yet, like one not stored yet in the month tables (the caller
// checks each is in flight) — and not Counted when Redis holds no counter:
// the cache proves nothing then.
func (n Newest) Bound() routing.Bound {
	b := routing.Bound{Settled: n.counter, Counted: n.counter > 0}
	if len(n.c.Members) > 0 {
		b.Settled = min(b.Settled, int64(n.c.Members[0].Score))
	}
	return b
}

// Walk is the newest-first page of the read from seq from down to stop
// (inclusive), as walk builds it over the read alone: ok only when the read
// proves every seq it passes.
func (n Newest) Walk(from, stop int64, limit int, hidden Hidden, keepDeleted bool) ([]message.Message, bool) {
	page, ok, _ := walk(hotView{Top: n.c}, from, stop, Desc, limit, hidden, keepDeleted)
	return page, ok
}
