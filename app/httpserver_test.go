package app

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
)

// serveHTTP runs an httpServer with the given timeouts and caps (nil:
// none) on a free port until the test ends and returns its address.
func serveHTTP(t *testing.T, c config.HTTP, limits *connLimits, h http.Handler) string {
	t.Helper()
	a := &App{Log: zerolog.Nop()}
	svc, err := newHTTPServer("127.0.0.1:0", h, c, limits, a)
	if err != nil {
		t.Fatal(err)
	}
	s := svc.(*httpServer)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Stop(sctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Run: %v", err)
		}
	})
	return s.Addr()
}

func shortTimeouts() config.HTTP {
	return config.HTTP{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 600 * time.Millisecond,
		WriteTimeout: 10 * time.Second, IdleTimeout: 300 * time.Millisecond}
}

// readAll reads conn until the server closes it (or the generous test
// deadline passes, which fails the test) and returns what came.
func readUntilClosed(t *testing.T, conn net.Conn) string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open; got %q", b)
	}
	return string(b)
}

// trickle writes s one byte per tick until the connection breaks or s is
// done; it reports how many bytes went out.
func trickle(conn net.Conn, s string, tick time.Duration) <-chan int {
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < len(s); n++ {
			if _, err := conn.Write([]byte{s[n]}); err != nil {
				break
			}
			time.Sleep(tick)
		}
		sent <- n
	}()
	return sent
}

// A client sending its body (or its headers) one byte at a time is cut
// off once the read timeout passes: it cannot hold a connection for longer
// than that, whatever it sends.
func TestHTTPSlowClientsAreCutOff(t *testing.T) {
	var served atomic.Int64
	addr := serveHTTP(t, shortTimeouts(), nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "slow", http.StatusBadRequest)
			return
		}
		served.Add(1)
	}))
	// 1000 bytes at one per 20 ms would take 20 s
	body := strings.Repeat("x", 1000)
	for name, req := range map[string][2]string{
		"slow body":    {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", body},
		"slow headers": {"GET / HTTP/1.1\r\n", "X-Slow: " + body + "\r\n\r\n"},
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte(req[0])); err != nil {
				t.Fatal(err)
			}
			sent := trickle(conn, req[1], 20*time.Millisecond)
			got := readUntilClosed(t, conn)
			_ = conn.Close()
			if n := <-sent; n == len(req[1]) {
				t.Fatalf("the whole slow request went through; answer %q", got)
			}
			if strings.Contains(got, "200 OK") {
				t.Fatalf("a slow request was served: %q", got)
			}
		})
	}
	if served.Load() != 0 {
		t.Fatalf("%d slow requests reached the handler's end", served.Load())
	}
}

// An idle keep-alive connection is closed after the idle timeout.
func TestHTTPIdleKeepAliveClosed(t *testing.T) {
	addr := serveHTTP(t, shortTimeouts(), nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("first request: %d, close %v", resp.StatusCode, resp.Close)
	}
	// nothing more is sent: the server must hang up by itself
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if b, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %q, %v; want the server to close it", b, err)
	}
}

// Past http.max_conns, a connection is not served until a held one closes.
func TestHTTPConnectionCap(t *testing.T) {
	c := shortTimeouts()
	c.IdleTimeout = time.Minute // held connections stay until the test closes them
	open := prometheus.NewGauge(prometheus.GaugeOpts{Name: "open"})
	addr := serveHTTP(t, c, &connLimits{max: 2, open: open}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	get := func(conn net.Conn, br *bufio.Reader) error {
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	var held []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := get(conn, bufio.NewReader(conn)); err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(open)
	if mfs, err := reg.Gather(); err != nil || mfs[0].GetMetric()[0].GetGauge().GetValue() != 2 {
		t.Fatalf("open connections %v, %v; want 2", mfs, err)
	}
	third, err := net.Dial("tcp", addr) // the kernel's accept queue takes it
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	br := bufio.NewReader(third)
	if _, err := io.WriteString(third, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = third.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection was answered while two were held: %v", err)
	}
	held[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the third connection, once a slot freed: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("third: %d", resp.StatusCode)
	}
}

// Past http.max_conns_per_client, one more connection of the same client
// address is answered 429 rate_limited and closed at once, counted, while
// another client is served; a held connection closed frees its place.
func TestHTTPConnectionCapPerClient(t *testing.T) {
	c := shortTimeouts()
	c.IdleTimeout = time.Minute
	refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"})
	addr := serveHTTP(t, c, &connLimits{max: 4, perClient: 2, refused: refused}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	get := func(from string) (net.Conn, *http.Response) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("from %s: %v", from, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Header.Set("X-Body", string(body))
		return conn, resp
	}
	first, resp := get("127.0.0.1")
	if resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	if _, resp := get("127.0.0.1"); resp.StatusCode != 200 {
		t.Fatalf("second: %d", resp.StatusCode)
	}
	_, resp = get("127.0.0.1")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(resp.Header.Get("X-Body"), `"code":"rate_limited"`) {
		t.Fatalf("third of one client: %d %v", resp.StatusCode, resp.Header)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(refused)
	if mfs, err := reg.Gather(); err != nil || mfs[0].GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Fatalf("refused connections %v, %v; want 1", mfs, err)
	}
	if _, resp := get("127.0.0.2"); resp.StatusCode != 200 {
		t.Fatalf("another client: %d", resp.StatusCode)
	}
	first.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, resp := get("127.0.0.1"); resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection did not free its client's place")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A hijacked connection (an upgraded WebSocket) no longer takes one of the
// max_conns slots: with a cap of 1, a second client is answered while the
// first connection is held hijacked.
func TestHTTPHijackedLeavesTheCap(t *testing.T) {
	c := shortTimeouts()
	held := make(chan net.Conn, 1)
	addr := serveHTTP(t, c, &connLimits{max: 1}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hijack" {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				held <- conn
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	first, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := io.WriteString(first, "GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	conn := <-held
	defer conn.Close()
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("a request while the only slot's connection is hijacked: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// A long-lived route lifts its own connection's deadlines and streams past
// the write timeout (the way a WebSocket route is meant to).
func TestHTTPLongLivedRouteLiftsDeadlines(t *testing.T) {
	c := shortTimeouts()
	c.WriteTimeout = 300 * time.Millisecond
	const chunks = 8 // 8 × 100 ms: well past the write timeout
	addr := serveHTTP(t, c, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.URL.Path == "/stream" {
			_ = rc.SetReadDeadline(time.Time{})
			_ = rc.SetWriteDeadline(time.Time{})
		}
		for i := range chunks {
			if _, err := fmt.Fprintf(w, "chunk %d\n", i); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}))
	count := func(path string) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Count(string(b), "chunk")
	}
	if n := count("/stream"); n != chunks {
		t.Fatalf("a route that lifted its deadlines got %d of %d chunks out", n, chunks)
	}
	if n := count("/plain"); n == chunks {
		t.Fatal("a plain route streamed past the write timeout")
	}
}
