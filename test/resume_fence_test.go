package test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// fenceTimeouts are the settings of the resume-fence tests: a reservation
// step of 10 (the re-seed resumes at 11) and a produce timeout short
// enough that persist passes it within seconds.
func fenceTimeouts(c *config.Config) {
	c.Send.SeqReserveStep = 10
	c.Send.ProduceTimeout = 3 * time.Second
}

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
	e = startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: fenceTimeouts})
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
		harness.Start(t, harness.Options{Roles: []string{"persist"}, Tenant: e.Tenant, Brokers: e.Config.Kafka.Brokers, Mutate: fenceTimeouts})
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

// A recall of a seq a standing resume fence covers — acknowledged before
// Redis lost the topic's pending set, not stored yet — answers 409 with
// retry_after_ms, as for any seq still in flight, never 404: the fence is
// the seq's pending entry until persist passed it.
func TestSeqResumeFenceRecallOfAFencedSeqAnswersNotStoredYet(t *testing.T) {
	t.Parallel()
	e, _ := fenceStage(t)
	code, r := chRecall(t, e.Env, e.Token(rpMember, ""), "resume", 1, nil)
	if code != 409 || r.Error.Code != "conflict" || r.Error.Details["retry_after_ms"] == nil {
		t.Fatalf("recall of the fenced seq 1: %d %+v, want 409 conflict with retry_after_ms", code, r.Error)
	}
	if n := chCount(t, e.Env, "im_message_revisions", sq.Eq{"topic": "resume"}); n != 0 {
		t.Fatalf("a refused recall wrote %d revisions", n)
	}
}

// A retry after Redis lost the tenant's keys — the idempotency record with
// them — while the original message is acknowledged (201) and still in
// Kafka: MySQL does not hold it yet, so its "no earlier send" proves
// nothing. The retry answers 503 with retry_after_ms and allocates nothing
// until persist passed everything Kafka took before the loss; then it
// answers 200 duplicate with the original seq, the message is stored once,
// and the next new message takes the first seq after the re-seed.
func TestSendRetryAfterRedisLostItsMemoryNeverGetsASecondSeq(t *testing.T) {
	t.Parallel()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: fenceTimeouts})
	e.group("resume", 7, "active")
	e.member("resume", rpMember, "member", time.Time{})
	tok := e.Token(rpMember, "")
	first := e.mustSend(tok, "resume", sendBody("once", "acknowledged before the loss"))
	if err := testenv.DeleteTenantKeys(context.Background(), e.Redis, e.Tenant); err != nil {
		t.Fatal(err)
	}
	retry := func() (int, sendResp, chResult) {
		t.Helper()
		code, raw := e.Do("POST", "/v1/topics/resume/messages", tok, sendBody("once", "the retry"))
		var r sendResp
		if code == 200 || code == 201 {
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			if r.Seq != first.Seq {
				t.Fatalf("the retry got a new seq %d (%d), the original %d is still in Kafka", r.Seq, code, first.Seq)
			}
			return code, r, chResult{}
		}
		return code, r, chDecode(t, raw)
	}
	code, _, er := retry()
	if code != 503 || er.Error.Code != "unavailable" || er.Error.Details["retry_after_ms"] == nil {
		t.Fatalf("retry while the original is in Kafka: %d %+v, want 503 unavailable with retry_after_ms", code, er.Error)
	}

	harness.Start(t, harness.Options{Roles: []string{"persist"}, Tenant: e.Tenant, Brokers: e.Config.Kafka.Brokers, Mutate: fenceTimeouts})
	var r sendResp
	sendWaitFor(t, 60*time.Second, "persist to pass the loss", func() bool {
		code, r, _ = retry()
		return code != 503
	})
	if code != 200 || !r.Duplicate || r.MessageID != first.MessageID {
		t.Fatalf("retry once persist passed the loss: %d %+v, want 200 duplicate of %+v", code, r, first)
	}
	table, err := routing.TableFor(e.Start)
	if err != nil {
		t.Fatal(err)
	}
	if n := chCount(t, e.Env, table.Quoted(), sq.Eq{"topic": "resume", "client_msg_id": "once"}); n != 1 {
		t.Fatalf("the message is stored %d times", n)
	}
	if next := e.mustSend(tok, "resume", sendBody("next", "after the loss")); next.Seq != 11 {
		t.Fatalf("the next message got seq %d, want 11 (the refused retries allocated nothing)", next.Seq)
	}
}

// A retry of a message persist stored before Redis lost the tenant's keys
// (the active month with them, which nothing else puts back while every
// send waits for its topic's resume fence): the send asks MySQL, and MySQL
// has the message, so the retry answers 200 duplicate with the stored seq.
// Redis's empty active month is no answer to which months MySQL must be
// asked: taken as "no month", the probe asked none, found nothing, and the
// retry was allocated a second seq for the one client_msg_id.
func TestSendRetryOfAStoredMessageAfterRedisLostEverythingNeverGetsASecondSeq(t *testing.T) {
	t.Parallel()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: fenceTimeouts})
	e.group("resume", 7, "active")
	e.member("resume", rpMember, "member", time.Time{})
	tok := e.Token(rpMember, "")
	// rpInsert stores seq n under client_msg_id "c<n>", as persist would
	first := e.mustSend(tok, "resume", sendBody("c1", "stored before the loss"))
	rpInsert(t, e.Env, "resume", e.Start, rpRow{seq: first.Seq, created: time.Now().UTC().Truncate(time.Millisecond)})
	if err := testenv.DeleteTenantKeys(context.Background(), e.Redis, e.Tenant); err != nil {
		t.Fatal(err)
	}
	e.persistPassed()
	code, r := e.send(tok, "resume", sendBody("c1", "the retry"))
	if code != 200 || !r.Duplicate || r.Seq != first.Seq {
		t.Fatalf("retry of the stored message after the loss: %d %+v, want 200 duplicate of seq %d", code, r, first.Seq)
	}
}

// A topic whose history holds a gap (seq 2, recorded) loses its counter,
// its pending set and its gaps with Redis, and nobody sends to it
// afterwards: the mirror proves only seq 1 stored, and only the fence a
// re-seed raises, once lifted, records the lost gap again. The first reader runs
// that seed itself, so the walk from 0 reaches seq 3 with seq 2 (and the
// reservation's unallocated 4–10) as gaps instead of stopping below the
// gap until the next send. A topic never written to gets no counter from
// a read.
func TestSeqResumeGappedTopicWithoutSendsReadsPastItsGaps(t *testing.T) {
	t.Parallel()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: fenceTimeouts})
	for _, topic := range []string{"gapped", "unwritten"} {
		e.group(topic, 7, "active")
		e.member(topic, rpMember, "member", time.Time{})
	}
	ctx := context.Background()
	var month routing.Month
	for want := int64(1); want <= 3; want++ {
		a, err := e.App.Allocator().Allocate(ctx, e.Tenant, "gapped")
		if err != nil || a.Seq != want {
			t.Fatalf("allocation %d: %+v %v", want, a, err)
		}
		month = a.Month
	}
	rpInsert(t, e.Env, "gapped", month, rpRow{seq: 1}, rpRow{seq: 3})
	rpSyncRoute(t, e.Env, "gapped")
	if err := e.App.Flight().MarkPersisted(ctx, e.Tenant, "gapped", 1, 3); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Flight().RecordGap(ctx, e.Tenant, "gapped", 2); err != nil {
		t.Fatal(err)
	}
	if err := testenv.DeleteTenantKeys(ctx, e.Redis, e.Tenant); err != nil {
		t.Fatal(err)
	}
	e.persistPassed()
	p := rpList(t, e.Env, rpMember, "gapped", url.Values{"since": {"0"}})
	if *p.NextSince != 3 {
		t.Fatalf("the walk stopped at %d below the lost gap: since 0 returned %v, gaps %v", *p.NextSince, p.seqs(), p.Gaps)
	}
	rpExpect(t, "the walk after the loss", p.seqs(), []int64{1, 3})
	rpExpect(t, "the gaps recorded again", p.Gaps, append([]int64{2}, rpAsc(4, 10)...))

	if p := rpList(t, e.Env, rpMember, "unwritten", url.Values{"since": {"0"}}); len(p.Messages) != 0 || *p.NextSince != 0 {
		t.Fatalf("a topic never written to: %v, next_since %d", p.seqs(), *p.NextSince)
	}
	if e.seqKeyExists("unwritten") {
		t.Fatal("a read of a topic never written to created its counter")
	}
}
