// Package stream is the realtime WebSocket stream (docs/api.md, "Realtime
// stream"): members follow topics and receive new and changed messages as
// they happen, resuming after a reconnect from their cursors without a gap
// or a repeat. Its catch-up is the read path (since pages under the
// settled watermark, the revisions) and its authorization the read's: it
// reads through Reads, which the query module implements and app wires.
package stream

import (
	"bufio"
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Limits are the stream.* settings.
type Limits struct {
	MaxConnections    int
	MaxTopics         int
	SendQueue         int
	WriteTimeout      time.Duration
	PingInterval      time.Duration
	IdleTimeout       time.Duration
	ACLCheckInterval  time.Duration
	MaxCatchups       int
	MaxCatchupChanges int
}

// Reads are the reads of a socket's catch-up and checks (the query
// module's service).
type Reads interface {
	// Since is the caller's page of topic above since, oldest first,
	// never above the settled watermark.
	Since(ctx context.Context, p httpapi.Principal, topic string, since int64, limit int) (readpath.SincePage, error)
	// ChangesSince is the topic's changes after a change_seq, from the
	// revisions.
	ChangesSince(ctx context.Context, p httpapi.Principal, topic string, after int64, limit int) (readpath.Changes, error)
	// Authorize answers whether p may read topic: nil, or the error a
	// read would answer.
	Authorize(ctx context.Context, p httpapi.Principal, topic string) error
	// Bound is how far a forward reader of the topic may go: its settled
	// watermark is where a socket that gave no cursor starts.
	Bound(ctx context.Context, tenant, topic string) (routing.Bound, error)
}

// Params wires a Server.
type Params struct {
	Redis    rueidis.Client
	KeySpace routing.KeySpace // redis.key_prefix: where every key and channel is named
	Reads    Reads
	// Auth verifies the credential of a socket at the upgrade, again once
	// it is tracked, and on every Revalidate
	Auth       *httpapi.Authenticator
	Limits     Limits
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Server serves the stream routes.
type Server struct {
	rdb  rueidis.Client
	keys routing.KeySpace
	q    Reads
	auth *httpapi.Authenticator
	lim  Limits
	log  zerolog.Logger
	m    *metrics
	hub  *Hub

	catchups *catchupSlots
	open     atomic.Int64

	stopSweep chan struct{}
	sweeping  sync.WaitGroup

	mu       sync.Mutex
	conns    map[*conn]struct{}
	beats    []map[*conn]struct{} // the sockets of each heartbeat slot (sweep)
	stopping bool
	active   sync.WaitGroup
}

// New builds the server and its hub; Close ends both.
func New(p Params) *Server {
	m := newMetrics(p.Registerer)
	s := &Server{rdb: p.Redis, keys: p.KeySpace, q: p.Reads, auth: p.Auth, lim: p.Limits, log: p.Log, m: m,
		hub:      newHub(p.Redis, p.KeySpace, m, p.Log, p.Limits.ACLCheckInterval),
		catchups: newCatchupSlots(p.Limits.MaxCatchups), conns: map[*conn]struct{}{},
		stopSweep: make(chan struct{})}
	s.beats = make([]map[*conn]struct{}, beatCount(p.Limits.PingInterval))
	for i := range s.beats {
		s.beats[i] = map[*conn]struct{}{}
	}
	s.sweeping.Add(1)
	go s.sweep()
	return s
}

// Register adds the stream routes to mux. Both accept ?access_token=,
// since browsers cannot set headers on a WebSocket.
func (s *Server) Register(mux *httpapi.Mux) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(s.auth, s.log, true, fn) }
	mux.Handle("GET /v1/topics/{topic}/stream", h(s.handleTopic))
	mux.Handle("GET /v1/stream", h(s.handleMany))
}

// holdRetry is how often a socket waiting for a seq still in flight reads
// the topic again (the seq is stored, or becomes a recorded gap).
const holdRetry = 50 * time.Millisecond

// The pause before a failed membership check is made again: doubled at
// each failure from the first to the maximum, jittered.
const (
	recheckFirst = 50 * time.Millisecond
	recheckMax   = 2 * time.Second
)

// Refusal reasons of imshard_stream_refused_total.
const (
	refusedMax      = "max_connections"
	refusedStopping = "shutting_down"
)

func (s *Server) handleTopic(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	q := r.URL.Query()
	var cur cursors
	for _, k := range []struct {
		name string
		dst  **int64
	}{{"since", &cur.Since}, {"changes_since", &cur.ChangesSince}} {
		if !q.Has(k.name) {
			continue
		}
		if len(q[k.name]) > 1 {
			return httpapi.Errorf(httpapi.CodeInvalidArgument, k.name+" given twice")
		}
		v, err := readpath.ParseCursor(k.name, q.Get(k.name), 0)
		if err != nil {
			return err
		}
		*k.dst = &v
	}
	topic := r.PathValue("topic")
	if err := s.q.Authorize(r.Context(), p, topic); err != nil {
		return err
	}
	return s.serve(w, r, p, true, map[string]cursors{topic: cur})
}

func (s *Server) handleMany(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	q := r.URL.Query()
	if len(q["topics"]) > 1 {
		return httpapi.Errorf(httpapi.CodeInvalidArgument, "topics given twice: list them comma-separated")
	}
	first := map[string]cursors{}
	if v := q.Get("topics"); v != "" {
		for _, t := range strings.Split(v, ",") {
			if err := routing.ValidTopic(t); err != nil {
				return err
			}
			first[t] = cursors{}
		}
	}
	if len(first) > s.lim.MaxTopics {
		return httpapi.Errorf(httpapi.CodeInvalidArgument, "more topics than stream.max_topics allows")
	}
	return s.serve(w, r, p, false, first)
}

// serve upgrades the request and runs the socket until it ends.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, p httpapi.Principal, single bool, first map[string]cursors) error {
	if !isUpgrade(r) {
		return httpapi.Errorf(httpapi.CodeInvalidArgument, "a WebSocket upgrade request is required (Connection: Upgrade, Upgrade: websocket)")
	}
	if n := s.open.Add(1); n > int64(s.lim.MaxConnections) {
		s.open.Add(-1)
		s.m.refused.WithLabelValues(refusedMax).Inc()
		return httpapi.Errorf(httpapi.CodeUnavailable, "this process holds stream.max_connections sockets: retry (another process may take it)")
	}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		s.open.Add(-1)
		s.m.refused.WithLabelValues(refusedStopping).Inc()
		return httpapi.Errorf(httpapi.CodeUnavailable, "shutting down")
	}
	s.active.Add(1)
	s.mu.Unlock()
	admitted := false
	defer func() {
		if !admitted {
			s.active.Done()
			s.open.Add(-1)
		}
	}()

	// the API server's read and write timeouts are for requests: the
	// upgraded connection keeps none (heartbeats and write_timeout apply)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	ws, nc, err := accept(w, r)
	if err != nil {
		return nil // Accept answered the request
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	c := &conn{s: s, ws: ws, nc: nc, p: p, token: httpapi.Token(r, true), single: single, ctx: ctx, first: first, taken: make(chan struct{}, 1),
		topics: map[string]*follow{}, done: make(chan struct{}), cancel: cancel}
	c.alive()
	s.mu.Lock()
	stopping := s.stopping
	s.trackLocked(c)
	s.mu.Unlock()
	if stopping {
		c.end(websocket.StatusGoingAway, reasonStop)
	}
	// verified again now that a Revalidate sees the socket: a reload that
	// replaced the tenants after the upgrade's check and before the
	// tracking is caught here, one after the tracking by the Revalidate
	c.revalidate()
	s.m.sockets.Inc()
	// the socket runs on in its own goroutine and this request's ends: the
	// HTTP server's per-connection state (request, response, buffers) is
	// not kept for the socket's lifetime
	admitted = true
	go func() {
		defer s.open.Add(-1)
		defer s.active.Done()
		c.run()
		s.m.sockets.Dec()
		s.mu.Lock()
		s.untrackLocked(c)
		s.mu.Unlock()
	}()
	return nil
}

// readLimit bounds one client request (a subscribe of max_topics topics
// with their cursors fits).
const readLimit = 1 << 20

// The buffers of an upgraded connection. The HTTP server's (4 KiB each
// way) would stay with every socket for its lifetime; a socket reads a
// rare small request and writes frames of a few hundred bytes (a longer
// one goes past the buffer straight to the connection).
const (
	socketReadBuffer  = 512
	socketWriteBuffer = 1024
)

// accept upgrades the request to a WebSocket; nc is the connection under
// it, whose write deadline bounds each frame the socket writes (conn.send).
func accept(w http.ResponseWriter, r *http.Request) (*websocket.Conn, net.Conn, error) {
	sb := &smallBuffers{ResponseWriter: w}
	ws, err := websocket.Accept(sb, r, &websocket.AcceptOptions{
		// tokens, never cookies, authenticate: a page of another origin
		// cannot act for a user without the user's token
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, nil, err
	}
	ws.SetReadLimit(readLimit)
	return ws, sb.nc, nil
}

// smallBuffers hands the WebSocket library, at the hijack, buffers of the
// sizes above instead of the HTTP server's, and keeps the connection.
type smallBuffers struct {
	http.ResponseWriter
	nc net.Conn
}

func (w *smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// the upgrade response is on the wire already (net/http flushes it at
	// the hijack); bytes the client sent after its request are read first
	if err := brw.Writer.Flush(); err != nil {
		_ = nc.Close()
		return nil, nil, err
	}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		nc = &prefixConn{Conn: nc, prefix: bytes.Clone(b)}
	}
	w.nc = nc
	return nc, bufio.NewReadWriter(bufio.NewReaderSize(nc, socketReadBuffer), bufio.NewWriterSize(nc, socketWriteBuffer)), nil
}

// prefixConn reads prefix before the connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// The sweep's heartbeat slots: every socket belongs to one, picked at
// random when it opens, and each tick of the sweep pings the sockets of the
// next slot, so each socket is pinged once per ping_interval. A heartbeat
// is work on both ends — two frames written here, read and answered by the
// client — and the heartbeats of one tick all become runnable at once:
// whatever arrives beside them (a send, a publication to fan out) waits
// behind the whole batch. With eight slots, as before, each tick pinged an
// eighth of the process's sockets together: 625 of 5,000 sockets every
// 2.5 s, 1,250 frames and as many goroutines in one burst. With a slot per
// ping_interval/256 (at most one per beatTickMin), a tick pings 20 of them.
const (
	beatSlots   = 256
	beatTickMin = 10 * time.Millisecond
)

// beatCount is how many heartbeat slots a ping interval has: the sweep
// pings one every interval/beatCount.
func beatCount(interval time.Duration) int {
	return int(min(max(interval/beatTickMin, 1), beatSlots))
}

// sweep asks every socket for a heartbeat once per ping_interval, from one
// goroutine and ticker for the process instead of a ticker per socket. A
// socket's first heartbeat comes at a random point of its first interval
// (its slot's next turn) and the next ones an interval apart, so the
// process pings a steady small share of its sockets at every tick even
// when they all opened together (a reconnect storm after a deploy). The
// slot due follows the time elapsed, not the ticks received: a tick the
// runtime dropped on a busy machine delays its slot, never skips it.
func (s *Server) sweep() {
	defer s.sweeping.Done()
	tick := s.lim.PingInterval / time.Duration(len(s.beats))
	t := time.NewTicker(tick)
	defer t.Stop()
	began, done := time.Now(), int64(0)
	for {
		select {
		case <-s.stopSweep:
			return
		case now := <-t.C:
			due := int64(now.Sub(began) / tick)
			s.mu.Lock()
			s.pingLocked(done, due)
			s.mu.Unlock()
			done = max(done, due)
		}
	}
}

// trackLocked adds a socket to the process's and to a heartbeat slot;
// s.mu is held.
func (s *Server) trackLocked(c *conn) {
	s.conns[c] = struct{}{}
	c.beat = rand.N(len(s.beats))
	s.beats[c.beat][c] = struct{}{}
}

func (s *Server) untrackLocked(c *conn) {
	delete(s.conns, c)
	delete(s.beats[c.beat], c)
}

// pingLocked asks the sockets of the heartbeat slots from (included) to
// (excluded), counted since the sweep began, for a heartbeat; s.mu is held.
func (s *Server) pingLocked(from, to int64) {
	for n := from; n < to; n++ {
		for c := range s.beats[n%int64(len(s.beats))] {
			c.pingDue.Store(true)
			c.wake()
		}
	}
}

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") &&
		strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade")
}

// Close ends every socket with 1001 and waits for them (until ctx ends),
// then the hub's subscriptions.
func (s *Server) Close(ctx context.Context) {
	s.mu.Lock()
	s.stopping = true
	for c := range s.conns {
		c.end(websocket.StatusGoingAway, reasonStop)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn().Msg("stream: sockets still closing at the end of the shutdown grace")
	}
	close(s.stopSweep)
	s.sweeping.Wait()
	s.hub.close()
}

// Revalidate ends every socket whose token no longer verifies — its tenant
// is gone, or its jwt_secret changed — with 1008 "credentials revoked".
// The caller runs it once the tenant list the credentials are verified
// against was replaced.
func (s *Server) Revalidate() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.revalidate()
	}
}

// acquire takes a catch-up slot (stream.max_catchups) for the socket's
// user, waiting its turn (catchupSlots); ok is false when ctx ended first.
func (s *Server) acquire(ctx context.Context, p httpapi.Principal) (release func(), ok bool) {
	release, waited, ok := s.catchups.acquire(ctx, userKey{p.Tenant, p.UserID})
	if waited {
		s.m.catchupShareWaits.Inc()
	}
	return release, ok
}

// lastIssued is the topic's last issued seq (0 if none or unknown): how
// far a topic reads storage before it is caught up (follow.seen).
func (s *Server) lastIssued(ctx context.Context, tenant, topic string) (int64, error) {
	keys, err := s.keys.Tenant(tenant)
	if err != nil {
		return 0, err
	}
	n, err := s.rdb.Do(ctx, s.rdb.B().Get().Key(keys.Seq(topic)).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return n, err
}
