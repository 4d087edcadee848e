package stream

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/keyset"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// conn is one socket: one goroutine, its reader, while idle. The pump —
// which owns the topics the socket follows and writes every frame but
// WebSocket pings — runs only while there is something to do: the hub's
// events, the client's requests, a heartbeat or a retry start it in a
// goroutine of its own (one at a time), which ends once they are handled.
// The hub hands events through the bounded send queue: a socket whose
// queue holds send_queue events when the hub offers one more is closed
// with 1008 "slow consumer", so a stalled reader costs at most send_queue
// events of memory. The queue is a slice allocated on the first event (an
// idle socket holds none), and no timer runs while idle: heartbeats come
// from the server's sweep (pingDue), retries and token expiry from timers
// that run no goroutine while they wait.
type conn struct {
	s      *Server
	ws     *websocket.Conn
	nc     net.Conn   // under ws: its write deadline bounds a frame's write
	wmu    sync.Mutex // one send at a time (see send)
	p      httpapi.Principal
	token  string // the credential p was verified from, verified again on reload
	single bool   // a /v1/topics/{topic}/stream socket: it ends with its topic
	ctx    context.Context

	qmu      sync.Mutex
	queue    []delivery // qmu; at most send_queue
	requests []control  // qmu: the client's requests, at most one waiting
	retryDue bool       // qmu: the retry timer fired
	pumping  bool       // qmu: a pump goroutine runs
	closed   bool       // qmu: the socket is torn down; no pump starts
	pumps    sync.WaitGroup
	taken    chan struct{} // cap 1: the pump took the reader's request

	pingDue atomic.Bool // the sweep asks for a heartbeat
	beat    int         // Server.mu: the socket's heartbeat slot
	cancel  func()      // ends the socket's reads from storage and the hub
	expiry  *time.Timer // token expiry (AfterFunc: no goroutine while waiting)

	// pump only
	first   map[string]cursors // the topics to follow from the start, until started
	started bool
	spare   []delivery  // the previous queue, reused
	retryT  *time.Timer // AfterFunc: sets retryDue and starts the pump
	armedAt time.Time   // when retryT fires; zero when not armed
	topics  map[string]*follow
	reads   *follow // the user's read channel, nil if it could not be joined
	behind  bool    // some topic waits for a seq in flight

	lastSeen atomic.Int64 // unix nanos of the last sign of life from the peer

	closeOnce sync.Once
	done      chan struct{}
}

// follow is one topic of one socket. The pump alone reads and writes its
// cursors; the hub only holds it as a key.
type follow struct {
	c     *conn
	topic string
	ch    *channel
	reads bool // the user's read channel, not a topic

	cursor  int64 // every seq up to it was delivered, is a gap, or is not visible
	changes int64 // the last change_seq delivered; -1 when the client gave none
	seen    int64 // the highest seq known to exist (a live message above cursor)
	held    map[int64]*event
	// checkAt: a membership check is due then (zero: none). A moved ACL
	// version schedules one, spread over a moment when many sockets
	// follow the topic; a check that failed for a reason other than a
	// refusal (Redis, MySQL) is made again after checkBackoff, doubled at
	// each failure up to recheckMax and jittered, so that the sockets of a
	// process do not all retry in step against a struggling MySQL.
	checkAt      time.Time
	checkBackoff time.Duration
	// changesDue: reading the changes after the change cursor failed; read
	// again at the next retry tick
	changesDue bool
}

// control is a request the reader passes to the pump.
type control struct {
	subscribe   map[string]cursors
	unsubscribe []string
}

// cursors are where a client resumes a topic.
type cursors struct {
	Since        *int64 `json:"since"`
	ChangesSince *int64 `json:"changes_since"`
}

// Close codes and reasons the server ends a socket with.
const (
	reasonSlow    = "slow consumer"
	reasonExpired = "token expired"
	reasonIdle    = "idle timeout"
	reasonDenied  = "permission denied"
	reasonStop    = "server shutting down"
	reasonGone    = "closed by the client"
	reasonRetry   = "try again later"
	reasonRevoked = "credentials revoked"
	// reasonKeyRemoved: the key that verified the socket's token (its kid,
	// Principal.KeyID) left the tenant's key set, by a reload or a JWKS
	// fetch; a token of a key still in the set opens a new socket
	reasonKeyRemoved = "key removed"
)

func (c *conn) alive() { c.lastSeen.Store(time.Now().UnixNano()) }

// push offers an event from the hub; a full queue closes the socket.
func (c *conn) push(d delivery) {
	select {
	case <-c.done:
		return // ending: nothing more is written
	default:
	}
	c.qmu.Lock()
	if len(c.queue) < c.s.lim.SendQueue {
		c.queue = append(c.queue, d)
		c.startLocked()
		c.qmu.Unlock()
		return
	}
	c.qmu.Unlock()
	c.s.m.dropped.Inc()
	c.s.m.slow.Inc()
	c.end(websocket.StatusPolicyViolation, reasonSlow)
}

// wake starts the pump unless it runs.
func (c *conn) wake() {
	c.qmu.Lock()
	c.startLocked()
	c.qmu.Unlock()
}

// startLocked starts the pump goroutine unless one runs or the socket is
// torn down; qmu is held.
func (c *conn) startLocked() {
	if c.pumping || c.closed {
		return
	}
	c.pumping = true
	c.pumps.Add(1)
	go c.pump()
}

// handled gives back a queue the pump went through: kept for reuse while
// small, so a burst does not pin its memory to an idle socket.
func (c *conn) handled(q []delivery) {
	clear(q)
	c.spare = nil
	if cap(q) <= 16 {
		c.spare = q[:0]
	}
}

// end closes the socket once with code and reason, without waiting: the
// close frame follows whatever frame is being written.
func (c *conn) end(code websocket.StatusCode, reason string) {
	c.closeOnce.Do(func() {
		c.s.m.closes.WithLabelValues(reason).Inc()
		close(c.done)
		if c.cancel != nil {
			c.cancel()
		}
		go func() { _ = c.ws.Close(code, reason) }()
	})
}

// revalidate ends the socket when its token no longer verifies: with
// "key removed" when the set no longer holds the key of the token's kid,
// else "credentials revoked" (the tenant is gone, or requires another
// issuer or audience).
func (c *conn) revalidate() {
	if _, err := c.s.auth.Verify(c.token); err != nil {
		if errors.Is(err, keyset.ErrUnknownKey) {
			c.s.log.Info().Str("tenant", c.p.Tenant).Str("kid", c.p.KeyID).Msg("stream: socket closed, its key left the key set")
			c.end(websocket.StatusPolicyViolation, reasonKeyRemoved)
			return
		}
		c.end(websocket.StatusPolicyViolation, reasonRevoked)
	}
}

// run serves the socket until it ends, as its reader; the pump starts at
// once to follow the first topics.
func (c *conn) run() {
	// reads from storage and the hub end with the socket (end cancels
	// ctx); the WebSocket's own reads and writes never take this context
	// (cancelling one would drop the connection before its close frame)
	defer c.cancel()
	if !c.p.Expires.IsZero() {
		c.expiry = time.AfterFunc(time.Until(c.p.Expires), func() {
			c.end(websocket.StatusPolicyViolation, reasonExpired)
		})
		defer c.expiry.Stop()
	}
	c.wake()
	c.read()
	// the socket ended: no pump starts any more, the one running finishes
	c.end(websocket.StatusGoingAway, reasonStop)
	c.qmu.Lock()
	c.closed = true
	c.qmu.Unlock()
	c.pumps.Wait()
	if c.retryT != nil {
		c.retryT.Stop()
	}
	for _, f := range c.topics {
		c.s.hub.leave(f)
		c.s.m.follows.Dec()
	}
	if c.reads != nil {
		c.s.hub.leave(c.reads)
	}
	c.topics = nil
}

// pump handles what is due — the first subscriptions, the client's
// requests, the hub's events, retries, a heartbeat — until nothing is,
// then ends (the next push, request or timer starts it again).
func (c *conn) pump() {
	defer c.pumps.Done()
	ctx := c.ctx
	if !c.started {
		c.started = true
		c.begin(ctx)
	}
	for {
		c.qmu.Lock()
		ping := c.pingDue.Swap(false)
		if ctx.Err() != nil || (len(c.queue) == 0 && len(c.requests) == 0 && !c.retryDue && !ping) {
			c.pumping = false
			c.qmu.Unlock()
			return
		}
		// the queue and the spare take turns: the hub appends to one while
		// the pump goes through the other
		q, reqs, retry := c.queue, c.requests, c.retryDue
		c.queue, c.requests, c.retryDue = c.spare, nil, false
		c.spare = nil
		c.qmu.Unlock()
		for _, r := range reqs {
			select {
			case c.taken <- struct{}{}:
			default:
			}
			if r.subscribe != nil {
				c.subscribe(ctx, r.subscribe)
			}
			for _, t := range r.unsubscribe {
				c.unsubscribe(t)
			}
		}
		for _, d := range q {
			c.handle(ctx, d.f, d.ev)
		}
		c.handled(q)
		if retry {
			c.armedAt = time.Time{}
			c.retry(ctx)
		}
		if ping {
			c.heartbeat(ctx)
		}
		c.arm()
	}
}

// begin joins the user's read channel and follows the first topics.
func (c *conn) begin(ctx context.Context) {
	// the user's read-cursor moves, whatever topics the socket follows
	c.reads = &follow{c: c, reads: true}
	if err := c.s.hub.join(ctx, c.reads); err != nil {
		c.reads = nil
		if ctx.Err() == nil {
			c.s.log.Warn().Err(err).Msg("stream: read channel not joined; this socket gets no read frames")
		}
	}
	if c.first != nil {
		c.subscribe(ctx, c.first)
	}
	c.first = nil
	c.arm()
}

// arm sets the retry timer to the next retry due, if any is and the timer
// is not set earlier already; the timer exists only once a topic waited
// for a seq in flight or a membership check.
func (c *conn) arm() {
	at, ok := c.nextRetry()
	if !ok || (!c.armedAt.IsZero() && !at.Before(c.armedAt)) {
		return
	}
	if c.retryT == nil {
		c.retryT = time.AfterFunc(time.Until(at), func() {
			c.qmu.Lock()
			c.retryDue = true
			c.startLocked()
			c.qmu.Unlock()
		})
	} else {
		c.retryT.Reset(time.Until(at))
	}
	c.armedAt = at
}

// nextRetry is when the retry tick is next due, if anything waits: a seq
// in flight or a change catch-up to read again (every holdRetry), or a
// membership check.
func (c *conn) nextRetry() (time.Time, bool) {
	var at time.Time
	if c.behind {
		at = time.Now().Add(holdRetry)
	}
	for _, f := range c.topics {
		if f.changesDue && (at.IsZero() || holdRetry < time.Until(at)) {
			at = time.Now().Add(holdRetry)
		}
		if !f.checkAt.IsZero() && (at.IsZero() || f.checkAt.Before(at)) {
			at = f.checkAt
		}
	}
	return at, !at.IsZero()
}

// handle applies one hub event to its topic.
func (c *conn) handle(ctx context.Context, f *follow, ev *event) {
	if f.reads {
		// a read frame passes as published (a resync needs nothing: a
		// missed move is in the next sync)
		if ev.kind == evRead {
			c.send(ev.raw, time.Time{})
		}
		return
	}
	if c.topics[f.topic] != f {
		return // unsubscribed since
	}
	switch ev.kind {
	case evMessage:
		switch {
		case ev.seq <= f.cursor:
			return // caught up already
		case ev.seq == f.cursor+1:
			if c.send(ev.raw, ev.created) {
				f.cursor = ev.seq
				c.drain(ctx, f)
			}
		default:
			// a lower seq is still on its way: hold this one until the
			// lower ones arrive (usually next: concurrent sends publish in
			// any order), are stored or are recorded as gaps — the retry
			// tick reads the topic from storage meanwhile
			f.seen = max(f.seen, ev.seq)
			if f.held == nil {
				f.held = map[int64]*event{}
			}
			if len(f.held) < c.s.lim.SendQueue {
				f.held[ev.seq] = ev
			}
			c.behind = true
		}
	case evChange:
		if f.changes < 0 || ev.changeSeq == f.changes+1 {
			// a held copy of the changed message is outdated: storage has
			// the new version
			delete(f.held, ev.seq)
			if c.send(ev.raw, time.Time{}) {
				f.changes = ev.changeSeq
			}
		} else if ev.changeSeq > f.changes {
			delete(f.held, ev.seq)
			c.catchUpChanges(ctx, f)
		}
	case evResync:
		// publications may have been lost while Redis was away: read up
		// to what was issued by now
		c.expect(ctx, f)
		c.catchUp(ctx, f)
		if f.changes >= 0 {
			c.catchUpChanges(ctx, f)
		}
	case evACL:
		if ev.spread <= 0 {
			c.check(ctx, f)
		} else if at := time.Now().Add(rand.N(ev.spread)); f.checkAt.IsZero() || at.Before(f.checkAt) {
			f.checkAt = at
		}
	}
}

// check makes sure the caller may still read the topic.
func (c *conn) check(ctx context.Context, f *follow) {
	err := c.s.q.Authorize(ctx, c.p, f.topic)
	switch {
	case err != nil && !denied(err):
		// neither kept as checked nor dropped: checked again after a
		// growing pause until it answers
		f.checkBackoff = min(max(2*f.checkBackoff, recheckFirst), recheckMax)
		f.checkAt = time.Now().Add(jitter(f.checkBackoff))
		c.s.m.aclCheckErrors.Inc()
		c.s.log.Debug().Err(err).Str("topic", f.topic).Msg("stream: membership re-check failed; retrying")
	case err != nil:
		c.deny(f.topic, err)
	default:
		f.checkAt, f.checkBackoff = time.Time{}, 0
	}
}

// retry reads again the topics waiting for a seq in flight and checks the
// memberships that could not be checked.
func (c *conn) retry(ctx context.Context) {
	now := time.Now()
	for _, f := range c.topics {
		if !f.checkAt.IsZero() && !now.Before(f.checkAt) {
			c.check(ctx, f)
		}
	}
	for _, f := range c.topics {
		if f.changesDue {
			c.catchUpChanges(ctx, f)
		}
	}
	if c.behind {
		c.catchUpAll(ctx)
	}
}

// expect makes the topic read storage until it reaches the last seq
// issued by now.
func (c *conn) expect(ctx context.Context, f *follow) {
	if last, err := c.s.lastIssued(ctx, c.p.Tenant, f.topic); err == nil {
		f.seen = max(f.seen, last)
	} else {
		f.seen = max(f.seen, f.cursor+1) // unknown: read again until it answers
	}
	c.updateBehind()
}

// drain sends held messages that follow the cursor.
func (c *conn) drain(ctx context.Context, f *follow) {
	for {
		ev, ok := f.held[f.cursor+1]
		if !ok {
			break
		}
		delete(f.held, ev.seq)
		if !c.send(ev.raw, ev.created) {
			return
		}
		f.cursor = ev.seq
	}
	for s := range f.held {
		if s <= f.cursor {
			delete(f.held, s)
		}
	}
	c.updateBehind()
}

func (c *conn) updateBehind() {
	c.behind = false
	for _, f := range c.topics {
		if f.seen > f.cursor {
			c.behind = true
			return
		}
	}
}

func (c *conn) catchUpAll(ctx context.Context) {
	for _, f := range c.topics {
		if f.seen > f.cursor {
			c.catchUp(ctx, f)
		}
	}
}

// catchUp reads the topic forward from its cursor through the read path (the
// settled watermark stops it below a seq still in flight), sends what it
// finds and the recorded gaps, then what is held above. It needs one of
// the per-process catch-up slots.
func (c *conn) catchUp(ctx context.Context, f *follow) {
	release, ok := c.s.acquire(ctx, c.p)
	if !ok {
		return
	}
	defer release()
	c.s.m.catchups.Inc()
	for {
		page, err := c.s.q.Since(ctx, c.p, f.topic, f.cursor, pageSize)
		if err != nil {
			if denied(err) {
				c.deny(f.topic, err)
				return
			}
			// storage unavailable: the held messages wait, the next retry
			// reads again
			c.s.m.catchupErrors.Inc()
			c.s.log.Debug().Err(err).Str("topic", f.topic).Msg("stream: catch-up read failed; retrying")
			f.seen = max(f.seen, f.cursor+1)
			c.behind = true
			return
		}
		gaps := page.Gaps
		for _, m := range page.Messages {
			for len(gaps) > 0 && gaps[0] < m.Seq {
				if !c.sendGaps(ctx, f, &gaps, m.Seq) {
					return
				}
			}
			if m.Seq <= f.cursor {
				continue
			}
			b, _ := m.AppendJSON([]byte(`{"type":"message","message":`))
			if !c.send(append(b, '}'), time.Time{}) {
				return
			}
			f.cursor = m.Seq
		}
		if !c.sendGaps(ctx, f, &gaps, page.Through+1) {
			return
		}
		f.cursor = max(f.cursor, page.Through)
		if !page.HasMore {
			break
		}
	}
	c.drain(ctx, f)
}

// sendGaps sends the gaps below stop as gap frames, one per run of
// consecutive seqs, and moves the cursor over them.
func (c *conn) sendGaps(ctx context.Context, f *follow, gaps *[]int64, stop int64) bool {
	g := *gaps
	for len(g) > 0 && g[0] < stop {
		from, to := g[0], g[0]
		g = g[1:]
		for len(g) > 0 && g[0] == to+1 && g[0] < stop {
			to, g = g[0], g[1:]
		}
		if to <= f.cursor {
			continue
		}
		from = max(from, f.cursor+1)
		b, _ := json.Marshal(gapFrame{Type: "gap", Topic: f.topic, From: from, To: to})
		if !c.send(b, time.Time{}) {
			return false
		}
		f.cursor = to
	}
	*gaps = g
	return true
}

// catchUpChanges sends the topic's changes after the change cursor from
// the revisions; a backlog beyond max_catchup_changes, or a cursor ahead
// of the topic's changes, is a reset frame instead: the client reloads
// what it shows of the topic and continues from the reset's change_seq.
func (c *conn) catchUpChanges(ctx context.Context, f *follow) {
	release, ok := c.s.acquire(ctx, c.p)
	if !ok {
		return
	}
	defer release()
	ch, err := c.s.q.ChangesSince(ctx, c.p, f.topic, f.changes, c.s.lim.MaxCatchupChanges)
	f.changesDue = err != nil && !denied(err)
	if err != nil {
		if denied(err) {
			c.deny(f.topic, err)
			return
		}
		// storage unavailable: read again at the next retry tick, the
		// change cursor unmoved, so nothing is skipped
		c.s.m.catchupErrors.Inc()
		c.s.log.Debug().Err(err).Str("topic", f.topic).Msg("stream: change catch-up failed; retrying")
		return
	}
	if ch.More || f.changes > ch.Last || !continuous(ch.Changes, f.changes) {
		b, _ := json.Marshal(resetFrame{Type: "reset", Topic: f.topic, ChangeSeq: ch.Last})
		if c.send(b, time.Time{}) {
			f.changes = ch.Last
		}
		return
	}
	for _, x := range ch.Changes {
		if !c.send(message.ChangeFrame(x), time.Time{}) {
			return
		}
		f.changes = x.ChangeSeq
	}
}

// continuous reports whether changes are the ones right after the change
// cursor, without a hole: revisions no longer kept (pruned) leave the
// history short of the cursor, which only a reset can bridge.
func continuous(changes []message.Change, after int64) bool {
	for _, x := range changes {
		if x.ChangeSeq != after+1 {
			return false
		}
		after = x.ChangeSeq
	}
	return true
}

// subscribe follows topics: for each, join the hub first (so nothing
// published from now on is missed: it queues in the inbox), check the
// caller may read it, then catch up from storage; the queued live events
// at or below the cursor are then skipped.
func (c *conn) subscribe(ctx context.Context, topics map[string]cursors) {
	for topic, cur := range topics {
		if _, ok := c.topics[topic]; ok {
			continue
		}
		if err := routing.ValidTopic(topic); err != nil {
			c.sendError(topic, err)
			continue
		}
		if len(c.topics) >= c.s.lim.MaxTopics {
			c.sendError(topic, httpapi.Errorf(httpapi.CodeInvalidArgument, "at most stream.max_topics ("+strconv.Itoa(c.s.lim.MaxTopics)+") topics per socket"))
			continue
		}
		f := &follow{c: c, topic: topic, changes: -1}
		if err := c.s.hub.join(ctx, f); err != nil {
			c.topics[topic] = f // for refuse
			c.s.m.follows.Inc()
			c.refuse(topic, err)
			continue
		}
		c.topics[topic] = f
		c.s.m.follows.Inc()
		if err := c.s.q.Authorize(ctx, c.p, topic); err != nil {
			c.refuse(topic, err)
			continue
		}
		// what was issued before the subscription is read from storage
		// (published before it, those never come live), waiting for seqs
		// still in flight. Without a since the client starts at the settled
		// watermark, not at the last issued seq: a seq below that one may
		// still be on its way (its publication came before the
		// subscription), and it is read from storage once it settles.
		last, err := c.s.lastIssued(ctx, c.p.Tenant, topic)
		if err != nil {
			c.refuse(topic, err)
			continue
		}
		f.seen = last
		if cur.Since == nil {
			b, err := c.s.q.Bound(ctx, c.p.Tenant, topic)
			if err != nil {
				c.refuse(topic, err)
				continue
			}
			f.cursor = b.Settled
		} else {
			f.cursor = *cur.Since
		}
		if cur.Since != nil || f.seen > f.cursor {
			c.catchUp(ctx, f)
		}
		if cur.ChangesSince != nil {
			f.changes = *cur.ChangesSince
			c.catchUpChanges(ctx, f)
		} else {
			// changes from now on: from the topic's last change_seq, so a
			// missed change event is noticed from the start
			ch, err := c.s.q.ChangesSince(ctx, c.p, topic, math.MaxInt64, 1)
			if err != nil {
				c.refuse(topic, err)
				continue
			}
			f.changes = ch.Last
		}
		b, _ := json.Marshal(liveFrame{Type: "live", Topic: topic, Seq: f.cursor, ChangeSeq: f.changes})
		c.send(b, time.Time{})
	}
}

func (c *conn) unsubscribe(topic string) {
	f, ok := c.topics[topic]
	if !ok {
		return
	}
	delete(c.topics, topic)
	c.s.hub.leave(f)
	c.s.m.follows.Dec()
	c.updateBehind()
}

// refuse stops a topic that could not be followed: an error frame, and
// on a single-topic socket the end of the socket (1008 when refused, 1013
// "try again later" when storage or Redis failed).
func (c *conn) refuse(topic string, err error) {
	if denied(err) {
		c.deny(topic, err)
		return
	}
	c.sendError(topic, err)
	c.unsubscribe(topic)
	if c.single {
		c.end(websocket.StatusTryAgainLater, reasonRetry)
	}
}

// deny stops a topic the caller may no longer read: an error frame, and on
// a single-topic socket the end of the socket; a credential no longer
// valid (the tenant is gone) ends any socket.
func (c *conn) deny(topic string, err error) {
	c.sendError(topic, err)
	c.unsubscribe(topic)
	if httpapi.HasCode(err, httpapi.CodeUnauthenticated) {
		c.end(websocket.StatusPolicyViolation, reasonRevoked)
	} else if c.single {
		c.end(websocket.StatusPolicyViolation, reasonDenied)
	}
}

// send writes one frame; false when the socket ended. created, when set,
// is the message's creation time for the delivery lag. A write that takes
// longer than write_timeout ends the socket.
func (c *conn) send(frame []byte, created time.Time) bool {
	select {
	case <-c.done:
		return false
	default:
	}
	// The bound is the connection's write deadline, not a context: a
	// context that can end costs the library a timer and callbacks on
	// every frame, one that cannot (Background) costs nothing. The
	// deadline also cuts short a write under way that holds the socket's
	// write lock (a pong). It is cleared after the write, so an idle
	// socket's close frame is not refused for a deadline long past; sends
	// take turns so that one's clearing never lifts another's deadline.
	c.wmu.Lock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.lim.WriteTimeout))
	err := c.ws.Write(context.Background(), websocket.MessageText, frame)
	err = cmp.Or(err, c.twice(frame, created))
	_ = c.nc.SetWriteDeadline(time.Time{})
	c.wmu.Unlock()
	if err != nil {
		c.end(websocket.StatusPolicyViolation, reasonSlow)
		return false
	}
	c.s.m.sent.Inc()
	if !created.IsZero() {
		c.s.m.lag.Observe(time.Since(created).Seconds())
	}
	return true
}

func (c *conn) sendError(topic string, err error) {
	code, msg := httpapi.Classify(err)
	if code == httpapi.CodeInternal || code == httpapi.CodeUnavailable {
		c.s.log.Warn().Err(err).Str("topic", topic).Msg("stream: topic failed")
	}
	b, _ := json.Marshal(errorFrame{Type: "error", Topic: topic, Code: code, Detail: msg})
	c.send(b, time.Time{})
}

// denied reports an error that says the caller may not read the topic:
// refused, or no longer authenticated (its tenant is not configured any
// more) — never one to retry.
func denied(err error) bool {
	code, _ := httpapi.Classify(err)
	return code == httpapi.CodePermissionDenied || code == httpapi.CodeUnauthenticated
}

// read takes the client's requests (multi-topic sockets subscribe and
// unsubscribe); anything read is a sign of life.
func (c *conn) read() {
	for {
		_, b, err := c.ws.Read(context.Background())
		if err != nil {
			c.end(websocket.StatusNormalClosure, reasonGone)
			return
		}
		c.alive()
		var req struct {
			Type   string          `json:"type"`
			Topics json.RawMessage `json:"topics"`
		}
		if json.Unmarshal(b, &req) != nil {
			c.requestError("not a JSON object")
			continue
		}
		var r control
		switch req.Type {
		case "pong":
			continue
		case "subscribe":
			if c.single || json.Unmarshal(req.Topics, &r.subscribe) != nil || len(r.subscribe) == 0 || negative(r.subscribe) {
				c.requestError(`subscribe needs "topics": {"<topic>": {"since": 0, "changes_since": 0}} (cursors >= 0) on a /v1/stream socket`)
				continue
			}
			// refused whole before any topic costs a read: a socket follows
			// at most max_topics, so a longer frame cannot be meant
			if len(r.subscribe) > c.s.lim.MaxTopics {
				c.requestError("a subscribe names at most stream.max_topics (" + strconv.Itoa(c.s.lim.MaxTopics) + ") topics; nothing was subscribed")
				continue
			}
			// and each frame is one of the user's reads
			if err := c.s.rl.Read(c.p.Tenant, c.p.UserID); err != nil {
				c.limitedError(err)
				continue
			}
		case "unsubscribe":
			if c.single || json.Unmarshal(req.Topics, &r.unsubscribe) != nil {
				c.requestError(`unsubscribe needs "topics": ["<topic>", …] on a /v1/stream socket`)
				continue
			}
		default:
			c.requestError("unknown request type " + strconv.Quote(req.Type))
			continue
		}
		// one request at a time: the next is read once the pump took this one
		c.qmu.Lock()
		c.requests = append(c.requests, r)
		c.startLocked()
		c.qmu.Unlock()
		select {
		case <-c.taken:
		case <-c.done:
			return
		}
	}
}

func negative(topics map[string]cursors) bool {
	for _, cur := range topics {
		if (cur.Since != nil && *cur.Since < 0) || (cur.ChangesSince != nil && *cur.ChangesSince < 0) {
			return true
		}
	}
	return false
}

// limitedError is the error frame of a request a rate limit refused, with
// its wait.
func (c *conn) limitedError(err error) {
	var e *httpapi.Error
	f := errorFrame{Type: "error", Code: httpapi.CodeRateLimited, Detail: "your read rate limit is reached; retry after retry_after_ms"}
	if errors.As(err, &e) {
		f.RetryAfterMS, _ = e.Details["retry_after_ms"].(int64)
	}
	b, _ := json.Marshal(f)
	c.send(b, time.Time{})
}

func (c *conn) requestError(msg string) {
	b, _ := json.Marshal(errorFrame{Type: "error", Code: httpapi.CodeInvalidArgument, Detail: msg})
	// from the reader: a concurrent write is safe
	c.send(b, time.Time{})
}

// heartbeat closes a socket whose peer went quiet, or sends a ping frame
// and a WebSocket ping whose pong is a sign of life.
func (c *conn) heartbeat(ctx context.Context) {
	if time.Since(time.Unix(0, c.lastSeen.Load())) > c.s.lim.IdleTimeout {
		c.end(websocket.StatusPolicyViolation, reasonIdle)
		return
	}
	if !c.send(pingFrame, time.Time{}) {
		return
	}
	go func() {
		pctx, cancel := context.WithTimeout(ctx, c.s.lim.PingInterval)
		defer cancel()
		if c.ws.Ping(pctx) == nil {
			c.alive()
		}
	}()
}

var pingFrame = []byte(`{"type":"ping"}`)

// pageSize is how many messages one catch-up read asks for.
const pageSize = 200

var errHubClosed = errors.New("stream: shutting down")

type gapFrame struct {
	Type  string `json:"type"`
	Topic string `json:"topic"`
	From  int64  `json:"from_seq"`
	To    int64  `json:"to_seq"`
}

type resetFrame struct {
	Type      string `json:"type"`
	Topic     string `json:"topic"`
	ChangeSeq int64  `json:"change_seq"`
}

type liveFrame struct {
	Type      string `json:"type"`
	Topic     string `json:"topic"`
	Seq       int64  `json:"seq"`
	ChangeSeq int64  `json:"change_seq"`
}

type errorFrame struct {
	Type   string `json:"type"`
	Topic  string `json:"topic,omitempty"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
	// RetryAfterMS is set on a rate_limited request error: the wait
	// before the request passes
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}
