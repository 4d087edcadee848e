package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imshard/imshard/config"
)

func initOps(ctx context.Context, a *App) (Service, error) {
	// probes and scrapes must get through while the API is saturated: no
	// connection cap here, the same timeouts
	return newHTTPServer(a.Config.Metrics.Addr, a.opsHandler(), a.Config.HTTP, 0, nil, a)
}

func initAPI(ctx context.Context, a *App) (Service, error) {
	open := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "imshard_http_open_connections",
		Help: "Connections the API server holds open (at most http.max_conns; more wait to be accepted).",
	})
	if err := a.Registry.Register(open); err != nil {
		return nil, err
	}
	return newHTTPServer(a.Config.HTTP.Addr, a.APIMux, a.Config.HTTP, a.Config.HTTP.MaxConns, open, a)
}

// httpServer listens at start (so a taken port fails start-up) and drains
// in-flight requests on Stop.
//
// What a slow or idle client may cost is bounded by the http.* timeouts:
// headers within read_header_timeout, the whole request within
// read_timeout, the handler and its answer within write_timeout, and a
// keep-alive connection closes after idle_timeout without a request; the
// API accepts at most max_conns connections at once. A long-lived route (a
// WebSocket or event stream) must lift the read and write deadlines of its
// own connection before it upgrades or streams:
//
//	rc := http.ResponseController(w)
//	_ = rc.SetReadDeadline(time.Time{})
//	_ = rc.SetWriteDeadline(time.Time{})
//
// (TestHTTPLongLivedRouteLiftsDeadlines shows it working) and keep its own
// liveness checks (pings) instead.
type httpServer struct {
	srv *http.Server
	ln  net.Listener
}

// newHTTPServer listens on addr; maxConns > 0 caps the connections held
// at once, counted in open (if set).
func newHTTPServer(addr string, h http.Handler, c config.HTTP, maxConns int, open prometheus.Gauge, a *App) (Service, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if maxConns > 0 {
		ln = newLimitListener(ln, maxConns, open)
	}
	a.Log.Info().Str("addr", ln.Addr().String()).Msg("listening")
	return &httpServer{ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
	}}, nil
}

func (s *httpServer) Run(ctx context.Context) error {
	err := s.srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *httpServer) Stop(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Addr is where the server listens (useful with port 0 in tests).
func (s *httpServer) Addr() string { return s.ln.Addr().String() }

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
