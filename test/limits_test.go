package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// slow is a bucket that refills so slowly (one send per 1,000 s) that
// nothing refills during a test: its decisions depend on the count of
// sends alone.
func slow(burst int) config.Rate { return config.Rate{PerSecond: 0.001, Burst: burst} }

// limitsSend sends as token and returns the status, the body's error code,
// details and the header fields.
func (e *sendEnv) limitsSend(token, topic, clientMsgID string) (int, string, map[string]any, http.Header) {
	e.T.Helper()
	code, raw, h := e.DoHeader("POST", "/v1/topics/"+url.PathEscape(topic)+"/messages", token, sendBody(clientMsgID, "hi"))
	var out struct {
		Error struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		e.T.Fatalf("send: %d %q: %v", code, raw, err)
	}
	return code, out.Error.Code, out.Error.Details, h
}

// tenantState is every Redis key of the tenant with its DUMP: what a
// refused send must leave as it was.
func (e *sendEnv) tenantState() map[string]string {
	e.T.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var cursor uint64
	for {
		sc, err := e.Redis.Do(ctx, e.Redis.B().Scan().Cursor(cursor).Match(e.Keys().TenantPattern()).Count(1000).Build()).AsScanEntry()
		if err != nil {
			e.T.Fatal(err)
		}
		for _, k := range sc.Elements {
			v, err := e.Redis.Do(ctx, e.Redis.B().Dump().Key(k).Build()).ToString()
			if err != nil {
				e.T.Fatalf("dump %s: %v", k, err)
			}
			out[k] = v
		}
		if cursor = sc.Cursor; cursor == 0 {
			return out
		}
	}
}

// TestSendRateLimit: a user's send bucket lets its burst through, each 201
// carrying the policy and the sends left; the next send is 429
// rate_limited with Retry-After (whole seconds, rounded up),
// details.retry_after_ms and the RateLimit fields, counted per tenant and
// scope — and it changed nothing in Redis: no claim, no seq, no bucket
// state. A retry of an accepted send is answered from its record, not
// charged.
func TestSendRateLimit(t *testing.T) {
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.Limits.Send.User = slow(3) }})
	e.groupOfUsers("lim", 2)
	tok := e.Token(1, "")
	for i := range 3 {
		code, _, _, h := e.limitsSend(tok, "lim", fmt.Sprintf("m%d", i))
		if code != 201 {
			t.Fatalf("send %d: %d", i, code)
		}
		if got := h.Get("RateLimit-Policy"); got != `"user";q=3;w=3000` {
			t.Errorf("send %d: RateLimit-Policy %q", i, got)
		}
		if got, want := h.Get("RateLimit"), fmt.Sprintf(`"user";r=%d;t=`, 2-i); !strings.HasPrefix(got, want) {
			t.Errorf("send %d: RateLimit %q, want %s…", i, got, want)
		}
	}
	before := e.tenantState()
	code, errCode, details, h := e.limitsSend(tok, "lim", "m3")
	if code != 429 || errCode != "rate_limited" {
		t.Fatalf("4th send: %d %s, want 429 rate_limited", code, errCode)
	}
	retry, err := strconv.Atoi(h.Get("Retry-After"))
	ms, _ := details["retry_after_ms"].(float64)
	if err != nil || retry < 999 || retry > 1000 || ms <= 998_000 || ms > 1_000_000 || float64(retry) < ms/1000 {
		t.Errorf("Retry-After %q, retry_after_ms %v: want about 1000 s, the header rounded up", h.Get("Retry-After"), details["retry_after_ms"])
	}
	if details["scope"] != "user" {
		t.Errorf("details.scope %v, want user", details["scope"])
	}
	if got, want := h.Get("RateLimit"), fmt.Sprintf(`"user";r=0;t=%d`, retry); got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if got := h.Get("RateLimit-Policy"); got != `"user";q=3;w=3000` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if after := e.tenantState(); !maps.Equal(before, after) {
		t.Errorf("a refused send changed Redis:\nbefore %v\nafter  %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
	if n := limited(t, e.Env, "user"); n != 1 {
		t.Errorf("imshard_rate_limited_total{scope=user} = %v, want 1", n)
	}
	// a retry of an accepted send: answered from its record, not charged
	if code, _, _, _ := e.limitsSend(tok, "lim", "m0"); code != 200 {
		t.Errorf("retry of an accepted send: %d, want 200 (duplicate)", code)
	}
	// another user has a bucket of its own
	if code, _, _, _ := e.limitsSend(e.Token(2, ""), "lim", "n0"); code != 201 {
		t.Errorf("another user's send: %d, want 201", code)
	}
	// a reload applies the limits at once: the bucket off, the send passes
	e.Reload(func(c *config.Config) { c.Limits.Send.User = config.Rate{} })
	if code, _, _, h := e.limitsSend(tok, "lim", "m3"); code != 201 || h.Get("RateLimit") != "" {
		t.Errorf("after the reload turned the limit off: %d, RateLimit %q", code, h.Get("RateLimit"))
	}
}

// TestSendRateLimitTopicAndTenant: the topic's bucket is shared by its
// senders and the tenant's by every topic; a tenant's own limits replace
// the defaults bucket by bucket, and the tightest bucket is the one the
// RateLimit field names.
func TestSendRateLimitTopicAndTenant(t *testing.T) {
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) {
		c.Limits.Send.Topic = slow(2)
		c.Tenants[0].Limits.Send.Tenant = &config.Rate{PerSecond: 0.001, Burst: 3}
	}})
	e.groupOfUsers("ta", 2)
	e.groupOfUsers("tb", 2)
	steps := []struct {
		user  int64
		topic string
		code  int
		state string // RateLimit's prefix
	}{
		{1, "ta", 201, `"topic";r=1;`}, // tenant r=2, topic r=1
		{2, "ta", 201, `"topic";r=0;`}, // tenant r=1, topic r=0
		{1, "ta", 429, `"topic";r=0;`}, // the topic's bucket is empty
		{1, "tb", 201, `"tenant";r=0;`},
		{2, "tb", 429, `"tenant";r=0;`}, // the tenant's is
	}
	for i, s := range steps {
		code, _, details, h := e.limitsSend(e.Token(s.user, ""), s.topic, fmt.Sprintf("s%d", i))
		if code != s.code || !strings.HasPrefix(h.Get("RateLimit"), s.state) {
			t.Errorf("step %d: %d %v RateLimit %q, want %d %s…", i, code, details, h.Get("RateLimit"), s.code, s.state)
		}
		if got, want := h.Get("RateLimit-Policy"), `"tenant";q=3;w=3000, "topic";q=2;w=2000`; got != want {
			t.Errorf("step %d: RateLimit-Policy %q, want %q", i, got, want)
		}
	}
	if limited(t, e.Env, "topic") != 1 || limited(t, e.Env, "tenant") != 1 {
		t.Errorf("refusals counted: topic %v, tenant %v; want 1 each", limited(t, e.Env, "topic"), limited(t, e.Env, "tenant"))
	}
}

// TestSendRateLimitAcrossProcesses: two send processes of one tenant share
// a user's bucket exactly: its burst passes once, whichever process takes
// each send.
func TestSendRateLimitAcrossProcesses(t *testing.T) {
	mutate := func(c *config.Config) { c.Limits.Send.User = slow(4) }
	a := startSend(t, harness.Options{Mutate: mutate})
	b := startSend(t, harness.Options{Tenant: a.Tenant, Brokers: a.Config.Kafka.Brokers, Mutate: mutate})
	a.groupOfUsers("x", 1)
	tok := a.Token(1, "")
	for i := range 6 {
		node := a
		if i%2 == 1 {
			node = b
		}
		code, _, _, _ := node.limitsSend(tok, "x", fmt.Sprintf("p%d", i))
		if want := map[bool]int{true: 201, false: 429}[i < 4]; code != want {
			t.Errorf("send %d (process %d): %d, want %d", i, i%2, code, want)
		}
	}
}

// limited is imshard_rate_limited_total of the scope.
func limited(t *testing.T, e *harness.Env, scope string) float64 {
	t.Helper()
	return rpMetric(t, e, "imshard_rate_limited_total", "tenant="+e.Tenant, "scope="+scope)
}

// TestReadAndChangeRateLimits: a user's reads and changes each have a
// bucket of their own in the process: past it a request is 429
// rate_limited with the same fields as a send's, another user is not
// affected, and a reload changes the limits at once.
func TestReadAndChangeRateLimits(t *testing.T) {
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) {
		c.Limits.Reads = slow(2)
		c.Limits.Changes = slow(1)
	}})
	e.groupOfUsers("rc", 2)
	e.mustSend(e.Token(1, ""), "rc", sendBody("a", "hi"))
	tok := e.Token(1, "")
	for i := range 2 {
		if code, _ := e.Do("GET", "/v1/topics/rc/messages", tok, nil); code != 200 {
			t.Fatalf("read %d: %d", i, code)
		}
	}
	for _, c := range []struct {
		method, path string
		body         any
		scope        string
		policy       string
	}{
		{"GET", "/v1/me/unread", nil, "reads", `"reads";q=2;w=2000`},
		{"PUT", "/v1/topics/rc/read", map[string]any{"seq": 1}, "", ""},
		{"PUT", "/v1/topics/rc/read", map[string]any{"seq": 1}, "changes", `"changes";q=1;w=1000`},
	} {
		code, raw, h := e.DoHeader(c.method, c.path, tok, c.body)
		if c.scope == "" {
			if code != 200 {
				t.Errorf("%s %s: %d %s", c.method, c.path, code, raw)
			}
			continue
		}
		var out struct {
			Error struct {
				Code    string         `json:"code"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &out)
		retry, _ := strconv.Atoi(h.Get("Retry-After"))
		if code != 429 || out.Error.Code != "rate_limited" || out.Error.Details["scope"] != c.scope || retry < 1 ||
			h.Get("RateLimit-Policy") != c.policy || h.Get("RateLimit") != fmt.Sprintf(`"%s";r=0;t=%d`, c.scope, retry) {
			t.Errorf("%s %s: %d %s %v", c.method, c.path, code, raw, h)
		}
		if n := limited(t, e.Env, c.scope); n != 1 {
			t.Errorf("imshard_rate_limited_total{scope=%s} = %v, want 1", c.scope, n)
		}
	}
	if code, _ := e.Do("GET", "/v1/topics/rc/messages", e.Token(2, ""), nil); code != 200 {
		t.Errorf("another user's read: %d, want 200", code)
	}
	e.Reload(func(c *config.Config) { c.Limits.Reads = config.Rate{} })
	if code, _ := e.Do("GET", "/v1/topics/rc/messages", tok, nil); code != 200 {
		t.Errorf("a read after the reload turned reads off: %d, want 200", code)
	}
}

// TestStreamConnectionsPerUser: stream.max_connections_per_user refuses a
// user's socket past the cap with 429 before the upgrade, counts it, and
// leaves other users alone; a socket closed frees its place.
func TestStreamConnectionsPerUser(t *testing.T) {
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) { c.Stream.MaxConnectionsPerUser = 2 }})
	e.groupOfUsers("sc", 2)
	tok := e.Token(1, "")
	first := stMustDial(t, e.Env, "/v1/topics/sc/stream", tok)
	first.must("live")
	stMustDial(t, e.Env, "/v1/stream", tok)
	if _, status, err := stDial(t, e.Env, "/v1/topics/sc/stream", tok, 0); err == nil || status != 429 {
		t.Fatalf("third socket of one user: %d %v, want 429", status, err)
	}
	if n := limited(t, e.Env, "connections"); n != 1 {
		t.Errorf("imshard_rate_limited_total{scope=connections} = %v, want 1", n)
	}
	stMustDial(t, e.Env, "/v1/topics/sc/stream", e.Token(2, ""))
	_ = first.ws.Close(websocket.StatusNormalClosure, "")
	sendWaitFor(t, 10*time.Second, "the closed socket's place", func() bool {
		c, status, _ := stDial(t, e.Env, "/v1/topics/sc/stream", tok, 0)
		return c != nil && status == 101
	})
}

// TestStreamSubscribeBounded: a subscribe frame naming more topics than a
// socket may follow is refused whole before any topic is checked, and each
// subscribe frame is one of the user's reads: past the bucket it is
// refused with rate_limited and its wait.
func TestStreamSubscribeBounded(t *testing.T) {
	e := stStart(t, harness.Options{Mutate: func(c *config.Config) {
		c.Stream.MaxTopics = 2
		c.Limits.Reads = slow(1)
	}})
	e.groupOfUsers("sa", 1)
	c := stMustDial(t, e.Env, "/v1/stream", e.Token(1, ""))
	topics := func(names ...string) map[string]any {
		m := map[string]any{}
		for _, n := range names {
			m[n] = map[string]any{"since": 0}
		}
		return m
	}
	c.write(map[string]any{"type": "subscribe", "topics": topics("sa", "x1", "x2")})
	if f := c.must("error"); f.Code != "invalid_argument" || f.Topic != "" {
		t.Fatalf("a subscribe of 3 topics with max_topics 2: %+v", f)
	}
	if n := rpMetric(t, e.Env, "imshard_stream_subscriptions"); n != 0 {
		t.Errorf("the refused frame followed %v topics", n)
	}
	c.write(map[string]any{"type": "subscribe", "topics": topics("sa")})
	if f := c.must("live"); f.Topic != "sa" {
		t.Fatalf("first subscribe: %+v", f)
	}
	c.write(map[string]any{"type": "subscribe", "topics": topics("sa")})
	if f := c.must("error"); f.Code != "rate_limited" || f.RetryMS <= 0 {
		t.Fatalf("a subscribe past the user's reads: %+v", f)
	}
	if n := limited(t, e.Env, "reads"); n != 1 {
		t.Errorf("imshard_rate_limited_total{scope=reads} = %v, want 1", n)
	}
}

// `imshard bench limits` runs end to end — two send processes, one user
// over its limit — prints the accepted rate beside the limit, never lets
// more than the limit (and its burst) through, leaves no key of its tenant
// behind, and rejects bad usage with exit 2.
func TestLimitsBenchCommand(t *testing.T) {
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	code, out := runCLI(t, nil, "--config", cfg, "bench", "limits", "--tenant", tenant,
		"--duration=2s", "--per-second=10", "--burst=5", "--offered=3")
	m := regexp.MustCompile(`accepted (\d+), refused 429 (\d+), failed 0`).FindStringSubmatch(out)
	if code != 0 || m == nil || !strings.Contains(out, "accepted rate (less the burst)") {
		t.Fatalf("bench limits: exit %d\n%s", code, out)
	}
	// the limit lets through the burst and 10 a second of the run's time
	el := regexp.MustCompile(`burst 5\) for ([0-9.]+)s`).FindStringSubmatch(out)
	if el == nil {
		t.Fatalf("bench limits printed no run time\n%s", out)
	}
	secs, _ := strconv.ParseFloat(el[1], 64)
	if accepted, _ := strconv.Atoi(m[1]); float64(accepted) > 5+10*secs+1 {
		t.Fatalf("bench limits: %d sends accepted in %.1f s under 10/s with a burst of 5\n%s", accepted, secs, out)
	}
	if refused, _ := strconv.Atoi(m[2]); refused == 0 {
		t.Fatalf("bench limits refused nothing at 3× the limit\n%s", out)
	}
	rdb := testenv.RedisClient(t, testenv.RedisAddr())
	e, err := rdb.Do(context.Background(), rdb.B().Scan().Cursor(0).Match("*im:{"+tenant+"}:*").Count(100000).Build()).AsScanEntry()
	if err != nil || len(e.Elements) > 0 {
		t.Fatalf("bench limits left keys of its tenant: %v %.5q", err, e.Elements)
	}
	for _, bad := range [][]string{{"--processes=0"}, {"--per-second=0"}, {"--burst=0"}, {"--offered=-1"}} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg, "bench", "limits"}, bad...)...); code != 2 {
			t.Fatalf("bench limits %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
}
