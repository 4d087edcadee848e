package app

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener accepts at most cap(slots) connections at once: past that,
// Accept waits until one of them closes, and new clients wait in the
// kernel's accept queue (their connect succeeds; their request is read
// once a slot frees). With perClient > 0 it also holds at most that many
// of one client address: one more is answered 429 and closed at once, so
// that one client cannot take every slot and leave the others waiting.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	open      prometheus.Gauge
	refused   prometheus.Counter // connections over perClient
	closed    chan struct{}
	closeOnce sync.Once

	perClient int
	mu        sync.Mutex
	clients   map[string]int // connections held per client address
}

func newLimitListener(ln net.Listener, n, perClient int, open prometheus.Gauge, refused prometheus.Counter) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), open: open, refused: refused, closed: make(chan struct{}),
		perClient: perClient, clients: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		client := clientOf(c)
		if !l.admit(client) {
			<-l.slots
			if l.refused != nil {
				l.refused.Inc()
			}
			go refuseConn(c)
			continue
		}
		if l.open != nil {
			l.open.Inc()
		}
		return &limitConn{Conn: c, l: l, client: client}, nil
	}
}

// clientOf is the address a connection comes from (its IP, any port).
func clientOf(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// admit counts one more connection of client unless it holds perClient.
func (l *limitListener) admit(client string) bool {
	if l.perClient <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients[client] >= l.perClient {
		return false
	}
	l.clients[client]++
	return true
}

func (l *limitListener) leave(client string) {
	if l.perClient <= 0 {
		return
	}
	l.mu.Lock()
	if l.clients[client]--; l.clients[client] <= 0 {
		delete(l.clients, client)
	}
	l.mu.Unlock()
}

// tooManyConns is the answer to a connection over the per-client cap,
// written before its request is read: the envelope of 429 rate_limited.
var tooManyConns = func() []byte {
	body := `{"error":{"code":"rate_limited","message":"this client holds as many connections as http.max_conns_per_client allows; reuse one","details":{"scope":"connections","retry_after_ms":1000}}}` + "\n"
	return []byte("HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// refuseLinger bounds how long a refused connection is read and dropped
// after its answer: closing with the client's request unread would reset
// the connection, and the reset can destroy the answer before the client
// reads it.
const refuseLinger = time.Second

// refuseConn answers 429 and closes, reading what the client sent
// meanwhile (bounded by refuseLinger).
func refuseConn(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseLinger))
	if _, err := c.Write(tooManyConns); err != nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, c)
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its slot back when closed or hijacked (once).
type limitConn struct {
	net.Conn
	l      *limitListener
	client string
	once   sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// release gives the slot back. A hijacked connection (an upgraded
// WebSocket) releases it at once: long-lived sockets are counted by their
// own limit (stream.max_connections), not the HTTP connection cap.
func (c *limitConn) release() {
	c.once.Do(func() {
		c.l.leave(c.client)
		<-c.l.slots
		if c.l.open != nil {
			c.l.open.Dec()
		}
	})
}

// releaseHijacked is the http.Server ConnState hook that frees the slot of
// a hijacked connection.
func releaseHijacked(c net.Conn, state http.ConnState) {
	if lc, ok := c.(*limitConn); ok && state == http.StateHijacked {
		lc.release()
	}
}
