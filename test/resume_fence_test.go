package test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// fenceStage leaves topic "resume" of a send and query process (no persist
// running) as Redis losing everything leaves it while a message is on its
// way: seq 1 was sent and acknowledged (201, in Kafka, not stored), then
// the tenant's Redis keys went (a flush or a restart of a Redis that keeps
// nothing), then seq 11 was allocated — the re-seed above the reservation
// of 10 — and persist stored it ahead of seq 1 (a rebalance, seq 1's batch
// retrying). It returns the process and the persist role to start, which
// stores seq 1 from Kafka.
func fenceStage(t *testing.T) (e *sendEnv, startPersist func()) {
	t.Helper()
	short := func(c *config.Config) {
		c.Send.SeqReserveStep = 10
		c.Send.ProduceTimeout = 3 * time.Second
	}
	e = startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: short})
	e.group("resume", 7, "active")
	e.member("resume", rpMember, "member", time.Time{})
	if r := e.mustSend(e.Token(rpMember, ""), "resume", sendBody("before", "acknowledged before the flush")); r.Seq != 1 {
		t.Fatalf("first send got seq %d", r.Seq)
	}
	ctx := context.Background()
	if err := testenv.DeleteTenantKeys(ctx, e.Redis, e.Tenant); err != nil {
		t.Fatal(err)
	}
	a, err := e.App.Allocator().Allocate(ctx, e.Tenant, "resume")
	if err != nil || a.Seq != 11 {
		t.Fatalf("allocation after the flush: %+v %v, want seq 11 (resumed above the reservation)", a, err)
	}
	if err := e.App.Flight().MarkAcked(ctx, e.Tenant, "resume", a.Seq); err != nil {
		t.Fatal(err)
	}
	rpInsert(t, e.Env, "resume", a.Month, rpRow{seq: a.Seq})
	rpSyncRoute(t, e.Env, "resume")
	if err := e.App.Flight().MarkPersisted(ctx, e.Tenant, "resume", a.Seq); err != nil {
		t.Fatal(err)
	}
	return e, func() {
		harness.Start(t, harness.Options{Roles: []string{"persist"}, Tenant: e.Tenant, Brokers: e.Config.Kafka.Brokers, Mutate: short})
	}
}

// After Redis lost the counter and the pending set with it, the re-seed
// fences the seqs that may still be on their way: a since walk stops below
// seq 1, acknowledged and still in Kafka, instead of jumping to seq 11;
// once persist stored seq 1 (and passed everything Kafka took before the
// re-seeding's produce timeout), the walk returns 1, then 11, with the
// reservation's unallocated seqs 2–10 as gaps.
func TestSeqResumeFenceWalkNeverJumpsOverAnAcknowledgedMessage(t *testing.T) {
	t.Parallel()
	e, startPersist := fenceStage(t)
	p := rpList(t, e.Env, rpMember, "resume", url.Values{"since": {"0"}})
	if len(p.Messages) != 0 || *p.NextSince != 0 || len(p.Gaps) != 0 {
		t.Fatalf("the walk jumped over the acknowledged message: since 0 returned %v, next_since %d, gaps %v", p.seqs(), *p.NextSince, p.Gaps)
	}
	startPersist()
	sendWaitFor(t, 60*time.Second, "the walk to pass the stored message", func() bool {
		p = rpList(t, e.Env, rpMember, "resume", url.Values{"since": {"0"}})
		return len(p.Messages) > 0
	})
	rpExpect(t, "the walk after persist stored seq 1", p.seqs(), []int64{1, 11})
	rpExpect(t, "the reservation's unallocated seqs", p.Gaps, rpAsc(2, 10))
	if *p.NextSince != 11 || p.HasMore {
		t.Fatalf("cursor: next_since %d, has_more %v", *p.NextSince, p.HasMore)
	}
}

// The stream does the same: a socket following the topic from 0 gets seq
// 1 first, once stored, then the gap 2–10, then seq 11 — never 11 first.
func TestSeqResumeFenceStreamDeliversTheAcknowledgedMessageFirst(t *testing.T) {
	t.Parallel()
	e, startPersist := fenceStage(t)
	c := stMustDial(t, e.Env, "/v1/topics/resume/stream?since=0", e.Token(rpMember, ""))
	startPersist()
	next := func() stFrame {
		t.Helper()
		for {
			f, err := c.next()
			if err != nil {
				t.Fatal(err)
			}
			if f.Type != "live" {
				return f
			}
		}
	}
	if f := next(); f.Type != "message" || f.Message.Seq != 1 {
		t.Fatalf("the stream jumped over the acknowledged message: first frame %s of seq %d, want the message of seq 1", f.Type, f.Message.Seq)
	}
	if f := next(); f.Type != "gap" || f.From != 2 || f.To != 10 {
		t.Fatalf("second frame %s %d-%d, want the gap 2-10", f.Type, f.From, f.To)
	}
	if f := next(); f.Type != "message" || f.Message.Seq != 11 {
		t.Fatalf("third frame %s of seq %d, want the message of seq 11", f.Type, f.Message.Seq)
	}
}
