package stream

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// hubFollower is a follower of topic whose socket only queues what the
// hub offers it (closed: no pump starts).
func hubFollower(s *Server, tenant, topic string) *follow {
	c := &conn{s: s, p: httpapi.Principal{Tenant: tenant, UserID: 1}, closed: true, done: make(chan struct{})}
	return &follow{c: c, topic: topic}
}

// changeSeqs takes the seqs of the change events queued for f's socket.
func changeSeqs(f *follow) []int64 {
	f.c.qmu.Lock()
	q := f.c.queue
	f.c.queue = nil
	f.c.qmu.Unlock()
	var seqs []int64
	for _, d := range q {
		if d.ev.kind == evChange {
			seqs = append(seqs, d.ev.seq)
		}
	}
	return seqs
}

// The hub receives every channel of a process on one connection and one
// read loop (a standalone Redis has no slots): joining hundreds of topics
// adds no goroutine per topic, and channels joined and left while
// publications flow lose nothing on the channels that stay.
func TestHubManyChannelsOnOneReader(t *testing.T) {
	tenant := testenv.NewTenant(t)
	rdb := testenv.Redis(t)
	space, err := routing.NewKeySpace("hub:")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(nil)
	h := newHub(rdb, space, m, zerolog.Nop(), time.Hour)
	defer h.close()
	s := &Server{lim: Limits{SendQueue: 1 << 20}, m: m, hub: h}
	keys, err := space.Tenant(tenant)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	const stay, churn = 200, 100
	before := runtime.NumGoroutine()
	stayers := make([]*follow, stay)
	for i := range stayers {
		stayers[i] = hubFollower(s, tenant, "stay"+strconv.Itoa(i))
		if err := h.join(ctx, stayers[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := runtime.NumGoroutine() - before; n > 5 {
		t.Fatalf("%d goroutines for %d channels, want a handful for the process", n, stay)
	}
	h.mu.Lock()
	readers := len(h.readers)
	h.mu.Unlock()
	if readers != 1 {
		t.Fatalf("%d readers, want 1", readers)
	}

	// publish on every staying channel while other channels come and go
	// (on the same connection: their SSUBSCRIBE and SUNSUBSCRIBE go
	// between the publications)
	var stop atomic.Bool
	published := make([]int64, stay)
	var pub sync.WaitGroup
	pub.Add(1)
	go func() {
		defer pub.Done()
		for seq := int64(1); !stop.Load(); seq++ {
			cmds := make(rueidis.Commands, 0, stay)
			for i := range stay {
				frame := fmt.Sprintf(`{"type":"change","change":{"seq":%d,"change_seq":%d}}`, seq, seq)
				cmds = append(cmds, rdb.B().Spublish().Channel(keys.Realtime("stay"+strconv.Itoa(i))).Message(frame).Build())
			}
			for i, r := range rdb.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					t.Errorf("spublish: %v", err)
					return
				}
				published[i] = seq
			}
			time.Sleep(10 * time.Millisecond) // a rate the read loop keeps up with under -race
		}
	}()
	for round := range 5 {
		var churners []*follow
		for i := range churn {
			f := hubFollower(s, tenant, fmt.Sprintf("churn%d-%d", round, i%(churn/2)))
			if err := h.join(ctx, f); err != nil {
				t.Fatal(err)
			}
			churners = append(churners, f)
		}
		for _, f := range churners {
			h.leave(f)
		}
	}
	stop.Store(true)
	pub.Wait()

	// every publication reaches the staying channels, in order
	for i, f := range stayers {
		want := published[i]
		var got []int64
		deadline := time.Now().Add(10 * time.Second)
		for (len(got) == 0 || got[len(got)-1] < want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			got = append(got, changeSeqs(f)...)
		}
		if int64(len(got)) != want {
			t.Fatalf("channel %d received %d publications, %d published", i, len(got), want)
		}
		for j, seq := range got {
			if seq != int64(j+1) {
				t.Fatalf("channel %d: publication %d is seq %d", i, j, seq)
			}
		}
	}
	for _, f := range stayers {
		h.leave(f)
	}
	waitFor(t, "every channel unsubscribed", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.topics) == 0 && len(h.readers) == 0
	})
	n, err := rdb.Do(ctx, rdb.B().PubsubShardchannels().Pattern(keys.TenantPattern()).Build()).AsStrSlice()
	if err != nil || len(n) != 0 {
		t.Fatalf("channels still subscribed on Redis: %v %v", n, err)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A topic's followers check their memberships again at once when they are
// few, and spread over at most half an ACL interval when they are many.
func TestACLSpread(t *testing.T) {
	every := 500 * time.Millisecond
	for _, c := range []struct {
		followers int
		want      time.Duration
	}{
		{1, 0},
		{aclSpreadFrom, 0},
		{100, 100 * aclSpreadEach},
		{5000, every / 2},
	} {
		if got := aclSpread(c.followers, every); got != c.want {
			t.Errorf("aclSpread(%d) = %v, want %v", c.followers, got, c.want)
		}
	}
}

// On Redis Cluster the hub holds one connection per slot its channels fall
// in (a tenant's channels share one), on the node owning the slot: the
// channels of several tenants, spread over the nodes, each receive their
// publications.
func TestHubClusterReaderPerSlot(t *testing.T) {
	rdb := testenv.RedisClient(t, testenv.StartRedisCluster(t, 3)...)
	space, err := routing.NewKeySpace("")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(nil)
	h := newHub(rdb, space, m, zerolog.Nop(), time.Hour)
	defer h.close()
	s := &Server{lim: Limits{SendQueue: 1 << 10}, m: m, hub: h}
	ctx := context.Background()

	tenants := []string{"hubslot0", "hubslot1", "hubslot2", "hubslot3", "hubslot4", "hubslot5"}
	slots := map[uint16]bool{}
	var follows []*follow
	for _, tenant := range tenants {
		keys, err := space.Tenant(tenant)
		if err != nil {
			t.Fatal(err)
		}
		cmd := rdb.B().Spublish().Channel(keys.Realtime("t")).Message("").Build()
		slots[cmd.Slot()] = true
		for i := range 3 {
			f := hubFollower(s, tenant, "t"+strconv.Itoa(i))
			if err := h.join(ctx, f); err != nil {
				t.Fatal(err)
			}
			follows = append(follows, f)
		}
	}
	h.mu.Lock()
	readers := len(h.readers)
	h.mu.Unlock()
	if readers != len(slots) {
		t.Fatalf("%d readers for channels in %d slots", readers, len(slots))
	}
	for _, f := range follows {
		keys, _ := h.keys.Tenant(f.c.p.Tenant)
		if err := rdb.Do(ctx, rdb.B().Spublish().Channel(keys.Realtime(f.topic)).Message(`{"type":"change","change":{"seq":1,"change_seq":1}}`).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range follows {
		var got []int64
		waitFor(t, "the publication of "+f.c.p.Tenant+"/"+f.topic, func() bool {
			got = append(got, changeSeqs(f)...)
			return len(got) > 0
		})
		if len(got) != 1 || got[0] != 1 {
			t.Fatalf("%s/%s received %v", f.c.p.Tenant, f.topic, got)
		}
	}
}
