package app

import (
	"net"
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

// limitConn gives its slot back when closed (once, however often Close is
// called).
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		<-c.l.slots
		if c.l.open != nil {
			c.l.open.Dec()
		}
	})
	return err
}
