package test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// TestRetentionFloorSeenByEveryProcess: once a floor raise answered (the
// retention's first step, before any row goes), the very next read of
// every query process leaves out the seqs below the floor: the process
// that took the sends and a second one holding a copy of the topic's
// newest messages made before the raise, with the hot cache still holding
// them. A raise moves no message version, so the copy stays valid and
// answers that page; the floor has to narrow it. The floor is read in each
// page's Redis round trip; a process that kept it without anything the
// raise moves would serve the expired seqs here.
func TestRetentionFloorSeenByEveryProcess(t *testing.T) {
	t.Parallel()
	env, reader, tok := rpCopyReader(t, "fl")
	for _, text := range []string{"a", "b", "c", "d", "e", "f"} {
		rpPost(t, env, tok, "fl", "fl-"+text, text)
	}
	// persisted: a since page stops at the forward bound
	waitFor(t, 30*time.Second, func() bool { return len(rpWalkSince(t, env, rpMember, "fl", 50)) == 6 })
	procs := []*harness.Env{env, reader}
	latest := func(e *harness.Env) []int64 {
		return rpList(t, e, rpMember, "fl", url.Values{"limit": {"10"}}).seqs()
	}
	for _, e := range procs {
		for range 2 {
			rpExpect(t, "the latest page before the raise", latest(e), rpDesc(1, 6))
		}
	}
	hits := rpMetric(t, reader, "imshard_query_hot_local_total", "result=hit")
	if hits < 1 {
		t.Fatal("the second process read no page over a copy before the raise")
	}
	if err := env.RaiseFloors(routing.Floor{Topic: "fl", Seq: 4}); err != nil {
		t.Fatal(err)
	}
	for i, e := range procs {
		rpExpect(t, "the latest page right after the raise", latest(e), rpDesc(4, 6))
		rpExpect(t, "a since page from below the floor", rpList(t, e, rpMember, "fl", url.Values{"since": {"0"}}).seqs(), rpAsc(4, 6))
		rpExpect(t, "a page before the floor", rpList(t, e, rpMember, "fl", url.Values{"before": {"4"}}).seqs(), nil)
		if code, body := e.Do("GET", "/v1/topics/fl/messages/2", e.Token(rpMember, ""), nil); code != 404 || !strings.Contains(string(body), "expired") {
			t.Fatalf("process %d: an expired seq: %d %s", i, code, body)
		}
	}
	if n := rpMetric(t, reader, "imshard_query_hot_local_total", "result=hit"); n <= hits {
		t.Fatalf("the second process's page after the raise was not read over its copy (%v hits before, %v after)", hits, n)
	}
}
