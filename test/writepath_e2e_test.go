package test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// Month-edge scenario 1 (docs/invariants.md): messages sent at the end of one month and the start of
// the next (the switch driven by `shard activate`, never the calendar) land
// in their own month tables with one continuous seq.
func TestAcceptance01_MonthEdgeContinuousSeq(t *testing.T) {
	e := writepathStart(t, harness.Options{})
	e.group("edge", 1, "active")
	e.member("edge", 11, "member", time.Time{})
	tok := e.Token(11, "")
	m1, m2 := e.Start, e.Start.Next()
	var sent []writepathSent
	for i := 0; i < 10; i++ {
		if i == 5 {
			e.Activate(m2)
		}
		cmid := fmt.Sprintf("edge-%d", i)
		sent = append(sent, writepathSent{topic: "edge", cmid: cmid, resp: e.mustSend(tok, "edge", sendBody(cmid, "x"))})
	}
	for i, s := range sent {
		want := m1
		if i >= 5 {
			want = m2
		}
		if s.resp.Seq != int64(i+1) || s.resp.ShardMonth != want.String() {
			t.Fatalf("send %d: seq %d month %s, want %d %s", i, s.resp.Seq, s.resp.ShardMonth, i+1, want)
		}
	}
	writepathCheckStored(t, e, sent, m1, m2)
}

// Month-edge scenario 2 (docs/invariants.md): an event produced in one month and consumed after the
// switch still goes to its frozen month.
func TestAcceptance02_LateConsumeKeepsFrozenMonth(t *testing.T) {
	e := writepathStart(t, harness.Options{Roles: []string{app.Send}})
	e.group("late", 1, "active")
	e.member("late", 12, "member", time.Time{})
	tok := e.Token(12, "")
	var sent []writepathSent
	for i := 0; i < 5; i++ {
		cmid := fmt.Sprintf("late-%d", i)
		sent = append(sent, writepathSent{topic: "late", cmid: cmid, resp: e.mustSend(tok, "late", sendBody(cmid, "x"))})
	}
	e.Activate(e.Start.Next())
	writepathPeer(t, e, app.Persist) // the consumer comes up only now
	stored := writepathCheckStored(t, e, sent, e.Start, e.Start.Next())
	for seq, m := range stored["late"] {
		if m != e.Start {
			t.Fatalf("seq %d stored in %s, frozen month %s", seq, m, e.Start)
		}
	}
}

// Month-edge scenario 3 (docs/invariants.md): one client_msg_id retried across the month boundary is
// stored once — whether Redis still remembers the first attempt (same seq,
// duplicate), or forgot it after it was persisted (MySQL answers), or forgot
// it while the first attempt was still on its way (a second seq is issued in
// the new month; persist's cross-month probe keeps only the first).
func TestAcceptance03_RetryAcrossBoundaryStoredOnce(t *testing.T) {
	ctx := context.Background()
	t.Run("redis remembers", func(t *testing.T) {
		e := writepathStart(t, harness.Options{})
		e.group("r", 1, "active")
		e.member("r", 5, "member", time.Time{})
		tok := e.Token(5, "")
		first := e.mustSend(tok, "r", sendBody("same", "a"))
		e.Activate(e.Start.Next())
		code, again := e.send(tok, "r", sendBody("same", "a"))
		if code != 200 || !again.Duplicate || again.Seq != first.Seq || again.ShardMonth != first.ShardMonth {
			t.Fatalf("retry: %d %+v, first %+v", code, again, first)
		}
		writepathCheckStored(t, e, []writepathSent{{topic: "r", cmid: "same", resp: first}}, e.Start, e.Start.Next())
	})
	t.Run("redis forgot after persist", func(t *testing.T) {
		e := writepathStart(t, harness.Options{})
		e.group("r", 1, "active")
		e.member("r", 5, "member", time.Time{})
		tok := e.Token(5, "")
		first := e.mustSend(tok, "r", sendBody("same", "a"))
		sent := []writepathSent{{topic: "r", cmid: "same", resp: first}}
		writepathCheckStored(t, e, sent, e.Start)
		if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(e.Keys().Idempotency("r", 5, "same")).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		e.Activate(e.Start.Next())
		// send answers from MySQL when it does not trust Redis to remember
		// (200, the original); otherwise it issues a new seq in the new month
		// (201) and persist's probe of the previous month drops it
		code, again := e.send(tok, "r", sendBody("same", "a"))
		switch {
		case code == 200 && again.Duplicate && again.Seq == first.Seq:
		case code == 201 && again.Seq != first.Seq && again.ShardMonth == e.Start.Next().String():
			sendWaitFor(t, 30*time.Second, "dedup hit", func() bool {
				return persistMetric(t, e.Env, "group_message_dedup_hit_total") == 1
			})
		default:
			t.Fatalf("retry: %d %+v, first %+v", code, again, first)
		}
		writepathCheckStored(t, e, sent, e.Start, e.Start.Next())
	})
	t.Run("redis forgot in flight", func(t *testing.T) {
		e := writepathStart(t, harness.Options{Roles: []string{app.Send}})
		e.group("r", 1, "active")
		e.member("r", 5, "member", time.Time{})
		tok := e.Token(5, "")
		first := e.mustSend(tok, "r", sendBody("same", "a"))
		if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(e.Keys().Idempotency("r", 5, "same")).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		e.Activate(e.Start.Next())
		retry := e.mustSend(tok, "r", sendBody("same", "a"))
		if retry.Seq == first.Seq || retry.ShardMonth == first.ShardMonth {
			t.Fatalf("expected a new seq in the new month: %+v vs %+v", retry, first)
		}
		peer := writepathPeer(t, e, app.Persist)
		sendWaitFor(t, 30*time.Second, "dedup hit", func() bool {
			return persistMetric(t, peer.Env, "group_message_dedup_hit_total") == 1
		})
		stored := writepathCheckStored(t, e, []writepathSent{{topic: "r", cmid: "same", resp: first}}, e.Start, e.Start.Next())
		if len(stored["r"]) != 1 {
			t.Fatalf("stored %v", stored)
		}
		gaps, err := e.App.Flight().Gaps(ctx, e.Tenant, "r", 0, 100)
		if err != nil || len(gaps) != 1 || gaps[0] != retry.Seq {
			t.Fatalf("the retry's seq must be a recorded gap: %v %v", gaps, err)
		}
	})
}

// Month-edge scenario 13 (docs/invariants.md): a 10,000-member group, 50 members sending 40 messages
// each at once to its topic: unique consecutive seqs, each message stored
// exactly once.
func TestAcceptance13_TenThousandMemberGroupUnderConcurrency(t *testing.T) {
	e := writepathStart(t, harness.Options{})
	writepathMembers(t, e, "big", 13, 1, 10_001)
	sent := writepathSendMany(t, []*sendEnv{e}, []string{"big"}, 5000, 50, 40, nil)
	seqs := make([]int64, len(sent))
	for i, s := range sent {
		seqs[i] = s.resp.Seq
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("seqs not unique and consecutive at %d: %d", i, s)
		}
	}
	writepathCheckStored(t, e, sent, e.Start)
}

// Month-edge scenario 15 (docs/invariants.md): two nodes sending across a month switch agree on the
// active month, never issue a seq twice, and every topic's month ranges do
// not overlap — in the answers and in the tables.
func TestAcceptance15_NodesAgreeAcrossMonthSwitch(t *testing.T) {
	a := writepathStart(t, harness.Options{})
	b := writepathPeer(t, a, app.All)
	topics := []string{"n0", "n1", "n2", "n3"}
	for _, tp := range topics {
		writepathMembers(t, a, tp, 15, 1, 21)
	}
	m1, m2 := a.Start, a.Start.Next()
	sent := writepathSendMany(t, []*sendEnv{a, b}, topics, 1, 20, 20, func() { a.Activate(m2) })
	if ma, mb := writepathActive(t, a), writepathActive(t, b); ma != m2 || mb != m2 {
		t.Fatalf("active months differ after the switch: %s vs %s", ma, mb)
	}
	seen := map[string]map[int64]bool{}
	for _, s := range sent {
		if seen[s.topic] == nil {
			seen[s.topic] = map[int64]bool{}
		}
		if seen[s.topic][s.resp.Seq] {
			t.Fatalf("%s seq %d issued twice", s.topic, s.resp.Seq)
		}
		seen[s.topic][s.resp.Seq] = true
	}
	writepathCheckStored(t, a, sent, m1, m2)
}

// The write path at test scale: 2,000 messages from 50 concurrent
// clients to 100 topics with a month switch forced half-way are in MySQL
// exactly once each, in their event's month, and Redis routes and the MySQL
// mirror agree with the tables. IMSHARD_WRITEPATH_PER_CLIENT=400 makes it
// the full 20,000-message run (docs/performance.md).
func TestWritePathManyTopicsAcrossForcedSwitch(t *testing.T) {
	perClient := 40
	if v, err := strconv.Atoi(os.Getenv("IMSHARD_WRITEPATH_PER_CLIENT")); err == nil && v > 1 {
		perClient = v
	}
	e := writepathStart(t, harness.Options{})
	topics := make([]string, 100)
	for i := range topics {
		topics[i] = fmt.Sprintf("t%03d", i)
		writepathMembers(t, e, topics[i], int64(100+i), 1, 51)
	}
	m1, m2 := e.Start, e.Start.Next()
	start := time.Now()
	sent := writepathSendMany(t, []*sendEnv{e}, topics, 1, 50, perClient, func() { e.Activate(m2) })
	sentIn := time.Since(start)
	stored := writepathCheckStored(t, e, sent, m1, m2)
	t.Logf("%d messages: sent in %v, all stored and checked after %v", len(sent), sentIn.Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond))
	per := map[routing.Month]int{}
	for _, seqs := range stored {
		for _, m := range seqs {
			per[m]++
		}
	}
	if per[m1] == 0 || per[m2] == 0 {
		t.Fatalf("both months must hold messages: %v", per)
	}
}
