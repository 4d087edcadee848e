package stream

import (
	"context"
	"encoding/json"
	"math/rand/v2"
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
	spread    time.Duration // evACL: the followers check within it, not all at once
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

// channel is one subscribed channel: a topic's, or a user's read channel.
type channel struct {
	name, tenant, topic string
	aclKey              string
	r                   *reader // the connection it is subscribed on

	mu   sync.RWMutex
	subs map[*follow]struct{}

	// hub.mu guards these
	refs      int
	closing   bool   // the last follower left: unsubscribing
	confirmed bool   // Redis confirmed the subscription once
	acl       string // the ACL version last seen
	aclRead   bool

	ready chan struct{} // closed at the first subscription confirmation
	done  chan struct{} // closed once unsubscribed, or when the hub closed
}

// reader is one dedicated Redis connection on which the hub subscribes
// every channel of one hash slot (all of them on a standalone Redis, which
// has no slots): a tenant's channels share its hash tag, so on Redis
// Cluster a process holds one connection per slot its tenants' channels
// fall in, on the node that owns the slot. Publications arrive on the
// connection's own read loop, which hands them to the hub by channel name:
// no goroutine per channel. Its keeper goroutine (re)connects it and
// subscribes its channels again after a lost connection.
type reader struct {
	slot  uint16
	chans map[string]*channel     // hub.mu: every channel on it, closing ones included
	dc    rueidis.DedicatedClient // hub.mu: nil while (re)connecting
	stop  bool                    // hub.mu: no channel left; the keeper ends
}

// Hub is the process's set of channel subscriptions.
type Hub struct {
	rdb     rueidis.Client
	keys    routing.KeySpace
	m       *metrics
	log     zerolog.Logger
	cluster bool

	mu      sync.RWMutex
	topics  map[string]*channel // by channel name
	readers map[uint16]*reader  // by slot

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newHub(rdb rueidis.Client, keys routing.KeySpace, m *metrics, log zerolog.Logger, aclEvery time.Duration) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{rdb: rdb, keys: keys, m: m, log: log, cluster: rdb.Mode() == rueidis.ClientModeCluster,
		topics: map[string]*channel{}, readers: map[uint16]*reader{}, ctx: ctx, cancel: cancel}
	h.wg.Add(1)
	go h.watchACL(aclEvery)
	return h
}

// close ends every subscription, connection and the ACL watch.
func (h *Hub) close() {
	h.cancel()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, c := range h.topics {
		delete(h.topics, name)
		close(c.done)
	}
}

// join adds f to its channel's subscription, subscribing it if needed,
// and returns once Redis confirmed the subscription and the topic's ACL
// version was read: every publication from then on reaches f, and a
// membership change from then on is reported to it.
func (h *Hub) join(ctx context.Context, f *follow) error {
	keys, err := h.keys.Tenant(f.c.p.Tenant)
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
		// wait for a closing subscription to end: the new SSUBSCRIBE must
		// follow its SUNSUBSCRIBE, not race it
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
	var subscribeOn rueidis.DedicatedClient
	if c == nil {
		c = &channel{name: name, tenant: f.c.p.Tenant, topic: f.topic, aclKey: aclKey,
			subs: map[*follow]struct{}{}, ready: make(chan struct{}), done: make(chan struct{})}
		h.topics[name] = c
		h.m.channels.Inc()
		subscribeOn = h.place(c)
	}
	c.refs++
	c.mu.Lock()
	c.subs[f] = struct{}{}
	c.mu.Unlock()
	f.ch = c
	h.mu.Unlock()
	if subscribeOn != nil {
		h.subscribe(subscribeOn, []string{name})
	}
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

// place puts a new channel on its slot's reader, starting the reader if
// there is none; it returns the connection to subscribe the channel on, or
// nil when the reader is (re)connecting and subscribes it itself. h.mu is
// held.
func (h *Hub) place(c *channel) rueidis.DedicatedClient {
	var slot uint16
	if h.cluster {
		cmd := h.rdb.B().Ssubscribe().Channel(c.name).Build()
		slot = cmd.Slot()
	}
	r := h.readers[slot]
	if r == nil {
		r = &reader{slot: slot, chans: map[string]*channel{}}
		h.readers[slot] = r
		h.wg.Add(1)
		go h.keep(r)
	}
	r.chans[c.name] = c
	c.r = r
	return r.dc
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
	dc := c.r.dc
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		// the confirmation of the SUNSUBSCRIBE ends the channel (unsubscribed
		// hook); a connection lost meanwhile ends it at the reconnection,
		// and an unanswered one ends it after the timeout (a publication
		// still arriving for it finds no channel and is dropped)
		ctx, cancel := context.WithTimeout(h.ctx, unsubscribeTimeout)
		defer cancel()
		if dc != nil {
			_ = dc.Do(ctx, dc.B().Sunsubscribe().Channel(c.name).Build()).Error()
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			h.mu.Lock()
			h.finish(c)
			h.mu.Unlock()
		}
	}()
}

// finish removes an unsubscribed channel, and the reader it was on when it
// was the last; h.mu is held.
func (h *Hub) finish(c *channel) {
	if h.topics[c.name] != c {
		return // finished already
	}
	delete(h.topics, c.name)
	h.m.channels.Dec()
	close(c.done)
	r := c.r
	delete(r.chans, c.name)
	if len(r.chans) > 0 || r.stop {
		return
	}
	r.stop = true
	if h.readers[r.slot] == r {
		delete(h.readers, r.slot)
	}
	if r.dc != nil {
		// ends the keeper's wait; not from this goroutine, which may be
		// the connection's own read loop (the unsubscribed hook)
		go r.dc.Close()
	}
}

// keep runs a reader's connection until the reader stops or the hub
// closes: it connects, subscribes every channel on the reader in a few
// commands, and when the connection is lost connects again after a
// growing pause; every channel's new confirmation then tells its
// followers to catch up (publications in between are lost).
func (h *Hub) keep(r *reader) {
	defer h.wg.Done()
	backoff := resubscribeFirst
	for {
		dc, _ := h.rdb.Dedicate()
		lost := dc.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: h.onMessage, OnSubscription: h.onSubscription})
		h.mu.Lock()
		var names []string
		for _, c := range r.chans {
			if c.closing {
				h.finish(c) // the lost connection unsubscribed it
			} else {
				names = append(names, c.name)
			}
		}
		if r.stop || h.ctx.Err() != nil {
			h.mu.Unlock()
			dc.Close()
			return
		}
		r.dc = dc
		h.mu.Unlock()
		err := h.subscribe(dc, names)
		if err == nil {
			backoff = resubscribeFirst
			select {
			case err = <-lost:
			case <-h.ctx.Done():
			}
		}
		h.mu.Lock()
		r.dc = nil
		stop := r.stop
		h.mu.Unlock()
		dc.Close()
		if stop || h.ctx.Err() != nil {
			return
		}
		// Redis restarted, failed over, or moved the slot
		h.log.Warn().Err(err).Int("channels", len(names)).Msg("realtime subscriptions lost; subscribing again")
		select {
		case <-h.ctx.Done():
			return
		case <-time.After(jitter(backoff)):
		}
		backoff = min(2*backoff, resubscribeMax)
	}
}

// subscribe sends SSUBSCRIBE for names on dc, a few hundred channels per
// command (a reader's channels share a slot, so one command may carry
// many). A refusal (a redirection: the slot moved) closes the connection,
// so that its keeper connects again to the slot's owner and subscribes
// everything there; a lost connection is the keeper's to notice.
func (h *Hub) subscribe(dc rueidis.DedicatedClient, names []string) error {
	for len(names) > 0 {
		n := min(len(names), subscribeBatch)
		ctx, cancel := context.WithTimeout(h.ctx, unsubscribeTimeout)
		err := dc.Do(ctx, dc.B().Ssubscribe().Channel(names[:n]...).Build()).Error()
		cancel()
		if err != nil {
			if _, refused := err.(*rueidis.RedisError); refused {
				dc.Close()
			}
			return err
		}
		names = names[n:]
	}
	return nil
}

// onSubscription follows Redis's confirmations on the readers'
// connections (it runs on a connection's read loop: it must not block).
func (h *Hub) onSubscription(s rueidis.PubSubSubscription) {
	h.mu.Lock()
	c := h.topics[s.Channel]
	if c == nil || (s.Kind == "ssubscribe" && c.closing) {
		h.mu.Unlock()
		return
	}
	switch s.Kind {
	case "ssubscribe":
		first := !c.confirmed
		c.confirmed = true
		h.mu.Unlock()
		if first {
			close(c.ready)
			return
		}
		h.m.resubscribes.Inc()
		c.offer(&event{kind: evResync})
		return
	case "sunsubscribe":
		if c.closing {
			h.finish(c)
		} else if dc := c.r.dc; dc != nil {
			// unsubscribed by Redis (its slot moved to another node):
			// connect again, to the slot's new owner
			go dc.Close()
		}
	}
	h.mu.Unlock()
}

// onMessage hands a publication to its channel (on a connection's read
// loop: dispatch never waits for a socket).
func (h *Hub) onMessage(m rueidis.PubSubMessage) {
	h.mu.RLock()
	c := h.topics[m.Channel]
	h.mu.RUnlock()
	if c != nil {
		h.dispatch(c, m.Message)
	}
}

// The pauses of a reader connecting again (doubled up to the maximum,
// jittered so that many processes do not reconnect in step), how long an
// unsubscription may go unconfirmed, and how many channels one SSUBSCRIBE
// carries.
const (
	resubscribeFirst   = 50 * time.Millisecond
	resubscribeMax     = 2 * time.Second
	unsubscribeTimeout = 5 * time.Second
	subscribeBatch     = 256
)

// aclSpread is how long the followers of a topic whose memberships moved
// take to check theirs again: at once for a few, spread for many (each
// check may read MySQL), within half an interval so that a removed member
// still stops receiving within about a second.
func aclSpread(followers int, every time.Duration) time.Duration {
	if followers <= aclSpreadFrom {
		return 0
	}
	return min(time.Duration(followers)*aclSpreadEach, every/2)
}

// Followers of a topic that check their memberships again at once, and the
// time added per follower beyond.
const (
	aclSpreadFrom = 16
	aclSpreadEach = 200 * time.Microsecond
)

// jitter is d spread over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2)
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
				c.mu.RLock()
				n := len(c.subs)
				c.mu.RUnlock()
				c.offer(&event{kind: evACL, spread: aclSpread(n, every)})
			}
		}
	}
}
