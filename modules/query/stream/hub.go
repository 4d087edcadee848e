package stream

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// The hub holds one Redis subscription per topic per process, however many
// sockets follow the topic: each topic's realtime channel (routing
// Keys.Realtime) is subscribed with SSUBSCRIBE — sharded pub/sub, which
// Redis Cluster delivers from the node that owns the channel's slot and a
// standalone Redis 7 serves alike — while at least one socket follows it.
// Every publication is parsed once and offered to each follower without
// blocking. The hub also watches the ACL version of every topic it holds
// and tells the followers when it moves, so a removed member stops
// receiving within about an acl_check_interval.

// kind is what a hub event says.
type kind uint8

const (
	evMessage kind = iota // a new message, raw = the published frame
	evChange              // a change of a message, raw = the published frame
	evResync              // the subscription was (re)made: events may have been missed
	evACL                 // the topic's memberships changed: check the caller's again
	evRead                // the user moved a read cursor, raw = the published frame
)

// event is one thing the hub learns about a topic, shared by every
// follower it is offered to.
type event struct {
	kind      kind
	seq       int64 // evMessage, evChange: the message's seq
	changeSeq int64 // evChange
	created   time.Time
	raw       []byte
}

// delivery is an event offered to one follower: two words, so a socket's
// queue of send_queue deliveries stays small.
type delivery struct {
	f  *follow
	ev *event
}

// published is the part of a realtime publication the hub reads.
type published struct {
	Type    string `json:"type"`
	Message struct {
		Seq       int64        `json:"seq"`
		CreatedAt message.Time `json:"created_at"`
	} `json:"message"`
	Change struct {
		Seq       int64 `json:"seq"`
		ChangeSeq int64 `json:"change_seq"`
	} `json:"change"`
}

// channel is one topic's subscription.
type channel struct {
	name, tenant, topic string
	aclKey              string

	mu   sync.RWMutex
	subs map[*follow]struct{}

	// hub.mu guards these
	refs    int
	closing bool
	acl     string // the ACL version last seen
	aclRead bool

	ready     chan struct{} // closed at the first subscription confirmation
	readyOnce sync.Once
	done      chan struct{} // closed when the subscription loop ended
	cancel    context.CancelFunc
}

// Hub is the process's set of topic subscriptions.
type Hub struct {
	rdb rueidis.Client
	m   *metrics
	log zerolog.Logger

	mu     sync.Mutex
	topics map[string]*channel

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newHub(rdb rueidis.Client, m *metrics, log zerolog.Logger, aclEvery time.Duration) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{rdb: rdb, m: m, log: log, topics: map[string]*channel{}, ctx: ctx, cancel: cancel}
	h.wg.Add(1)
	go h.watchACL(aclEvery)
	return h
}

// close ends every subscription and the ACL watch.
func (h *Hub) close() {
	h.cancel()
	h.wg.Wait()
}

// join adds f to its topic's subscription, opening it if needed, and
// returns once Redis confirmed the subscription and the topic's ACL
// version was read: every publication from then on reaches f, and a
// membership change from then on is reported to it.
func (h *Hub) join(ctx context.Context, f *follow) error {
	keys, err := routing.KeysFor(f.c.p.Tenant)
	if err != nil {
		return err
	}
	name, aclKey := keys.Realtime(f.topic), keys.ACLVersion(f.topic)
	if f.reads {
		// the user's read channel: no topic, no membership to watch
		name, aclKey = keys.ReadFrames(f.c.p.UserID), ""
	}
	h.mu.Lock()
	c := h.topics[name]
	for c != nil && c.closing {
		// wait for a closing subscription to end: its SUNSUBSCRIBE must
		// not meet the new SSUBSCRIBE
		done := c.done
		h.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		h.mu.Lock()
		c = h.topics[name]
	}
	if c == nil {
		c = &channel{name: name, tenant: f.c.p.Tenant, topic: f.topic, aclKey: aclKey,
			subs: map[*follow]struct{}{}, ready: make(chan struct{}), done: make(chan struct{})}
		var cctx context.Context
		cctx, c.cancel = context.WithCancel(h.ctx)
		h.topics[name] = c
		h.m.channels.Inc()
		h.wg.Add(1)
		go h.receive(cctx, c)
	}
	c.refs++
	c.mu.Lock()
	c.subs[f] = struct{}{}
	c.mu.Unlock()
	f.ch = c
	h.mu.Unlock()
	select {
	case <-c.ready:
	case <-c.done:
		h.leave(f)
		return errHubClosed
	case <-ctx.Done():
		h.leave(f)
		return ctx.Err()
	}
	if aclKey == "" {
		return nil
	}
	// the ACL baseline, read after the follower joined: a change after it
	// is reported, one before it is seen by the caller's own check
	v, err := h.aclVersion(ctx, c)
	if err != nil {
		h.leave(f)
		return err
	}
	h.mu.Lock()
	if !c.aclRead {
		c.acl, c.aclRead = v, true
	}
	h.mu.Unlock()
	return nil
}

// leave removes f; the last follower out ends the subscription.
func (h *Hub) leave(f *follow) {
	c := f.ch
	if c == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	c.mu.Lock()
	_, ok := c.subs[f]
	delete(c.subs, f)
	c.mu.Unlock()
	if !ok {
		return
	}
	c.refs--
	if c.refs > 0 || c.closing {
		return
	}
	c.closing = true
	go func() {
		// SUNSUBSCRIBE ends the Receive once Redis confirms it; the cancel
		// ends it anyway if Redis does not answer
		ctx, cancel := context.WithTimeout(h.ctx, 5*time.Second)
		defer cancel()
		_ = h.rdb.Do(ctx, h.rdb.B().Sunsubscribe().Channel(c.name).Build()).Error()
		select {
		case <-c.done:
		case <-ctx.Done():
		}
		c.cancel()
	}()
}

// receive runs the topic's subscription until it is closed, subscribing
// again after a lost connection; every (re)subscription is announced to
// the followers as evResync, since publications in between are lost.
func (h *Hub) receive(ctx context.Context, c *channel) {
	defer h.wg.Done()
	defer func() {
		h.mu.Lock()
		if h.topics[c.name] == c {
			delete(h.topics, c.name)
		}
		h.mu.Unlock()
		h.m.channels.Dec()
		close(c.done)
	}()
	hook := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind != "ssubscribe" || s.Channel != c.name {
			return
		}
		first := false
		c.readyOnce.Do(func() { close(c.ready); first = true })
		if !first {
			h.m.resubscribes.Inc()
			c.offer(&event{kind: evResync})
		}
	})
	backoff := 50 * time.Millisecond
	for {
		err := h.rdb.Receive(hook, h.rdb.B().Ssubscribe().Channel(c.name).Build(), func(m rueidis.PubSubMessage) {
			h.dispatch(c, m.Message)
		})
		h.mu.Lock()
		closing := c.closing
		h.mu.Unlock()
		if closing || ctx.Err() != nil {
			return
		}
		// the subscription ended without us: Redis restarted, failed over,
		// moved the slot; subscribe again (and resync) after a pause
		h.log.Warn().Err(err).Str("channel", c.name).Msg("realtime subscription ended; subscribing again")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// dispatch parses a publication once and offers it to every follower.
func (h *Hub) dispatch(c *channel, raw string) {
	var p published
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		h.log.Warn().Err(err).Str("channel", c.name).Msg("unreadable realtime publication dropped")
		return
	}
	ev := &event{raw: []byte(raw)}
	switch p.Type {
	case "message":
		ev.kind, ev.seq, ev.created = evMessage, p.Message.Seq, p.Message.CreatedAt.Time
	case "change":
		ev.kind, ev.seq, ev.changeSeq = evChange, p.Change.Seq, p.Change.ChangeSeq
	case "read":
		ev.kind = evRead
	default:
		return
	}
	c.offer(ev)
}

// offer gives ev to every follower without waiting for any.
func (c *channel) offer(ev *event) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for f := range c.subs {
		f.c.push(delivery{f: f, ev: ev})
	}
}

func (h *Hub) aclVersion(ctx context.Context, c *channel) (string, error) {
	v, err := h.rdb.Do(ctx, h.rdb.B().Get().Key(c.aclKey).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	return v, err
}

// watchACL reads the ACL version of every held topic each interval and
// tells a topic's followers when it moved.
func (h *Hub) watchACL(every time.Duration) {
	defer h.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		chans := make([]*channel, 0, len(h.topics))
		for _, c := range h.topics {
			if c.aclRead && !c.closing {
				chans = append(chans, c)
			}
		}
		h.mu.Unlock()
		if len(chans) == 0 {
			continue
		}
		cmds := make(rueidis.Commands, len(chans))
		for i, c := range chans {
			cmds[i] = h.rdb.B().Get().Key(c.aclKey).Build()
		}
		ctx, cancel := context.WithTimeout(h.ctx, every)
		res := h.rdb.DoMulti(ctx, cmds...)
		cancel()
		for i, c := range chans {
			v, err := res[i].ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				continue // read again next time
			}
			h.mu.Lock()
			moved := v != c.acl
			c.acl = v
			h.mu.Unlock()
			if moved {
				c.offer(&event{kind: evACL})
			}
		}
	}
}
