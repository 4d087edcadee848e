package routing_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// SettledResolve, from one pipelined read, gives what Settled gives: the
// seq below the oldest pending one still in time, or — past the produce
// timeout — Settled's full pass, which records the stale seqs as gaps.
func TestSettledResolveIsSettled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	flight := routing.NewFlight(rdb, routing.NewScripts(), time.Minute)
	tenant := testenv.NewTenant(t)
	keys, err := routing.KeysFor(tenant)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	pend := func(topic string, seq int64, at string) {
		if err := rdb.Do(ctx, rdb.B().Zadd().Key(keys.Pending(topic)).ScoreMember().
			ScoreMember(float64(seq), strconv.FormatInt(seq, 10)+":"+at).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	pend("fresh", 5, strconv.FormatInt(now, 10))
	pend("fresh", 6, strconv.FormatInt(now, 10))
	pend("acked", 4, "a")
	pend("stale", 3, strconv.FormatInt(now-time.Hour.Milliseconds(), 10))
	pend("stale", 7, strconv.FormatInt(now, 10))
	pend("foreign", 2, "x") // not a time: treated as in flight, as Settled does
	for topic, want := range map[string]int64{"none": routing.Unsettled, "fresh": 4, "acked": 3, "stale": 6, "foreign": 1} {
		got, err := flight.SettledResolve(ctx, tenant, topic, rdb.DoMulti(ctx, flight.SettledCmds(keys, topic)...))
		if err != nil || got != want {
			t.Errorf("%s: SettledResolve %d %v, want %d", topic, got, err, want)
		}
		if again, err := flight.Settled(ctx, tenant, topic); err != nil || again != want {
			t.Errorf("%s: Settled %d %v, want %d", topic, again, err, want)
		}
	}
	if gaps, err := flight.Gaps(ctx, tenant, "stale", 1, 10); err != nil || len(gaps) != 1 || gaps[0] != 3 {
		t.Fatalf("the stale seq became a gap: %v %v", gaps, err)
	}
}
