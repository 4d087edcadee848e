package test

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

func rpErrorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct{ Error struct{ Code string } }
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not an error envelope: %s", body)
	}
	return e.Error.Code
}

func TestReadPathEdgeCursors(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "edge")
	rpGroup(t, env, "empty")
	tok := env.Token(rpMember, "")

	p := rpList(t, env, rpMember, "edge", url.Values{"before": {"1"}})
	if len(p.Messages) != 0 || p.NextBefore != nil || p.HasMore {
		t.Fatalf("before=1: %+v", p)
	}
	for _, since := range []string{"70", "71", "9223372036854775807"} {
		p = rpList(t, env, rpMember, "edge", url.Values{"since": {since}})
		if len(p.Messages) != 0 || p.NextSince == nil || p.HasMore || *p.NextSince != mustInt(t, since) {
			t.Fatalf("since=%s: %+v", since, p)
		}
	}
	p = rpList(t, env, rpMember, "edge", url.Values{"before": {"9223372036854775807"}, "limit": {"200"}})
	rpExpect(t, "the largest before is the latest page", p.seqs(), rpDesc(1, 70))
	p = rpList(t, env, rpMember, "empty", nil)
	if len(p.Messages) != 0 || p.NextBefore != nil || p.HasMore {
		t.Fatalf("empty topic: %+v", p)
	}
	p = rpList(t, env, rpMember, "empty", url.Values{"since": {"0"}})
	if len(p.Messages) != 0 || *p.NextSince != 0 {
		t.Fatalf("empty topic since: %+v", p)
	}

	for _, q := range []string{"limit=0", "limit=201", "limit=-1", "limit=ten", "before=5&since=5", "before=abc",
		"since=-3", "before=-1", "before=0", "before=9223372036854775808", "since=123456789012345678901234567890",
		"before=1.5", "since=0x1f", "limit=50&limit=60"} {
		code, body := env.Do("GET", "/v1/topics/edge/messages?"+q, tok, nil)
		if code != 400 || rpErrorCode(t, body) != "invalid_argument" {
			t.Fatalf("?%s: %d %s", q, code, body)
		}
	}
	for _, path := range []string{"/v1/topics/edge/messages/0", "/v1/topics/edge/messages/-1", "/v1/topics/edge/messages/x",
		"/v1/topics/edge/messages/99999999999999999999", "/v1/topics/bad.topic/messages", "/v1/topics/" + strings.Repeat("a", 65) + "/messages"} {
		code, body := env.Do("GET", path, tok, nil)
		if code != 400 || rpErrorCode(t, body) != "invalid_argument" {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}
	// ACL: strangers and topics without a group are refused, admins read any
	for _, path := range []string{"/v1/topics/edge/messages", "/v1/topics/edge/messages/3", "/v1/topics/edge/messages/3/context",
		"/v1/topics/edge/search?q=x&from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z"} {
		code, body := env.Do("GET", path, env.Token(rpStranger, ""), nil)
		if code != 403 || rpErrorCode(t, body) != "permission_denied" {
			t.Fatalf("stranger %s: %d %s", path, code, body)
		}
	}
	if code, body := env.Do("GET", "/v1/topics/nogroup/messages", tok, nil); code != 403 {
		t.Fatalf("topic without a group: %d %s", code, body)
	}
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/topics/edge/messages?limit=5", nil); code != 200 {
		t.Fatalf("admin reads any topic: %d", code)
	}
	if code, _ := env.Do("GET", "/v1/topics/edge/messages", "", nil); code != 401 {
		t.Fatalf("no credential: %d", code)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReadPathSinceDoesNotSkipInFlightSeq: seq n+1 persisted while seq n is
// still on its way — a since walk stops below n, then returns n and n+1
// once n lands; an abandoned seq is reported as a gap, not waited on.
func TestReadPathSinceDoesNotSkipInFlightSeq(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpGroup(t, env, "flight")
	ctx := context.Background()
	fl := env.App.Flight()
	var seqs []routing.Allocation
	for range 7 {
		a, err := env.App.Allocator().Allocate(ctx, env.Tenant, "flight")
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, a)
		if err := fl.MarkAcked(ctx, env.Tenant, "flight", a.Seq); err != nil {
			t.Fatal(err)
		}
	}
	persist := func(lo, hi int64) {
		rpInsert(t, env, "flight", env.Start, rpSeqs(lo, hi)...)
		rpSyncRoute(t, env, "flight")
		for s := lo; s <= hi; s++ {
			if err := fl.MarkPersisted(ctx, env.Tenant, "flight", s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if seqs[0].Seq != 1 || seqs[6].Seq != 7 {
		t.Fatalf("allocations %v", seqs)
	}
	persist(1, 3)
	persist(5, 5) // 4 is still in flight
	p := rpList(t, env, rpMember, "flight", url.Values{"since": {"0"}})
	rpExpect(t, "since stops below the in-flight seq", p.seqs(), []int64{1, 2, 3})
	if *p.NextSince != 3 || p.HasMore {
		t.Fatalf("cursor: %+v", p)
	}
	p = rpList(t, env, rpMember, "flight", url.Values{"since": {"3"}})
	if len(p.Messages) != 0 || *p.NextSince != 3 {
		t.Fatalf("nothing settled above 3 yet: %+v", p)
	}
	// the before page shows what is persisted; it is not a cursor forward
	rpExpect(t, "latest page", rpList(t, env, rpMember, "flight", nil).seqs(), []int64{5, 3, 2, 1})

	persist(4, 4)
	if err := fl.RecordGap(ctx, env.Tenant, "flight", 6); err != nil { // abandoned before produce
		t.Fatal(err)
	}
	persist(7, 7)
	p = rpList(t, env, rpMember, "flight", url.Values{"since": {"3"}})
	rpExpect(t, "since after the seq landed", p.seqs(), []int64{4, 5, 7})
	if len(p.Gaps) != 1 || p.Gaps[0] != 6 {
		t.Fatalf("the abandoned seq is reported as a gap: %v", p.Gaps)
	}
}

// A since page read while nothing is in flight must not return a row
// allocated after its Redis reads: seqs between the last one issued
// before the read and that row may still be on their way (Kafka does not
// keep a topic's sends in seq order), so jumping to it would skip them.
func TestReadPathSinceStopsAtTheLastSeqIssuedBeforeTheRead(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpGroup(t, env, "issued")
	ctx := context.Background()
	fl := env.App.Flight()
	for range 2 {
		a, err := env.App.Allocator().Allocate(ctx, env.Tenant, "issued")
		if err != nil {
			t.Fatal(err)
		}
		if err := fl.MarkAcked(ctx, env.Tenant, "issued", a.Seq); err != nil {
			t.Fatal(err)
		}
	}
	rpInsert(t, env, "issued", env.Start, rpSeqs(1, 2)...)
	for s := int64(1); s <= 2; s++ {
		if err := fl.MarkPersisted(ctx, env.Tenant, "issued", s); err != nil {
			t.Fatal(err)
		}
	}
	// 5 and 6 stand for seqs allocated and stored after the page's Redis
	// reads, 3 and 4 for seqs allocated before them and still on their way
	// to Kafka: the counter the page reads says 2, nothing is pending
	rpInsert(t, env, "issued", env.Start, rpSeqs(5, 6)...)
	rpSyncRoute(t, env, "issued")
	p := rpList(t, env, rpOther, "issued", url.Values{"since": {"0"}, "limit": {"7"}})
	rpExpect(t, "since stops at the last seq issued before the read", p.seqs(), []int64{1, 2})
	if *p.NextSince != 2 || p.HasMore || len(p.Gaps) != 0 {
		t.Fatalf("cursor: %+v", p)
	}
	// once the counter shows them issued (and nothing pending), they are settled
	rpSetLast(t, env, "issued", 6)
	p = rpList(t, env, rpOther, "issued", url.Values{"since": {"2"}, "limit": {"7"}})
	rpExpect(t, "since after the counter moved", p.seqs(), []int64{5, 6})
}

// A since page on a topic whose seq counter Redis does not hold (never
// written to, or lost with the pending set) has no upper bound from Redis:
// seqs 1–6 may still be on their way while 7 and 8 are stored. It returns
// only what the route mirror proves stored — here nothing, since the
// stored rows do not start at seq 1 — never the rows above the hole, and
// the same for a counter it cannot read. The read that finds the counter
// lost re-seeds it as a send would, fencing the seqs the mirror does not
// prove stored; once 1–6 land and persist passed the fence, the walk
// continues (the counter still unreadable: up to what the mirror proves).
func TestReadPathSinceWithoutCounterNeverJumpsOverUnstoredSeqs(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpGroup(t, env, "lost")
	ctx := context.Background()
	fl := env.App.Flight()
	for range 8 {
		a, err := env.App.Allocator().Allocate(ctx, env.Tenant, "lost")
		if err != nil {
			t.Fatal(err)
		}
		if err := fl.MarkAcked(ctx, env.Tenant, "lost", a.Seq); err != nil {
			t.Fatal(err)
		}
	}
	rpInsert(t, env, "lost", env.Start, rpSeqs(7, 8)...)
	rpSyncRoute(t, env, "lost")
	if err := fl.MarkPersisted(ctx, env.Tenant, "lost", 7, 8); err != nil {
		t.Fatal(err)
	}
	keys := env.Keys()
	if err := env.Redis.Do(ctx, env.Redis.B().Del().Key(keys.Seq("lost"), keys.Pending("lost")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{"lost", "unreadable"} {
		if state == "unreadable" {
			if err := env.Redis.Do(ctx, env.Redis.B().Set().Key(keys.Seq("lost")).Value("not-a-seq").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		p := rpList(t, env, rpMember, "lost", url.Values{"since": {"0"}})
		if len(p.Messages) != 0 || *p.NextSince != 0 || p.HasMore || len(p.Gaps) != 0 {
			t.Fatalf("counter %s: the since walk jumped from 0 to %v: %+v", state, p.seqs(), p)
		}
	}
	rpInsert(t, env, "lost", env.Start, rpSeqs(1, 6)...)
	rpSyncRoute(t, env, "lost")
	(&sendEnv{Env: env}).persistPassed()
	p := rpList(t, env, rpMember, "lost", url.Values{"since": {"0"}})
	rpExpect(t, "since once the mirror proves every seq stored", p.seqs(), rpAsc(1, 8))
}
