package routing_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

func redisClient(t testing.TB) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.RedisAddr()}, DisableCache: true})
	if err != nil {
		t.Fatalf("redis: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// noPrefix is the key space of an installation without redis.key_prefix.
func noPrefix(t testing.TB) routing.KeySpace {
	t.Helper()
	s, err := routing.NewKeySpace("")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A multi-topic settle (more topics than one script chunk, some routes
// already present, several months per topic, a topic without ranges) leaves
// every route exactly as per-topic merges do.
func TestSettleMergesAsPerTopicMerges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	routes := routing.NewRoutes(rdb, noPrefix(t), routing.NewScripts())
	single, many := testenv.NewTenant(t), testenv.NewTenant(t)
	m1, m2 := routing.MustMonth("202607"), routing.MustMonth("202608")
	const topics = 300
	var batch []routing.Settlement
	for i := range topics {
		topic := fmt.Sprintf("t%03d", i)
		base := int64(i * 1000)
		if i%3 == 0 { // an existing route the merge widens
			prior := []routing.MonthRange{{Month: m1, MinSeq: base + 50, MaxSeq: base + 60, Count: 11}}
			for _, tenant := range []string{single, many} {
				if err := routes.Merge(ctx, tenant, topic, prior...); err != nil {
					t.Fatal(err)
				}
			}
		}
		var ranges []routing.MonthRange
		switch i % 4 {
		case 0:
			ranges = []routing.MonthRange{{Month: m1, MinSeq: base + 1, MaxSeq: base + 70, Count: 59}}
		case 1:
			ranges = []routing.MonthRange{{Month: m1, MinSeq: base + 1, MaxSeq: base + 9, Count: 9},
				{Month: m2, MinSeq: base + 10, MaxSeq: base + 12, Count: 3}}
		case 2:
			ranges = []routing.MonthRange{{Month: m2, MinSeq: base + 55, MaxSeq: base + 58, Count: 4}}
		case 3: // nothing to merge: the topic must stay untouched
		}
		batch = append(batch, routing.Settlement{Topic: topic, Ranges: ranges})
		if err := routes.Merge(ctx, single, topic, ranges...); err != nil {
			t.Fatal(err)
		}
	}
	if err := routes.Settle(ctx, many, batch); err != nil {
		t.Fatal(err)
	}
	for i := range topics {
		topic := fmt.Sprintf("t%03d", i)
		want, wantFound, err := routes.Load(ctx, single, topic)
		if err != nil {
			t.Fatal(err)
		}
		got, gotFound, err := routes.Load(ctx, many, topic)
		if err != nil {
			t.Fatal(err)
		}
		if gotFound != wantFound || !slices.Equal(got, want) {
			t.Fatalf("topic %s: Settle gave %v (found %v), per-topic merges %v (found %v)", topic, got, gotFound, want, wantFound)
		}
		if i%12 == 0 && (len(got) != 1 || got[0] != (routing.MonthRange{Month: m1, MinSeq: int64(i*1000) + 1, MaxSeq: int64(i*1000) + 70, Count: 70})) {
			t.Fatalf("topic %s: merged route %v", topic, got)
		}
	}
	if err := routes.Settle(ctx, many, nil); err != nil {
		t.Fatalf("empty Settle: %v", err)
	}
}

// MarkPersistedMany removes exactly the given seqs of each topic (runs of
// consecutive seqs in one removal) and leaves seqs in between pending.
func TestMarkPersistedMany(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	tenant := testenv.NewTenant(t)
	keys, err := noPrefix(t).Tenant(tenant)
	if err != nil {
		t.Fatal(err)
	}
	flight := routing.NewFlight(rdb, noPrefix(t), routing.NewScripts(), nil, time.Minute, nil)
	for _, topic := range []string{"a", "b", "c"} {
		for seq := int64(1); seq <= 10; seq++ {
			v := strconv.FormatInt(seq, 10)
			if err := rdb.Do(ctx, rdb.B().Zadd().Key(keys.Pending(topic)).ScoreMember().
				ScoreMember(float64(seq), v+":1").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := flight.MarkPersistedMany(ctx, tenant, map[string][]int64{
		"a": {7, 1, 2, 3, 5, 8, 3},
		"b": {10},
		"c": nil,
	}); err != nil {
		t.Fatal(err)
	}
	if err := flight.MarkPersisted(ctx, tenant, "c", 4, 6); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"a": {"4:1", "6:1", "9:1", "10:1"},
		"b": {"1:1", "2:1", "3:1", "4:1", "5:1", "6:1", "7:1", "8:1", "9:1"},
		"c": {"1:1", "2:1", "3:1", "5:1", "7:1", "8:1", "9:1", "10:1"},
	}
	for topic, w := range want {
		got, err := rdb.Do(ctx, rdb.B().Zrange().Key(keys.Pending(topic)).Min("0").Max("-1").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, w) {
			t.Fatalf("pending %s = %v, want %v", topic, got, w)
		}
	}
}

// Settle takes each topic's stored seqs out of its pending set and marks
// its existing idempotency records done — never recreating an expired one —
// also when a topic has more records than one script call takes.
func TestSettleClearsPendingAndMarksIdempotencyDone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	tenant := testenv.NewTenant(t)
	keys, err := noPrefix(t).Tenant(tenant)
	if err != nil {
		t.Fatal(err)
	}
	routes := routing.NewRoutes(rdb, noPrefix(t), routing.NewScripts())
	const big = 600 // records of topic "big": more than one call takes
	var settle []routing.Settlement
	expired := map[string]bool{}
	for _, topic := range []string{"small", "big", "none"} {
		n := map[string]int{"small": 5, "big": big, "none": 0}[topic]
		st := routing.Settlement{Topic: topic}
		for i := range n {
			seq := int64(i + 1)
			if err := rdb.Do(ctx, rdb.B().Zadd().Key(keys.Pending(topic)).ScoreMember().
				ScoreMember(float64(seq), strconv.FormatInt(seq, 10)+":1").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			k := keys.Idempotency(topic, int64(i), "cm"+strconv.Itoa(i))
			st.Idem = append(st.Idem, k)
			if i%50 == 2 {
				expired[k] = true
				continue
			}
			if err := rdb.Do(ctx, rdb.B().Hset().Key(k).FieldValue().FieldValue("status", "acked").FieldValue("event", "{}").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if i != 3 { // seq 4 stays pending
				st.Seqs = append(st.Seqs, seq)
			}
		}
		settle = append(settle, st)
	}
	if err := routes.Settle(ctx, tenant, settle); err != nil {
		t.Fatal(err)
	}
	for _, st := range settle {
		left, err := rdb.Do(ctx, rdb.B().Zrange().Key(keys.Pending(st.Topic)).Min("0").Max("-1").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		// seq 4 and the seqs of expired records were not settled
		for _, m := range left {
			seq, _ := strconv.Atoi(m[:len(m)-2])
			if seq != 4 && !expired[keys.Idempotency(st.Topic, int64(seq-1), "cm"+strconv.Itoa(seq-1))] {
				t.Fatalf("%s: seq %d still pending", st.Topic, seq)
			}
		}
		for _, k := range st.Idem {
			got, err := rdb.Do(ctx, rdb.B().Hgetall().Key(k).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			if expired[k] {
				if len(got) != 0 {
					t.Fatalf("expired record came back: %v", got)
				}
				continue
			}
			if got["status"] != "done" || got["event"] != "{}" {
				t.Fatalf("record %s = %v", k, got)
			}
		}
	}
}
