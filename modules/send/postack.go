package send

import (
	"context"
	"errors"
	"sync"
)

// The call after the broker's ack (lua/fenced.lua, sent) takes several of a
// tenant's sends at once: sends whose acks come together — a produce
// request carries many of them, and the broker acknowledges them in one
// response — share one Redis call instead of making one each. That is
// group commit without a timer: a send whose tenant has no call in flight
// makes the call at once with whatever is queued (at least itself), so an
// idle tenant's send waits for nothing; while a call is in flight, the
// acks arriving queue, and the first of them makes the next call for all
// of them when it returns. A send therefore waits at most for the call in
// flight and its own; every send's reply is its own, as if it had made
// the call alone (one send's failing command fails only that send).
//
// All of a tenant's keys share one hash tag, so one call may touch the
// keys of any of its sends on a Redis Cluster too.

// maxAckBatch bounds the sends of one call: a call runs alone on Redis,
// and 64 sends' part (about ten commands each) keeps it well under a
// millisecond.
const maxAckBatch = 64

// ackReply is one send's part of the call: the sent function's reply for
// it, or the error that stopped its part.
type ackReply struct {
	n   int64
	err error
}

// ackCall makes one call for a batch: keys and args hold the batch's sends'
// laid end to end, in order; it answers one reply per send, or an error
// that failed the whole call.
type ackCall func(ctx context.Context, keys, args []string) ([]ackReply, error)

// ackItem is one send waiting for its part.
type ackItem struct {
	keys, args []string
	done       chan ackTurn
}

// ackTurn is what a waiting send receives: its reply, or the turn to make
// the next call (lead) for the sends queued behind the last one.
type ackTurn struct {
	reply ackReply
	lead  bool
}

// ackQueue is one tenant's sends waiting for a call, and whether one is in
// flight.
type ackQueue struct {
	items []*ackItem
	busy  bool
}

// ackBatcher coalesces the post-ack calls of each tenant's sends.
type ackBatcher struct {
	call   ackCall
	sizes  func(n int) // observes the sends of each call (nil: not observed)
	mu     sync.Mutex
	queues map[string]*ackQueue // only tenants with a call in flight
}

func newAckBatcher(call ackCall, sizes func(int)) *ackBatcher {
	return &ackBatcher{call: call, sizes: sizes, queues: map[string]*ackQueue{}}
}

// do makes the send's part of a call (keys and args as the sent function
// numbers one send's) and answers its reply. ctx bounds the call this send
// makes for others too: it is cut loose from the request's cancellation by
// the caller (a hanging-up client must not fail the sends batched with it).
// A send waiting for another's call waits for that call, whose own
// deadline bounds it.
func (b *ackBatcher) do(ctx context.Context, tenant string, keys, args []string) (int64, error) {
	it := &ackItem{keys: keys, args: args, done: make(chan ackTurn, 1)}
	b.mu.Lock()
	q := b.queues[tenant]
	if q == nil {
		q = &ackQueue{}
		b.queues[tenant] = q
	}
	q.items = append(q.items, it)
	lead := !q.busy
	q.busy = true
	b.mu.Unlock()
	if !lead {
		t := <-it.done
		if !t.lead {
			return t.reply.n, t.reply.err
		}
	}
	b.flush(ctx, tenant, q)
	t := <-it.done
	return t.reply.n, t.reply.err
}

// flush makes one call for the queued sends (this send among them), gives
// each its reply, and hands the turn to the first send queued meanwhile —
// or, with none, marks the tenant idle.
func (b *ackBatcher) flush(ctx context.Context, tenant string, q *ackQueue) {
	b.mu.Lock()
	n := min(len(q.items), maxAckBatch)
	batch := q.items[:n:n]
	q.items = append([]*ackItem(nil), q.items[n:]...)
	b.mu.Unlock()

	var keys, args []string
	if n == 1 {
		keys, args = batch[0].keys, batch[0].args
	} else {
		for _, it := range batch {
			keys = append(keys, it.keys...)
			args = append(args, it.args...)
		}
	}
	if b.sizes != nil {
		b.sizes(n)
	}
	replies, err := b.call(ctx, keys, args)
	if err == nil && len(replies) != n {
		err = errors.New("send: the call after the ack answered a reply per send but not for every send")
	}
	for i, it := range batch {
		r := ackReply{err: err}
		if err == nil {
			r = replies[i]
		}
		it.done <- ackTurn{reply: r}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if len(q.items) == 0 {
		q.busy = false
		delete(b.queues, tenant)
		return
	}
	q.items[0].done <- ackTurn{lead: true}
}
