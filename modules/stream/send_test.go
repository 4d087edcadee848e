package stream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// socketPair serves one WebSocket and returns the server's side of it (a
// socket whose Server holds only limits and metrics) and the client's.
func socketPair(t testing.TB, lim Limits) (*conn, *websocket.Conn) {
	accepted := make(chan *conn, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, nc, err := accept(w, r)
		if err != nil {
			return
		}
		accepted <- &conn{s: &Server{lim: lim, m: newMetrics(nil)}, ws: ws, nc: nc, done: make(chan struct{})}
	}))
	t.Cleanup(hs.Close)
	client, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	t.Cleanup(func() {
		c.end(websocket.StatusGoingAway, reasonStop)
		_ = client.CloseNow()
	})
	return c, client
}

// A write the peer does not take within write_timeout ends the socket:
// the connection's write deadline bounds it.
func TestSendStalledWriteEnds(t *testing.T) {
	c, _ := socketPair(t, Limits{WriteTimeout: 100 * time.Millisecond})
	frame := []byte(strings.Repeat("x", 64<<10))
	ended := make(chan int, 1)
	go func() {
		// the client never reads: the socket buffers fill, then a write stalls
		n := 1
		for c.send(frame, time.Time{}) {
			n++
		}
		ended <- n
	}()
	select {
	case n := <-ended:
		t.Logf("the write of frame %d stalled and ended the socket", n)
	case <-time.After(2 * time.Minute):
		t.Fatal("a write to a client that does not read never ended")
	}
	select {
	case <-c.done:
	default:
		t.Fatal("the socket is not ended after its write failed")
	}
}

// The write deadline is lifted after each frame: a socket idle for longer
// than write_timeout still sends its close frame.
func TestSendDeadlineCleared(t *testing.T) {
	c, client := socketPair(t, Limits{WriteTimeout: 50 * time.Millisecond})
	if !c.send(pingFrame, time.Time{}) {
		t.Fatal("send failed")
	}
	if _, b, err := client.Read(context.Background()); err != nil || string(b) != string(pingFrame) {
		t.Fatalf("read %q, %v", b, err)
	}
	time.Sleep(4 * c.s.lim.WriteTimeout) // the frame's deadline is long past
	c.end(websocket.StatusGoingAway, reasonStop)
	_, _, err := client.Read(context.Background())
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != reasonStop {
		t.Fatalf("read after close: %v, want 1001 %q", err, reasonStop)
	}
}

// BenchmarkSend measures the allocations of writing one frame to a socket
// (the client reads and discards).
func BenchmarkSend(b *testing.B) {
	c, client := socketPair(b, Limits{WriteTimeout: 5 * time.Second})
	go func() {
		for {
			_, r, err := client.Reader(context.Background())
			if err != nil {
				return
			}
			if _, err := io.Copy(io.Discard, r); err != nil {
				return
			}
		}
	}()
	frame := []byte(`{"type":"message","message":{"topic":"t","seq":1,"body":"` + strings.Repeat("x", 200) + `"}}`)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if !c.send(frame, time.Time{}) {
			b.Fatal("send failed")
		}
	}
}
