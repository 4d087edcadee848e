package app

import (
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener accepts at most cap(slots) connections at once: past that,
// Accept waits until one of them closes, and new clients wait in the
// kernel's accept queue (their connect succeeds; their request is read
// once a slot frees).
type limitListener struct {
	net.Listener
	slots     chan struct{}
	open      prometheus.Gauge
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int, open prometheus.Gauge) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), open: open, closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
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
	if l.open != nil {
		l.open.Inc()
	}
	return &limitConn{Conn: c, l: l}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its slot back when closed or hijacked (once).
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
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
