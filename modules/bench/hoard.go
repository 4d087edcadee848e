package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/modules/httpapi"
)

// The stages of the hoard phase Mark is called at.
const (
	StageHoardBefore = "hoard-before"
	StageHoardDuring = "hoard-during"
)

// HoardReport is what the hoard phase measured: one member's sockets that
// catch up a long history and never read, against another user's catch-up
// and the process's readiness.
type HoardReport struct {
	Hoarders      int   // sockets asked for
	Opened        int   // of them, upgraded (the rest were refused)
	HistoryBytes  int64 // content bytes of the history each catches up
	HistoryMsgs   int
	VictimBefore  StreamLatency // another user's catch-up of a small topic, before the hoarders open
	VictimDuring  StreamLatency // the same, while they hold their sockets
	ReadyChecks   int           // /readyz answers while the hoarders held their sockets
	ReadyFailures int           // of them, not 200
}

// hoard runs the hoard phase on the first tenant: a topic with
// p.HoardBytes of history, p.Hoarders sockets of one member catching it up
// from seq 0 without reading a frame, and another user's catch-up of a
// small topic timed before and while they hold on (the victim), with the
// server's memory marked around it and /readyz polled meanwhile.
func hoard(ctx context.Context, p StreamParams, c streamClient, mark func(string) error) (HoardReport, error) {
	t := p.Tenants[0]
	svc := c.token(t, 1, httpapi.RoleService)
	rep := HoardReport{Hoarders: p.Hoarders}
	for _, g := range []struct {
		topic, group string
		members      []int
	}{{"bsthoard", "900000", []int{1, hoarderUser}}, {"bstvictim", "900001", []int{1, victimUser}}} {
		if err := c.do(ctx, "PUT", "/v1/topics/"+g.topic, svc, map[string]any{"group_id": g.group, "name": g.topic, "status": "active"}); err != nil {
			return rep, err
		}
		for _, m := range g.members {
			if err := c.do(ctx, "PUT", "/v1/topics/"+g.topic+"/members/"+strconv.Itoa(m), svc, map[string]any{"role": "member"}); err != nil {
				return rep, err
			}
		}
	}
	text := strings.Repeat("h", hoardMessageBytes)
	n := int(max(1, p.HoardBytes/hoardMessageBytes))
	p.progress("stream bench: hoard phase, writing %d messages (%d MB) of history", n, p.HoardBytes>>20)
	sender := c.token(t, 1, "")
	if err := parallel(ctx, 32, n, func(i int) error {
		return c.do(ctx, "POST", "/v1/topics/bsthoard/messages", sender, map[string]any{
			"client_msg_id": "hoard" + strconv.Itoa(i), "msg_type": "text", "content": map[string]any{"text": text}})
	}); err != nil {
		return rep, err
	}
	if err := parallel(ctx, 8, victimMessages, func(i int) error {
		return c.do(ctx, "POST", "/v1/topics/bstvictim/messages", sender, map[string]any{
			"client_msg_id": "victim" + strconv.Itoa(i), "msg_type": "text", "content": map[string]any{"text": "v" + strconv.Itoa(i)}})
	}); err != nil {
		return rep, err
	}
	rep.HistoryMsgs, rep.HistoryBytes = n, int64(n)*hoardMessageBytes
	victim := func(name string) (StreamLatency, error) {
		var l latencies
		for range victimRuns {
			d, err := c.catchUp(ctx, t, "bstvictim", victimUser, victimMessages)
			if err != nil {
				return StreamLatency{}, err
			}
			l.add(d)
		}
		return l.report(name), nil
	}
	// every message stored before the victim's first catch-up: the
	// baseline is a catch-up, not a wait for persist
	if _, err := c.catchUp(ctx, t, "bsthoard", hoarderUser, n); err != nil {
		return rep, err
	}
	var err error
	if rep.VictimBefore, err = victim("victim catch-up before"); err != nil {
		return rep, err
	}
	if err := mark(StageHoardBefore); err != nil {
		return rep, err
	}
	p.progress("stream bench: hoard phase, %d sockets of one member catch up %d MB without reading", p.Hoarders, p.HoardBytes>>20)
	var socks []*websocket.Conn
	var mu sync.Mutex
	defer func() {
		for _, ws := range socks {
			_ = ws.CloseNow()
		}
	}()
	_ = parallel(ctx, 16, p.Hoarders, func(int) error {
		ws, _, err := websocket.Dial(ctx, c.ws+"/v1/topics/bsthoard/stream?since=0", &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": {"Bearer " + c.token(t, hoarderUser, "")}}})
		if err == nil {
			mu.Lock()
			socks = append(socks, ws)
			mu.Unlock()
		}
		return nil // a refusal is counted, not an error
	})
	rep.Opened = len(socks)
	var checks, failures atomic.Int64
	pctx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pctx.Err() == nil {
			checks.Add(1)
			if !c.ready(pctx, p.OpsURL) && pctx.Err() == nil {
				failures.Add(1)
			}
			sleepUntil(pctx, time.Now().Add(100*time.Millisecond))
		}
	}()
	sleepUntil(ctx, time.Now().Add(hoardSettle)) // the hoarders' catch-ups fill what they can
	rep.VictimDuring, err = victim("victim catch-up while hoarded")
	if err == nil {
		err = mark(StageHoardDuring)
	}
	stopPoll()
	<-polled
	rep.ReadyChecks, rep.ReadyFailures = int(checks.Load()), int(failures.Load())
	return rep, err
}

// The hoard phase's shape.
const (
	hoarderUser       = 9000
	victimUser        = 9001
	hoardMessageBytes = 8 << 10
	victimMessages    = 100
	victimRuns        = 5
	hoardSettle       = 5 * time.Second
)

// streamClient is the bench clients' HTTP and WebSocket side.
type streamClient struct {
	hc   *http.Client
	base string // http://host:port of the API
	ws   string // the same as ws://
}

func newStreamClient(base string) streamClient {
	return streamClient{hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second},
		base: base, ws: "ws" + strings.TrimPrefix(base, "http")}
}

// token signs a day-long token of the bench tenant.
func (streamClient) token(t StreamTenant, uid int64, role string) string {
	s, _ := httpapi.Sign(t.Secret, t.ID, uid, role, 24*time.Hour)
	return s
}

// do sends a JSON request and fails on an answer that is not 2xx.
func (c streamClient) do(ctx context.Context, method, url, token string, body any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, method, c.base+url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, raw.Bytes())
	}
	return nil
}

// ready reports whether ops answers /readyz 200.
func (c streamClient) ready(ctx context.Context, ops string) bool {
	req, err := http.NewRequestWithContext(ctx, "GET", ops+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// catchUp opens a socket of user on topic from seq 0 and times it until
// the message of seq last arrived.
func (c streamClient) catchUp(ctx context.Context, t StreamTenant, topic string, user int64, last int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	at := time.Now()
	ws, _, err := websocket.Dial(ctx, c.ws+"/v1/topics/"+topic+"/stream?since=0", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + c.token(t, user, "")}}})
	if err != nil {
		return 0, err
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	want := []byte(`,"seq":` + strconv.Itoa(last) + `,`)
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("catching up %s as %d: %w", topic, user, err)
		}
		if bytes.HasPrefix(b, []byte(`{"type":"message"`)) && bytes.Contains(b, want) {
			return time.Since(at), nil
		}
	}
}
