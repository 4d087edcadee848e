package ratelimit

import (
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
)

// TestDecide: a bucket lets its burst through at once, then one request
// per interval; a refusal names the wait until one passes and changes
// nothing; an idle bucket refills to its burst and no further.
func TestDecide(t *testing.T) {
	r := config.Rate{PerSecond: 10, Burst: 3} // one per 100 ms
	t0 := time.Unix(1_700_000_000, 0)
	var tat time.Time
	for i, want := range []int64{2, 1, 0} {
		var d Decision
		tat, d = Decide(r, tat, t0)
		if !d.OK || d.Remaining != want {
			t.Fatalf("request %d: %+v, want ok with %d left", i, d, want)
		}
	}
	next, d := Decide(r, tat, t0)
	if d.OK || d.RetryAfter != 100*time.Millisecond || next != tat {
		t.Fatalf("past the burst: %+v (tat %v → %v), want a refusal for 100ms that keeps the state", d, tat, next)
	}
	if _, d := Decide(r, tat, t0.Add(99*time.Millisecond)); d.OK || d.RetryAfter != time.Millisecond {
		t.Fatalf("1 ms early: %+v", d)
	}
	if _, d := Decide(r, tat, t0.Add(100*time.Millisecond)); !d.OK || d.Remaining != 0 || d.Reset != 300*time.Millisecond {
		t.Fatalf("one interval on: %+v, want ok, 0 left, full again in 300ms", d)
	}
	if _, d := Decide(r, tat, t0.Add(time.Hour)); !d.OK || d.Remaining != 2 {
		t.Fatalf("after an hour idle: %+v, want the burst back (2 left after this one)", d)
	}
}

// TestLocalBounded: the process's buckets are per (tenant, user), and past
// the bound the one unused the longest is forgotten (a full bucket again).
func TestLocalBounded(t *testing.T) {
	r := config.Rate{PerSecond: 0.001, Burst: 1}
	now := time.Now()
	b := NewLocal(2)
	if !b.Take("a", 1, r, now).OK || b.Take("a", 1, r, now).OK {
		t.Fatal("user 1: the burst of one, then a refusal")
	}
	if !b.Take("b", 1, r, now).OK {
		t.Fatal("the same user id in another tenant has a bucket of its own")
	}
	b.Take("a", 2, r, now) // a third bucket: ("a", 1) is the oldest and goes
	if !b.Take("a", 1, r, now).OK {
		t.Fatal("an evicted bucket comes back full")
	}
}

// TestRefusal: the 429's fields — Retry-After in whole seconds rounded up,
// retry_after_ms rounded up and never negative, r=0 and t the same wait.
func TestRefusal(t *testing.T) {
	for _, c := range []struct {
		retry     time.Duration
		header    string
		ms        int64
		rateLimit string
	}{
		{1500 * time.Microsecond, "1", 2, `"user";r=0;t=1`},
		{2 * time.Second, "2", 2000, `"user";r=0;t=2`},
		{2*time.Second + time.Nanosecond, "3", 2001, `"user";r=0;t=3`},
		{-time.Second, "0", 0, `"user";r=0;t=0`},
	} {
		e := Refusal(ScopeUser, Policy(ScopeUser, config.Rate{PerSecond: 10, Burst: 20}), c.retry)
		if code, _ := httpapi.Classify(e); code != httpapi.CodeRateLimited || httpapi.Status(code) != 429 {
			t.Errorf("%v: code %s", c.retry, code)
		}
		if got := e.Header.Get(HeaderRetryAfter); got != c.header {
			t.Errorf("%v: Retry-After %q, want %q", c.retry, got, c.header)
		}
		if got := e.Details["retry_after_ms"]; got != c.ms {
			t.Errorf("%v: retry_after_ms %v, want %d", c.retry, got, c.ms)
		}
		if got := e.Header.Get(HeaderState); got != c.rateLimit {
			t.Errorf("%v: RateLimit %q, want %q", c.retry, got, c.rateLimit)
		}
		if got := e.Header.Get(HeaderPolicy); got != `"user";q=20;w=2` {
			t.Errorf("%v: RateLimit-Policy %q", c.retry, got)
		}
	}
}

// TestSendArgs: the send call's arguments and policy name only the buckets
// that are on.
func TestSendArgs(t *testing.T) {
	l := config.SendLimits{User: config.Rate{PerSecond: 3, Burst: 5}, Topic: config.Rate{PerSecond: 1000, Burst: 1}}
	want := []string{"0", "0", "333333", "5", "1000", "1"}
	got := SendArgs(l)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("SendArgs %v, want %v", got, want)
		}
	}
	if p := SendPolicies(l); p != `"user";q=5;w=2, "topic";q=1;w=1` {
		t.Errorf("SendPolicies %q", p)
	}
	if p := SendPolicies(config.SendLimits{}); p != "" {
		t.Errorf("no bucket on: SendPolicies %q, want none", p)
	}
}
