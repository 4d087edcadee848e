package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// steadySend is every command a send in the steady state (membership
// cached, idempotency horizon trusted, reservation available, no month
// due) sends to Redis: one call before the produce, one after the broker's
// ack (which publishes the realtime frame itself).
var steadySend = map[string]int{"fcall imshard_send": 1, "fcall imshard_sent": 1}

// perSend scales steadySend to n sends.
func perSend(n int) map[string]int {
	out := map[string]int{}
	for k, v := range steadySend {
		out[k] = v * n
	}
	return out
}

// withoutLease drops the node lease's renewal (a script run every third of
// its TTL, whatever the sends do) from counts.
func withoutLease(counts map[string]int) map[string]int {
	out := maps.Clone(counts)
	if out["evalsha"] <= 1 {
		delete(out, "evalsha")
	}
	return out
}

// A steady-state send makes one Redis round trip before its produce and
// one after the broker's ack, counted at the wire by a proxy in front of a
// private Redis, its rate limits on (decided inside that call); a refusal
// by a cached membership or by a rate limit is one call that changes
// nothing; a removed member is refused at once.
func TestSendOneRoundTripBeforeAndOneAfterProduce(t *testing.T) {
	srv := testenv.StartRedis(t)
	wire := testenv.CountRedisCommands(t, srv.Addr)
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) {
		c.Redis.Addrs = []string{wire.Addr}
		c.Limits = config.DefaultLimits()
		c.Limits.Send.Tenant = config.Rate{PerSecond: 1000, Burst: 1000}
		c.Limits.Send.User = config.Rate{PerSecond: 0.001, Burst: 60} // refills nothing during the test
	}})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	e.member("room", 2, "member", time.Now().Add(time.Hour))
	user := e.Token(1, "")
	direct := testenv.RedisClient(t, srv.Addr)
	ctx := context.Background()

	// the first sends take the slow paths once: membership from MySQL,
	// idempotency horizon, counter seed and reservation; the horizon is set
	// once persist passed the tenant's memory start
	e.persistPassed()
	first := e.mustSend(user, "room", sendBody("warm-0", "x"))
	sendWaitFor(t, 10*time.Second, "the idempotency horizon", func() bool {
		n, err := direct.Do(ctx, direct.B().Exists().Key(e.Keys().IdemSince()).Build()).AsInt64()
		return err == nil && n == 1
	})
	for i := 1; ; i++ {
		wire.Take()
		e.mustSend(user, "room", sendBody(fmt.Sprintf("warm-%d", i), "x"))
		if got := withoutLease(wire.Take()); maps.Equal(got, steadySend) {
			break
		} else if i == 20 {
			t.Fatalf("no steady state after %d sends; the last sent %v", i, got)
		}
	}

	const n = 30
	wire.Take()
	var last sendResp
	for i := range n {
		last = e.mustSend(user, "room", sendBody(fmt.Sprintf("m%d", i), "hello"))
	}
	if got := withoutLease(wire.Take()); !maps.Equal(got, perSend(n)) {
		t.Fatalf("%d steady sends sent %v, want %v", n, got, perSend(n))
	}
	if last.Seq <= first.Seq+n {
		t.Fatalf("last seq %d after first %d", last.Seq, first.Seq)
	}

	// a duplicate is answered by the same one call
	if status, r := e.send(user, "room", sendBody("m0", "again")); status != 200 || !r.Duplicate {
		t.Fatalf("duplicate = %d %+v", status, r)
	}
	if got := withoutLease(wire.Take()); !maps.Equal(got, map[string]int{"fcall imshard_send": 1}) {
		t.Fatalf("a duplicate sent %v", got)
	}

	// a send the user's rate limit refuses is that same one call, and
	// claims nothing
	refused := ""
	for i := 0; refused == ""; i++ {
		wire.Take()
		cmid := fmt.Sprintf("over-%d", i)
		status, r := e.send(user, "room", sendBody(cmid, "x"))
		switch {
		case status == 201 && i < 60:
		case status == 429 && r.Error.Code == "rate_limited":
			refused = cmid
		default:
			t.Fatalf("send %d past the user's burst: %d %+v, want 429 rate_limited", i, status, r)
		}
	}
	if got := withoutLease(wire.Take()); !maps.Equal(got, map[string]int{"fcall imshard_send": 1}) {
		t.Fatalf("a send refused by a rate limit sent %v", got)
	}
	if rec := e.idemRecord("room", 1, refused); len(rec) != 0 {
		t.Fatalf("a send refused by a rate limit left a record: %v", rec)
	}

	// refusals from the cached membership: the first of each reads MySQL
	// and fills the cache, the second is one call; nothing is claimed
	for _, tc := range []struct {
		name  string
		token string
	}{{"non-member", e.Token(3, "")}, {"muted member", e.Token(2, "")}} {
		for try := range 2 {
			wire.Take()
			if status, r := e.send(tc.token, "room", sendBody("refused", "x")); status != 403 || r.Error.Code != "permission_denied" {
				t.Fatalf("%s, try %d: %d %+v", tc.name, try, status, r)
			}
			if got := withoutLease(wire.Take()); try == 1 && !maps.Equal(got, map[string]int{"fcall imshard_send": 1}) {
				t.Fatalf("%s refused from the cache sent %v", tc.name, got)
			}
		}
	}
	if rec := e.idemRecord("room", 3, "refused"); len(rec) != 0 {
		t.Fatalf("a refused send left a record: %v", rec)
	}

	// removal takes effect for the very next send
	if status, body := e.Do("DELETE", "/v1/topics/room/members/1", e.svc, nil); status != 204 {
		t.Fatalf("delete member: %d %s", status, body)
	}
	if status, r := e.send(user, "room", sendBody("after-removal", "x")); status != 403 || r.Error.Code != "permission_denied" {
		t.Fatalf("send after removal = %d %+v", status, r)
	}
}

// On a 3-node Redis Cluster the send's calls (every key under the tenant's
// hash tag) give concurrent senders unique consecutive seqs, answer a
// duplicate and feed the hot cache.
func TestSendOnRedisCluster(t *testing.T) {
	addrs := testenv.StartRedisCluster(t, 3)
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) { c.Redis.Addrs = addrs }})
	const workers, per = 4, 25
	e.sendConcurrently("room", workers, per)
	status, r := e.send(e.Token(1, ""), "room", sendBody("w0-0", "again"))
	if status != 200 || !r.Duplicate || r.Seq < 1 {
		t.Fatalf("duplicate on the cluster = %d %+v", status, r)
	}
	n, err := e.Redis.Do(context.Background(), e.Redis.B().Zcard().Key(e.Keys().HotMessages("room")).Build()).AsInt64()
	if err != nil || n != workers*per {
		t.Fatalf("hot cache holds %d (%v), want %d", n, err, workers*per)
	}
}

// Redis losing a send's record between its two calls (a flush, a
// failover): the call after the ack writes it again as acked with the 201
// body it is given, expiring as a record does, so a retry still answers
// 200 with the original body and produces nothing — whether the call finds
// the seq by the pending entry the send call returned (it then writes the
// record without reading it first) or only by its seq.
func TestSendAckRewritesALostRecord(t *testing.T) {
	e := startSend(t, harness.Options{})
	e.group("room", 7, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	ctx := context.Background()
	k := e.Keys()
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("own entry %v", own), func(t *testing.T) {
			cmid := fmt.Sprintf("lost-between-%v", own)
			code, raw := e.Do("POST", "/v1/topics/room/messages", user, sendBody(cmid, "x"))
			if code != 201 {
				t.Fatalf("send: %d %s", code, raw)
			}
			var first sendResp
			if err := json.Unmarshal(raw, &first); err != nil {
				t.Fatal(err)
			}
			seq := strconv.FormatInt(first.Seq, 10)
			idem := k.Idempotency("room", 1, cmid)
			cmds := rueidis.Commands{e.Redis.B().Del().Key(idem).Build()}
			member := ""
			if own {
				// the seq's entry as the send call left it, before its ack
				member = seq + ":" + strconv.FormatInt(time.Now().UnixMilli(), 10)
				cmds = append(cmds, e.Redis.B().Zremrangebyscore().Key(k.Pending("room")).Min(seq).Max(seq).Build(),
					e.Redis.B().Zadd().Key(k.Pending("room")).ScoreMember().ScoreMember(float64(first.Seq), member).Build())
			}
			for _, r := range e.Redis.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					t.Fatal(err)
				}
			}
			// what the send's post-ack call does when the record is gone
			keys := []string{idem, k.Pending("room"), k.HotMessages("room"), k.Realtime("room"), k.MessagesVersion("room"),
				k.Abandoned("room")}
			args := []string{seq, "60000", string(raw), "", "0", "0", member, "{}"}
			if err := routing.NewScripts().Fenced.Sent(ctx, e.Redis, keys, args).Error(); err != nil {
				t.Fatal(err)
			}
			if rec := e.idemRecord("room", 1, cmid); rec["status"] != "acked" || rec["resp"] == "" {
				t.Fatalf("record written again as %v", rec)
			}
			if ttl, err := e.Redis.Do(ctx, e.Redis.B().Pttl().Key(idem).Build()).AsInt64(); err != nil || ttl <= 0 || ttl > 60000 {
				t.Fatalf("record written again with PTTL %d (%v), want the TTL the call was given", ttl, err)
			}
			if own {
				got, err := e.Redis.Do(ctx, e.Redis.B().Zrange().Key(k.Pending("room")).Min(seq).Max(seq).Byscore().Build()).AsStrSlice()
				if err != nil || len(got) != 1 || got[0] != seq+":a" {
					t.Fatalf("pending entries of the seq after the ack = %v (%v), want the ack's mark alone", got, err)
				}
			}
			status, again := e.send(user, "room", sendBody(cmid, "other text"))
			first.Duplicate = true
			if status != 200 || again != first {
				t.Fatalf("retry after the record was lost = %d %+v, want 200 %+v", status, again, first)
			}
		})
	}
}

// Persist dropped a send's event as a duplicate of the message stored under
// another seq (its claim had marked the seq acknowledged first): the send's
// call after the ack, coming later, finds the seq abandoned and answers 0,
// so the send is answered 503, never 201 with a seq that holds no row.
func TestSendAckAfterPersistDroppedItAsDuplicateNeverAnswered201(t *testing.T) {
	e := startSend(t, harness.Options{})
	ctx := context.Background()
	al, err := e.App.Allocator().Allocate(ctx, e.Tenant, "room")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.App.Flight().Claim(ctx, e.Tenant, map[string][]int64{"room": {al.Seq}}); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Flight().RecordDuplicate(ctx, e.Tenant, "room", al.Seq); err != nil {
		t.Fatal(err)
	}
	k := e.Keys()
	keys := []string{k.Idempotency("room", 1, "dropped"), k.Pending("room"), k.HotMessages("room"), k.Realtime("room"),
		k.MessagesVersion("room"), k.Abandoned("room")}
	args := []string{strconv.FormatInt(al.Seq, 10), "60000", "{}", "", "0", "0", "", "{}"}
	if n, err := routing.NewScripts().Fenced.Sent(ctx, e.Redis, keys, args).AsIntSlice(); err != nil || len(n) != 1 || n[0] != 0 {
		t.Fatalf("the call after the ack of a seq persist dropped as a duplicate = %v %v, want [0] (answered 503)", n, err)
	}
}

// The call after the ack takes several sends at once (the send role
// coalesces the sends whose acks came together): each gets its own reply,
// and a send whose part fails on a command fails alone — the parts of the
// others are done.
func TestSentCallTakesSeveralSendsEachItsOwnReply(t *testing.T) {
	e := startSend(t, harness.Options{})
	ctx := context.Background()
	al, err := e.App.Allocator().Allocate(ctx, e.Tenant, "room")
	if err != nil {
		t.Fatal(err)
	}
	k := e.Keys()
	// the second send's pending set is not a sorted set: its ZREM fails
	if err := e.Redis.Do(ctx, e.Redis.B().Set().Key(k.Pending("broken")).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	one := func(topic, cmid string, seq int64, pending string) ([]string, []string) {
		return []string{k.Idempotency(topic, 1, cmid), k.Pending(topic), k.HotMessages(topic), k.Realtime(topic),
				k.MessagesVersion(topic), k.Abandoned(topic)},
			[]string{strconv.FormatInt(seq, 10), "60000", "{}", "", "0", "0", pending, "{}"}
	}
	k1, a1 := one("room", "first", al.Seq, "")
	k2, a2 := one("broken", "second", 1, "1:1")
	rep, err := routing.NewScripts().Fenced.Sent(ctx, e.Redis, append(k1, k2...), append(a1, a2...)).ToArray()
	if err != nil || len(rep) != 2 {
		t.Fatalf("the call for two sends = %v %v, want two replies", rep, err)
	}
	if n, err := rep[0].ToInt64(); err != nil || n != 1 {
		t.Fatalf("the first send's reply = %v %v, want 1 (recorded, published)", n, err)
	}
	if msg, err := rep[1].ToString(); err != nil || !strings.Contains(msg, "WRONGTYPE") {
		t.Fatalf("the failing send's reply = %q %v, want its WRONGTYPE error", msg, err)
	}
	if rec := e.idemRecord("room", 1, "first"); rec["status"] != "acked" {
		t.Fatalf("the first send's record = %v, want acked beside the failing send", rec)
	}
	acked, err := e.Redis.Do(ctx, e.Redis.B().Zscore().Key(k.Pending("room")).Member(fmt.Sprintf("%d:a", al.Seq)).Build()).ToString()
	if err != nil || acked != strconv.FormatInt(al.Seq, 10) {
		t.Fatalf("the first send's pending entry = %q %v, want marked acked", acked, err)
	}
}
