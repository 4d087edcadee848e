package test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// stFrame is any frame of the realtime stream.
type stFrame struct {
	Type      string          `json:"type"`
	Topic     string          `json:"topic"`
	Message   message.Message `json:"message"`
	Change    message.Change  `json:"change"`
	From      int64           `json:"from_seq"`
	To        int64           `json:"to_seq"`
	Seq       int64           `json:"seq"`
	ChangeSeq int64           `json:"change_seq"`
	Code      string          `json:"code"`
	Detail    string          `json:"detail"`
}

// stClient is one socket of a test.
type stClient struct {
	t  testing.TB
	ws *websocket.Conn
}

// stStart runs every role (the stream is the query role's) for a test.
func stStart(t *testing.T, opts harness.Options) *sendEnv {
	t.Helper()
	if len(opts.Roles) == 0 {
		opts.Roles = []string{"all"}
	}
	return startSend(t, opts)
}

// stDial opens path (with its query) as token; a refused upgrade is the
// response's status. rcvbuf > 0 shrinks the client's socket buffer.
func stDial(t testing.TB, e *harness.Env, path, token string, rcvbuf int) (*stClient, int, error) {
	t.Helper()
	opts := &websocket.DialOptions{}
	if token != "" {
		opts.HTTPHeader = http.Header{"Authorization": {"Bearer " + token}}
	}
	if rcvbuf > 0 {
		d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}}
		opts.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.BaseURL, "http")+path, opts)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return nil, status, err
	}
	ws.SetReadLimit(1 << 22)
	c := &stClient{t: t, ws: ws}
	t.Cleanup(func() { _ = ws.CloseNow() })
	return c, http.StatusSwitchingProtocols, nil
}

// stMustDial opens a socket that must be accepted.
func stMustDial(t testing.TB, e *harness.Env, path, token string) *stClient {
	t.Helper()
	c, status, err := stDial(t, e, path, token, 0)
	if err != nil {
		t.Fatalf("dial %s: %d %v", path, status, err)
	}
	return c
}

// next reads the next frame other than a ping; err is the socket's end.
func (c *stClient) next() (stFrame, error) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, b, err := c.ws.Read(ctx)
		cancel()
		if err != nil {
			return stFrame{}, err
		}
		var f stFrame
		if err := json.Unmarshal(b, &f); err != nil {
			c.t.Fatalf("frame %q: %v", b, err)
		}
		if f.Type != "ping" {
			return f, nil
		}
	}
}

// must reads the next frame, which must be of type typ.
func (c *stClient) must(typ string) stFrame {
	c.t.Helper()
	f, err := c.next()
	if err != nil {
		c.t.Fatalf("waiting for a %s frame: %v", typ, err)
	}
	if f.Type != typ {
		c.t.Fatalf("frame %+v, want type %s", f, typ)
	}
	return f
}

// closed reads until the socket ends and returns its close status and
// reason (-1 when it ended without a close frame).
func (c *stClient) closed() (websocket.StatusCode, string) {
	c.t.Helper()
	for {
		_, err := c.next()
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code, ce.Reason
		}
		return -1, err.Error()
	}
}

func (c *stClient) write(v any) {
	c.t.Helper()
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatal(err)
	}
}
