package routing_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/lua"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// BenchmarkSendSteps says what each microsecond of Redis a send costs buys:
// the send's two calls of the fenced library (send before the produce,
// sent after the ack) with the keys and arguments the send path gives them,
// in the steady state (membership cached, horizon trusted, reservation
// available, versions held, limits on and never reached), beside the
// reference send of `imshard bench send` (lua/bench_send.lua and the
// pipeline after its ack), then the library with one step taken out at a
// time — by its arguments where the library has one for it, otherwise by a
// cut of the loaded library's text (a cut whose text is gone fails).
//
// Each variant reports Redis CPU µs per send (INFO cpu deltas over the
// sends: the whole server, so run it on a private one) and the calls' own
// µs per send (INFO commandstats: fcall for the library, evalsha and the
// pipeline's commands for the reference). Sends run from 64 goroutines, so
// the client pipelines them as the send role's do. Both sides' records
// expire after a minute, not send.idempotency_ttl's day, so that a run
// does not grow the server by gigabytes:
//
//	IMSHARD_TEST_REDIS_ADDR=127.0.0.1:PORT go test -run '^$' \
//	  -bench BenchmarkSendSteps -benchtime=20000x ./modules/routing
func BenchmarkSendSteps(b *testing.B) {
	ctx := context.Background()
	rdb := redisClient(b)
	tenant := testenv.NewTenant(b)
	keys, err := noPrefix(b).Tenant(tenant)
	if err != nil {
		b.Fatal(err)
	}
	f := newSendFixture(ctx, b, rdb, keys)
	ref := side{name: "reference", send: f.reference, cmds: []string{"evalsha", "hset", "zrem", "zadd", "pexpire", "spublish"}}
	lib := f.variant(ctx, b, sendSteps[0])
	b.Run(lib.name, func(b *testing.B) { f.measure(b, lib, ref) })
	for _, v := range sendSteps[1:] {
		b.Run(v.name, func(b *testing.B) { f.measure(b, f.variant(ctx, b, v), lib) })
	}
}

// variant is the library's send as v has it.
func (f *sendFixture) variant(ctx context.Context, b *testing.B, v sendStep) side {
	fn := loadFenced(ctx, b, f.rdb, v.cuts)
	a := f.args
	if v.args != nil {
		v.args(&a)
	}
	return side{name: v.name, send: func(ctx context.Context, i int64) error { return f.library(ctx, fn, a, i) }, cmds: []string{"fcall"}}
}

// side is one way of sending: the reference or a variant of the library.
type side struct {
	name string
	send func(context.Context, int64) error
	cmds []string // its top-level commands in commandstats, the first counted whole
}

// sendStepArgs are the arguments of the two calls a variant may change.
type sendStepArgs struct {
	member, gid string   // send's ARGV[4] and ARGV[5]
	limits      []string // send's ARGV[11..16]
	hot         bool     // sent gets a hot-cache member
	noSent      bool     // no call after the ack
}

// sendStep is a variant: the library without one step.
type sendStep struct {
	name string
	cuts [][2]string // text of the library → its replacement
	args func(*sendStepArgs)
}

var sendSteps = []sendStep{
	{name: "library"},
	{name: "-membership", args: func(a *sendStepArgs) { a.member, a.gid = "", "42" }},
	{name: "-gate", cuts: [][2]string{{`
  local shut = gate_shut(v[6])
  if shut then
    return shut
  end
  if args[4] ~= '' then`, `
  if args[4] ~= '' then`}}},
	{name: "-horizon", cuts: [][2]string{{`
  local stamp, since = match(v[2] or '', '^(%w+):(%d+)$')
  local set = stamp == incarnation()
  if args[6] == '1' or not set or now < tonumber(since) then`, `
  local set = true
  if false then`}}},
	{name: "-reservation", cuts: [][2]string{{`
  local hw = reserved(res)
  if not hw or not last then
    return {3}
  end
  last = tonumber(last)
  if last + 1 > hw then
    return {4, math.max(hw, last)}
  end`, `
  local hw = 1e15`}}},
	{name: "-versions", cuts: [][2]string{{`
  local ver = v[7]
  if not ver then
    ver = next_version(nil)
    redis.call('SET', keys[11], ver, 'PX', args[10])
  end
  if not v[8] then
    redis.call('SET', keys[14], next_version(nil))
  end`, `
  local ver = ''`}}},
	{name: "-claim", cuts: [][2]string{{`
  local rec = redis.call('HMGET', keys[1], 'status', 'event', 'resp', 'claimed_at', 'owner', 'gid', 'seq', 'month')`, `
  local rec = {}`}}},
	{name: "-pending", cuts: [][2]string{{`
  redis.call('ZADD', pending_key, seq, member)`, ``}, {`
  local own = args[a + 7] ~= '' and redis.call('ZREM', keys[k + 2], args[a + 7]) == 1
  local acked = own
  if not acked and redis.call('ZCOUNT', keys[k + 2], args[a + 1], args[a + 1]) > 0 then
    redis.call('ZREMRANGEBYSCORE', keys[k + 2], args[a + 1], args[a + 1])
    acked = true
  end
  if acked then
    redis.call('ZADD', keys[k + 2], args[a + 1], args[a + 1] .. ':a')
  elseif redis.call('ZSCORE', keys[k + 6], args[a + 1]) then
    return 0
  end`, `
  local own, acked = true, true`}}},
	{name: "-ackmark", cuts: [][2]string{{`
  if acked then
    redis.call('ZADD', keys[k + 2], args[a + 1], args[a + 1] .. ':a')
  elseif`, `
  if acked then
  elseif`}}},
	{name: "-record", cuts: [][2]string{{`
  redis.call('HSET', keys[1], 'status', 'pending', 'event', args[9], 'gid', gid, 'seq', a[2], 'month', a[3],
    'ver', ver)
  redis.call('PEXPIRE', keys[1], args[2])`, ``}, {`
    if redis.call('HSET', keys[k + 1], 'status', 'acked') == 1 then
      redis.call('HSET', keys[k + 1], 'resp', args[a + 3])
      redis.call('PEXPIRE', keys[k + 1], args[a + 2])
    end`, ``}}},
	{name: "-hotcache", args: func(a *sendStepArgs) { a.hot = false }},
	{name: "-publish", cuts: [][2]string{{`
  redis.call('SPUBLISH', keys[k + 4], args[a + 8])`, ``}}},
	{name: "-limits(off)", args: func(a *sendStepArgs) { a.limits = []string{"0", "0", "0", "0", "0", "0"} }},
	{name: "-limits(cut)", cuts: [][2]string{{`
  local refusal, nexts, tight, left, reset = limit(v, args, now_us)`, `
  local refusal, nexts, tight, left, reset = nil, {}, 0, 0, 0`}}},
	{name: "-charge", cuts: [][2]string{{`
  charge(keys, nexts, now_us)`, ``}}},
	{name: "-sent(call)", args: func(a *sendStepArgs) { a.noSent = true }},
}

// sendFixture is a tenant in the steady state of a send: 100 topics of 16
// cached members, a trusted horizon, reservations far ahead, versions held.
type sendFixture struct {
	rdb    rueidis.Client
	keys   routing.Keys
	topics []string
	args   sendStepArgs
	event  string // the stored event (message.Unallocated's size)
	frame  string // the realtime frame; its inner object is the hot-cache member
	ref    *rueidis.Lua
	refKey string
	next   atomic.Int64
}

const sendStepTopics, sendStepMembers = 100, 16

func newSendFixture(ctx context.Context, b *testing.B, rdb rueidis.Client, keys routing.Keys) *sendFixture {
	f := &sendFixture{rdb: rdb, keys: keys, ref: rueidis.NewLuaScript(lua.BenchSend), refKey: keys.BenchReference("steps"),
		args: sendStepArgs{member: "set per send", hot: true, limits: []string{"1", "1000000", "1", "1000000", "1", "1000000"}}}
	content := strings.Repeat("x", 100)
	f.event = `{"tenant":"bench","topic":"t","message_id":"7405438471239684096","from_user":"3","client_msg_id":"c-000000000001",` +
		`"msg_type":"text","content":{"text":"` + content + `"},"created_at":"2026-12-07T12:00:00.000000Z"}`
	f.frame = `{"type":"message","message":{"topic":"t","seq":1,"message_id":"7405438471239684096","from_user":"3",` +
		`"msg_type":"text","content":{"text":"` + content + `"},"created_at":"2026-12-07T12:00:00.000000Z","shard_month":"202612"}}`
	runID := serverRunID(ctx, b, rdb)
	now := time.Now()
	set := func(k, v string) rueidis.Completed { return rdb.B().Set().Key(k).Value(v).Build() }
	cmds := rueidis.Commands{
		set(keys.ActiveMonth(), now.UTC().Format("200601")),
		set(keys.MigrationGate(), runID+":1:00:none"),
		set(keys.IdemSince(), runID+":"+strconv.FormatInt(now.Add(-time.Hour).UnixMilli(), 10)),
	}
	for i := range sendStepTopics {
		t := "steps" + strconv.Itoa(i)
		f.topics = append(f.topics, t)
		cmds = append(cmds, set(keys.Seq(t), "0"), set(keys.SeqReservation(t), runID+":1000000000000"),
			set(keys.Group(t), strconv.Itoa(100+i)+"|active"), set(keys.MessagesVersion(t), "1"), set(keys.HiddenVersion(t), "1"))
		for u := 1; u <= sendStepMembers; u++ {
			cmds = append(cmds, rdb.B().Hset().Key(keys.Members(t)).FieldValue().FieldValue(strconv.Itoa(u), "member|0").Build())
		}
	}
	for _, r := range rdb.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

// serverRunID is the run_id the fenced library stamps its strings with.
func serverRunID(ctx context.Context, t testing.TB, rdb rueidis.Client) string {
	t.Helper()
	info, err := rdb.Do(ctx, rdb.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	_, id, _ := strings.Cut(info, "run_id:")
	return strings.TrimSpace(strings.SplitN(id, "\n", 2)[0])
}

// loadFenced loads the fenced library with each cut's text replaced (a
// text that is not there exactly once fails t) under a version of its own,
// deleted on cleanup, and answers that version.
func loadFenced(ctx context.Context, t testing.TB, rdb rueidis.Client, cuts [][2]string) string {
	t.Helper()
	code := lua.Fenced
	for _, c := range cuts {
		if strings.Count(code, c[0]) != 1 {
			t.Fatalf("the library no longer holds exactly once the text this cut replaces:\n%s", c[0])
		}
		code = strings.Replace(code, c[0], c[1], 1)
	}
	v := fmt.Sprintf("cut%d", time.Now().UnixNano())
	if err := rdb.Do(ctx, rdb.B().FunctionLoad().FunctionCode(strings.ReplaceAll(code, "{{version}}", v)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rdb.Do(context.Background(), rdb.B().FunctionDelete().LibraryName("imshard_fenced_"+v).Build()).Error()
	})
	return v
}

// library is send i through the library's two calls, as modules/send makes
// them (send.go: attempt.run and Service.postAck).
func (f *sendFixture) library(ctx context.Context, v string, a sendStepArgs, i int64) error {
	topic := f.topics[i%sendStepTopics]
	user := i/sendStepTopics%sendStepMembers + 1
	cid := "c-" + strconv.FormatInt(i, 10)
	member := a.member
	if member != "" {
		member = strconv.FormatInt(user, 10)
	}
	keys := f.keys.Send(topic, user, cid)
	args := append([]string{"owner-" + cid, "60000", "10000", member, a.gid, "", "0", "500", f.event, "3600000"}, a.limits...)
	rep, err := f.rdb.Do(ctx, f.rdb.B().Fcall().Function("imshard_send_"+v).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToArray()
	if err != nil {
		return err
	}
	if st, _ := rep[0].AsInt64(); st != 0 {
		return fmt.Errorf("send replied %d", st)
	}
	if a.noSent {
		return nil
	}
	seq, _ := rep[1].AsInt64()
	pending, _ := rep[5].ToString()
	hot, hotTTL, hotMax := "", "0", "0"
	if a.hot {
		hot, hotTTL, hotMax = f.frame[len(`{"type":"message","message":`):len(f.frame)-1], "86400000", "200"
	}
	keys = []string{keys[0], f.keys.Pending(topic), f.keys.HotMessages(topic), f.keys.Realtime(topic), f.keys.MessagesVersion(topic),
		f.keys.Abandoned(topic)}
	args = []string{strconv.FormatInt(seq, 10), "60000", `{"topic":"t","seq":1}`, hot, hotTTL, hotMax, pending, f.frame}
	out, err := f.rdb.Do(ctx, f.rdb.B().Fcall().Function("imshard_sent_"+v).Numkeys(6).Key(keys...).Arg(args...).Build()).ToArray()
	if err != nil {
		return err
	}
	if n, _ := out[0].AsInt64(); n != 1 {
		return fmt.Errorf("sent replied %v", out[0])
	}
	return nil
}

// reference is send i through the reference send's script and the pipeline
// after its ack (modules/bench, sendref.go).
func (f *sendFixture) reference(ctx context.Context, i int64) error {
	topic := f.topics[i%sendStepTopics]
	idem := f.refKey + "idem:" + topic + ":" + strconv.FormatInt(i, 10)
	pending, hot := f.refKey+"pending:"+topic, f.refKey+"hot:"+topic
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	rep, err := f.ref.Exec(ctx, f.rdb, []string{idem, f.refKey + "seq:" + topic, f.refKey + "active_month", pending},
		[]string{now, now, f.event, "60", now, "202612"}).ToArray()
	if err != nil {
		return err
	}
	seq, _ := rep[0].AsInt64()
	for _, r := range f.rdb.DoMulti(ctx,
		f.rdb.B().Hset().Key(idem).FieldValue().FieldValue("st", "done").Build(),
		f.rdb.B().Zrem().Key(pending).Member(strconv.FormatInt(seq, 10)).Build(),
		f.rdb.B().Zadd().Key(hot).ScoreMember().ScoreMember(float64(seq), f.frame).Build(),
		f.rdb.B().Pexpire().Key(hot).Milliseconds(24*time.Hour.Milliseconds()).Build(),
		f.rdb.B().Spublish().Channel(f.refKey+"rt:"+topic).Message(strconv.FormatInt(seq, 10)).Build()) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// sendChunk is how many sends run between two reads of Redis's stats.
const sendChunk = 500

// measure runs b.N sends of s and b.N of base from 64 goroutines,
// alternating chunks of sendChunk between the two so that what else the
// machine runs falls on both alike, and reports Redis's CPU and the
// calls' own µs per send of s, and how much less CPU s takes than base.
func (f *sendFixture) measure(b *testing.B, s, base side) {
	var cpu, calls, baseCPU float64
	for done, turn := 0, 0; done < b.N; turn++ {
		n := min(sendChunk, b.N-done)
		for j := range 2 {
			sd, acc := s, &cpu
			if (turn+j)%2 == 1 {
				sd, acc = base, &baseCPU
			}
			c, us := f.chunk(b, sd, n)
			*acc += c
			if acc == &cpu {
				calls += us
			}
		}
		done += n
	}
	N := float64(b.N)
	b.ReportMetric(cpu/N, "redis-cpu-µs/send")
	b.ReportMetric(calls/N, "calls-µs/send")
	b.ReportMetric((baseCPU-cpu)/N, "saved-cpu-µs/send")
}

// chunk runs n sends of s from 64 goroutines and answers Redis's CPU µs
// over them and the calls' own µs: the first of s.cmds with its whole time,
// the others (the reference's pipeline, whose commands its script also
// runs) at their mean µs per call, once per send.
func (f *sendFixture) chunk(b *testing.B, s side, n int) (cpu, calls float64) {
	ctx := context.Background()
	before := f.redisStats(ctx, b, s.cmds)
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := s.send(ctx, f.next.Add(1)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	after := f.redisStats(ctx, b, s.cmds)
	f.persisted(ctx, b)
	calls = after.usec[0] - before.usec[0]
	for i := 1; i < len(s.cmds); i++ {
		if c := after.calls[i] - before.calls[i]; c > 0 {
			calls += (after.usec[i] - before.usec[i]) / c * float64(n)
		}
	}
	return after.cpu - before.cpu, calls
}

// persisted empties the topics' pending sets between two chunks, as
// persist keeps them short: the acked marks the library's sends leave
// would otherwise grow them past the compact encoding, and each send's
// pending steps would cost more than the product's.
func (f *sendFixture) persisted(ctx context.Context, b *testing.B) {
	cmds := make(rueidis.Commands, 0, len(f.topics))
	for _, t := range f.topics {
		cmds = append(cmds, f.rdb.B().Del().Key(f.keys.Pending(t)).Build())
	}
	for _, r := range f.rdb.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			b.Fatal(err)
		}
	}
}

// redisStats is the server's CPU µs (user + system) so far, and the named
// commands' calls and µs (commandstats).
type redisStats struct {
	cpu         float64
	calls, usec []float64
}

func (f *sendFixture) redisStats(ctx context.Context, b *testing.B, cmds []string) redisStats {
	info, err := f.rdb.Do(ctx, f.rdb.B().Info().Section("cpu").Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	out := redisStats{calls: make([]float64, len(cmds)), usec: make([]float64, len(cmds))}
	for _, line := range strings.Split(info, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			s, _ := strconv.ParseFloat(val, 64)
			out.cpu += s * 1e6
		}
		for i, c := range cmds {
			if name != "cmdstat_"+c {
				continue
			}
			for _, kv := range strings.Split(val, ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					out.calls[i] = n
				case "usec":
					out.usec[i] = n
				}
			}
		}
	}
	return out
}
