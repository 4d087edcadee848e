package test

import (
	"context"
	"errors"

	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// shardOnly runs just the shard manager (no API, no Kafka clients).
func shardOnly(t *testing.T, opts harness.Options) *harness.Env {
	t.Helper()
	opts.Roles = []string{"shardmgr"}
	return harness.Start(t, opts)
}

// privateRedisEnv runs the shard manager against a Redis server of the
// test's own (to flush, kill or fail over) with a small reservation step,
// so that several steps are crossed.
func privateRedisEnv(t *testing.T) (*testenv.RedisServer, *harness.Env) {
	t.Helper()
	rs := testenv.StartRedis(t)
	env := shardOnly(t, harness.Options{Mutate: func(c *config.Config) {
		c.Redis.Addrs = []string{rs.Addr}
		c.Send.SeqReserveStep = 50
	}})
	return rs, env
}

// allocN allocates n seqs on topic from each of workers goroutines.
func allocN(t *testing.T, alloc *routing.Allocator, tenant, topic string, workers, n int) []routing.Allocation {
	t.Helper()
	var mu sync.Mutex
	var out []routing.Allocation
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]routing.Allocation, 0, n)
			for i := 0; i < n; i++ {
				a, err := alloc.Allocate(context.Background(), tenant, topic)
				if err != nil {
					errs <- err
					return
				}
				local = append(local, a)
			}
			mu.Lock()
			out = append(out, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("allocate: %v", err)
	}
	return out
}

func seqsOf(as []routing.Allocation) []int64 {
	out := make([]int64, len(as))
	for i, a := range as {
		out[i] = a.Seq
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func TestAllocationConcurrentGivesConsecutiveSeqs(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	got := seqsOf(allocN(t, env.App.Allocator(), env.Tenant, "busy", 4, 10000))
	if len(got) != 40000 {
		t.Fatalf("got %d allocations", len(got))
	}
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("seq #%d = %d: seqs are not 1..40000 without gaps or repeats", i, s)
		}
	}
	hi, err := env.App.Allocator().ReservedHi(context.Background(), env.Tenant, "busy")
	if err != nil || hi < 40000 {
		t.Fatalf("durable reservation %d (%v) must cover every seq handed out", hi, err)
	}
}

func TestActiveMonthNeverMovesBackwards(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	ctx := context.Background()
	alloc := env.App.Allocator()
	next := env.Start.Next()
	env.Activate(next)
	if err := alloc.Activate(ctx, env.Tenant, env.Start, "test"); !errors.Is(err, routing.ErrMonthOlder) {
		t.Fatalf("activating an older month: err = %v, want ErrMonthOlder", err)
	}
	// a caller handing the script an older month directly changes nothing
	keys := env.Keys()
	reply, err := env.App.Scripts().Activate.Exec(ctx, env.Redis, []string{keys.ActiveMonth(), keys.ReadyMonths()},
		[]string{env.Start.String(), env.Now().String()}).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := reply[0].AsInt64(); code != 0 {
		t.Fatalf("activate.lua with an older month returned %d, want 0 (no-op)", code)
	}
	a, err := alloc.Allocate(ctx, env.Tenant, "g")
	if err != nil || a.Month != next {
		t.Fatalf("allocation month %s (%v), want %s", a.Month, err, next)
	}
	if err := alloc.Activate(ctx, env.Tenant, env.Now().Next(), "test"); !errors.Is(err, routing.ErrMonthInFuture) {
		t.Fatalf("activating a future month: err = %v, want ErrMonthInFuture", err)
	}
}

func TestAutoAdvanceOnlyToReadyMonths(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	ctx := context.Background()
	keys := env.Keys()
	now := env.Now()
	// the tables after the active month exist, but Redis has not been told they are ready
	for m := env.Start.Next(); !m.After(now.Add(2)); m = m.Next() {
		if err := env.Redis.Do(ctx, env.Redis.B().Zrem().Key(keys.ReadyMonths()).Member(m.String()).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	auto := routing.NewAllocator(routing.AllocatorParams{
		Redis: env.Redis, KeySpace: env.App.KeySpace(), DBs: env.App.Pools(), Catalog: env.App.Catalog(), Scripts: env.App.Scripts(),
		Metrics: env.App.RoutingMetrics(), AutoAdvance: true, ReserveStep: 100,
	})
	t.Cleanup(auto.Close)
	month := func() routing.Month {
		t.Helper()
		a, err := auto.Allocate(ctx, env.Tenant, "g")
		if err != nil {
			t.Fatal(err)
		}
		return a.Month
	}
	if m := month(); m != env.Start {
		t.Fatalf("with no newer ready month the month moved to %s", m)
	}
	if err := auto.MarkReady(ctx, env.Tenant, now.Prev()); err != nil {
		t.Fatal(err)
	}
	if m := month(); m != now.Prev() {
		t.Fatalf("month %s, want the newest ready month %s", m, now.Prev())
	}
	recorded, err := routing.RecordedActive(ctx, env.DB)
	if err != nil || recorded != now.Prev() {
		t.Fatalf("MySQL recorded %s (%v): the switch must be recorded before Redis", recorded, err)
	}
	if err := auto.MarkReady(ctx, env.Tenant, now.Next(), now); err != nil {
		t.Fatal(err)
	}
	if m := month(); m != now {
		t.Fatalf("month %s, want %s — never a month after the Redis-time month", m, now)
	}
}

func TestMonthSwitchDrivenByEnsureFromAndActivate(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	ctx := context.Background()
	alloc := env.App.Allocator()
	var got []routing.Allocation
	for step := 0; step < 3; step++ {
		m := env.Start.Add(step)
		if step > 0 {
			env.Activate(m)
		}
		for i := 0; i < 5; i++ {
			a, err := alloc.Allocate(ctx, env.Tenant, "g")
			if err != nil {
				t.Fatal(err)
			}
			if a.Month != m {
				t.Fatalf("step %d: month %s, want %s", step, a.Month, m)
			}
			got = append(got, a)
		}
	}
	for i, a := range got {
		if a.Seq != int64(i+1) {
			t.Fatalf("seq %d at #%d: seqs must continue across months", a.Seq, i)
		}
	}
	// the switch sealed nothing yet, but the older months started sealing at the next patrol
	res := env.App.NewShardManager().SyncTenant(ctx, env.Tenant, shardmgr.Options{MonthsAhead: -1})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	_, st, err := env.App.Catalog().Table(ctx, env.Tenant, env.Start)
	if err != nil || st != routing.StatusSealing {
		t.Fatalf("previous active month status %s (%v), want sealing", st, err)
	}
}

func TestActiveMonthAndSeqRecoveredAfterRedisKeysDeleted(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	ctx := context.Background()
	alloc := env.App.Allocator()
	env.Activate(env.Start.Next())
	var last int64
	for i := 0; i < 10; i++ {
		a, err := alloc.Allocate(ctx, env.Tenant, "g")
		if err != nil {
			t.Fatal(err)
		}
		last = a.Seq
	}
	if err := testenv.DeleteTenantKeys(ctx, env.Redis, env.Tenant); err != nil {
		t.Fatal(err)
	}
	a, err := alloc.Allocate(ctx, env.Tenant, "g")
	if err != nil {
		t.Fatal(err)
	}
	if a.Month != env.Start.Next() {
		t.Fatalf("recovered month %s, want the recorded %s", a.Month, env.Start.Next())
	}
	if a.Seq <= last {
		t.Fatalf("seq %d after losing Redis, but %d was already issued", a.Seq, last)
	}
}

func TestSeqNeverReissuedWhenRedisIsFlushedScriptlessOrRestarted(t *testing.T) {
	t.Parallel()
	rs, env := privateRedisEnv(t)
	alloc := env.App.Allocator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := map[int64]bool{}
	dup := int64(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				a, err := alloc.Allocate(ctx, env.Tenant, "g")
				if err != nil {
					time.Sleep(5 * time.Millisecond) // Redis is down: callers retry
					continue
				}
				mu.Lock()
				if seen[a.Seq] {
					dup = a.Seq
				}
				seen[a.Seq] = true
				mu.Unlock()
			}
		}()
	}
	waitFor(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) > 300 })
	if err := env.Redis.Do(ctx, env.Redis.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := len(seen)
	mu.Unlock()
	waitFor(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) > before+300 })
	// a server that forgot the scripts answers NOSCRIPT; EVALSHA falls back to EVAL
	if err := env.Redis.Do(ctx, env.Redis.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before = len(seen)
	mu.Unlock()
	waitFor(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) > before+300 })
	rs.Kill()
	rs.Start()
	mu.Lock()
	before = len(seen)
	mu.Unlock()
	waitFor(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) > before+300 })
	close(stop)
	wg.Wait()
	if dup != 0 {
		t.Fatalf("seq %d was issued twice across a Redis flush/restart", dup)
	}
}

// TestAcceptance15_NodesAgreeOnActiveMonthAcrossSwitch: several nodes
// allocating while the month switches get one active month, no duplicate
// seq, and non-overlapping month ranges per topic.
func TestAcceptance15_NodesAgreeOnActiveMonthAcrossSwitch(t *testing.T) {
	t.Parallel()
	first := shardOnly(t, harness.Options{})
	nodes := []*harness.Env{first}
	for i := 0; i < 2; i++ {
		nodes = append(nodes, shardOnly(t, harness.Options{Tenant: first.Tenant}))
	}
	topics := []string{"t1", "t2", "t3"}
	next := first.Start.Next()
	var mu sync.Mutex
	byTopic := map[string][]routing.Allocation{}
	var wg sync.WaitGroup
	switched := make(chan struct{})
	for _, n := range nodes {
		for _, topic := range topics {
			wg.Add(1)
			go func(alloc *routing.Allocator, topic string) {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					if i == 100 {
						<-switched
					}
					a, err := alloc.Allocate(context.Background(), first.Tenant, topic)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					byTopic[topic] = append(byTopic[topic], a)
					mu.Unlock()
				}
			}(n.App.Allocator(), topic)
		}
	}
	time.Sleep(20 * time.Millisecond)
	nodes[1].Activate(next)
	close(switched)
	wg.Wait()
	for topic, as := range byTopic {
		sort.Slice(as, func(i, j int) bool { return as[i].Seq < as[j].Seq })
		for i, a := range as {
			if a.Seq != int64(i+1) {
				t.Fatalf("%s: seq #%d is %d: duplicate or missing seq", topic, i, a.Seq)
			}
			if i > 0 && a.Month.Before(as[i-1].Month) {
				t.Fatalf("%s: seq %d in %s after seq %d in %s: month ranges overlap", topic, a.Seq, a.Month, as[i-1].Seq, as[i-1].Month)
			}
		}
		if as[len(as)-1].Month != next {
			t.Fatalf("%s: last allocation in %s, want %s", topic, as[len(as)-1].Month, next)
		}
	}
	for _, n := range nodes {
		m, err := n.App.Allocator().ActiveMonth(context.Background(), first.Tenant)
		if err != nil || m != next {
			t.Fatalf("a node sees active month %s (%v), want %s", m, err, next)
		}
	}
}

func TestAllocationOnRedisCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartRedisCluster(t, 3)
	env := shardOnly(t, harness.Options{Mutate: func(c *config.Config) { c.Redis.Addrs = addrs }})
	got := seqsOf(allocN(t, env.App.Allocator(), env.Tenant, "g", 2, 500))
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("cluster: seq #%d = %d", i, s)
		}
	}
	if err := testenv.DeleteTenantKeys(context.Background(), env.Redis, env.Tenant); err != nil {
		t.Fatal(err)
	}
	a, err := env.App.Allocator().Allocate(context.Background(), env.Tenant, "g")
	if err != nil || a.Seq <= 1000 || a.Month != env.Start {
		t.Fatalf("after losing the cluster's keys: %+v %v", a, err)
	}
}

func TestShardEnsureIsIdempotentAndSafeConcurrently(t *testing.T) {
	t.Parallel()
	first := shardOnly(t, harness.Options{})
	second := shardOnly(t, harness.Options{Tenant: first.Tenant})
	ctx := context.Background()
	from := first.Now().Add(-8)
	var wg sync.WaitGroup
	results := make([]shardmgr.Result, 4)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			env := first
			if i%2 == 1 {
				env = second
			}
			results[i] = env.App.NewShardManager().SyncTenant(ctx, first.Tenant, shardmgr.Options{MonthsAhead: 3, From: from})
		}(i)
	}
	wg.Wait()
	created := 0
	for _, r := range results {
		if r.Err != nil {
			t.Fatalf("concurrent ensure: %v", r.Err)
		}
		created += len(r.Created)
	}
	want := shardmgr.ExpectedMonths(first.Now(), 3, from)
	// the harness created cur-3..cur+2 already; the rest is created exactly once
	if created != 5+1 {
		t.Fatalf("created %d tables across concurrent runs, want 6 (each once)", created)
	}
	shards, err := routing.ListShards(ctx, first.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != len(want) {
		t.Fatalf("catalog has %d months, want %d", len(shards), len(want))
	}
	var tables int
	if err := sq.Select("COUNT(*)").From("information_schema.TABLES").Where("TABLE_SCHEMA = DATABASE()").
		Where(sq.Like{"TABLE_NAME": `im\_group\_messages\_%`}).RunWith(first.DB).QueryRow().Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != len(want) {
		t.Fatalf("%d month tables exist, want %d", tables, len(want))
	}
	for _, s := range shards {
		if s.Status == routing.StatusPrepared {
			t.Fatalf("month %s left prepared", s.Month)
		}
	}
	again := first.App.NewShardManager().SyncTenant(ctx, first.Tenant, shardmgr.Options{MonthsAhead: 3, From: from})
	if again.Err != nil || len(again.Created) != 0 || len(again.Writable) != 0 {
		t.Fatalf("second ensure changed things: %+v", again)
	}
}

// TestAcceptance14_IllegalMonthsAndTableNamesRejected: names outside the
// whitelist, or months the catalog does not register, are refused before
// any SQL touches such a table.
func TestAcceptance14_IllegalMonthsAndTableNamesRejected(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	ctx := context.Background()
	for _, s := range []string{"202313", "000000", "20261", "2026-1", "'202601", "202601; DROP TABLE im_dellog"} {
		if _, err := routing.ParseMonth(s); !errors.Is(err, routing.ErrInvalidMonth) {
			t.Errorf("month %q accepted", s)
		}
	}
	for _, s := range []string{"im_group_messages", "im_group_messages_legacy", "im_group_messages_202613", "im_dellog", "im_group_messages_202601`; --"} {
		if _, err := routing.ParseTable(s); !errors.Is(err, routing.ErrInvalidTable) {
			t.Errorf("table %q accepted", s)
		}
	}
	// a physically present but unregistered month table is still refused
	old := routing.MustMonth("201001")
	tb, _ := routing.TableFor(old)
	if _, err := env.DB.ExecContext(ctx, tb.CreateDDL()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := env.App.Catalog().Table(ctx, env.Tenant, old); !errors.Is(err, routing.ErrShardNotRegistered) {
		t.Fatalf("unregistered month %s: err = %v, want ErrShardNotRegistered", old, err)
	}
	if err := env.App.NewShardManager().Seal(ctx, env.Tenant, old); !errors.Is(err, routing.ErrShardNotRegistered) {
		t.Fatalf("sealing an unregistered month: %v", err)
	}
	if _, _, err := env.App.Catalog().Table(ctx, env.Tenant, env.Start); err != nil {
		t.Fatalf("registered month refused: %v", err)
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	if !pollUntil(d, cond) {
		t.Fatalf("condition not met within %v", d)
	}
}

// allocUpTo allocates on topic until the counter reaches at least n and
// returns the highest seq issued.
func allocUpTo(t *testing.T, alloc *routing.Allocator, tenant, topic string, n int64) int64 {
	t.Helper()
	var last int64
	for last < n {
		a, err := alloc.Allocate(context.Background(), tenant, topic)
		if err != nil {
			t.Fatal(err)
		}
		last = a.Seq
	}
	return last
}

// TestSeqNeverReissuedAfterRestartFromSnapshot: a Redis restarted from an
// RDB snapshot holds counters older than what it issued before the crash;
// the counters carry the run_id of the server that seeded them, so the
// restarted server re-seeds them from MySQL instead of counting on.
func TestSeqNeverReissuedAfterRestartFromSnapshot(t *testing.T) {
	t.Parallel()
	rs, env := privateRedisEnv(t)
	ctx := context.Background()
	alloc := env.App.Allocator()
	allocUpTo(t, alloc, env.Tenant, "g", 100)
	if err := env.Redis.Do(ctx, env.Redis.B().Save().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	issued := allocUpTo(t, alloc, env.Tenant, "g", 200)
	rs.Kill()
	rs.Start() // loads the snapshot: counter 100, stamped by the dead server
	var a routing.Allocation
	waitFor(t, 20*time.Second, func() bool {
		var err error
		a, err = alloc.Allocate(ctx, env.Tenant, "g")
		return err == nil
	})
	if a.Seq <= issued {
		t.Fatalf("seq %d issued again after a restart from a snapshot (highest before the crash: %d)", a.Seq, issued)
	}
}

// TestSeqNeverReissuedAfterFailover: a replica holds the counters its last
// full sync copied; promoted, it must not count on from them.
func TestSeqNeverReissuedAfterFailover(t *testing.T) {
	t.Parallel()
	master, env := privateRedisEnv(t)
	ctx := context.Background()
	allocUpTo(t, env.App.Allocator(), env.Tenant, "g", 100)
	host, port, _ := strings.Cut(master.Addr, ":")
	replica := testenv.StartRedis(t, "--replicaof", host, port)
	rep := testenv.RedisClient(t, replica.Addr)
	waitFor(t, 20*time.Second, func() bool {
		info, err := rep.Do(ctx, rep.B().Info().Section("replication").Build()).ToString()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	issued := allocUpTo(t, env.App.Allocator(), env.Tenant, "g", 200) // not replicated: master-only
	master.Kill()
	if err := rep.Do(ctx, rep.B().Replicaof().No().One().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	promoted := routing.NewAllocator(routing.AllocatorParams{
		Redis: rep, KeySpace: env.App.KeySpace(), DBs: env.App.Pools(), Catalog: env.App.Catalog(), Scripts: env.App.Scripts(),
		Metrics: env.App.RoutingMetrics(), ReserveStep: 50,
	})
	t.Cleanup(promoted.Close)
	a, err := promoted.Allocate(ctx, env.Tenant, "g")
	if err != nil {
		t.Fatal(err)
	}
	if a.Seq <= issued {
		t.Fatalf("promoted replica issued seq %d again (highest on the old master: %d)", a.Seq, issued)
	}
	if a.Month != env.Start {
		t.Fatalf("promoted replica's active month %s, want %s", a.Month, env.Start)
	}
}
