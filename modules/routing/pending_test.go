package routing_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// BoundResolve, from one pipelined read, gives what Bound gives: the
// last issued seq, lowered below the oldest pending one still in time, or
// — past the produce timeout — below the oldest after a full pass, which
// records the stale seqs as gaps.
func TestSettledResolveIsSettled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	flight := routing.NewFlight(rdb, noPrefix(t), routing.NewScripts(), nil, time.Minute, nil)
	tenant := testenv.NewTenant(t)
	keys, err := noPrefix(t).Tenant(tenant)
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
	pend("foreign", 2, "x") // not a time: treated as in flight, as Bound does
	issued := map[string]int64{"none": 10, "fresh": 10, "acked": 10, "stale": 10, "foreign": 10, "low": 3}
	pend("low", 9, "a") // above the counter read before it: allocated after that read
	for topic, n := range issued {
		if err := rdb.Do(ctx, rdb.B().Set().Key(keys.Seq(topic)).Value(strconv.FormatInt(n, 10)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for topic, want := range map[string]int64{"none": 10, "fresh": 4, "acked": 3, "stale": 6, "foreign": 1, "low": 3} {
		got, err := flight.BoundResolve(ctx, tenant, topic, rdb.DoMulti(ctx, flight.BoundCmds(keys, topic)...))
		if err != nil || got.Settled != want || !got.Counted {
			t.Errorf("%s: BoundResolve %+v %v, want %d (counted)", topic, got, err, want)
		}
		if again, err := flight.Bound(ctx, tenant, topic); err != nil || again.Settled != want {
			t.Errorf("%s: Bound %+v %v, want %d", topic, again, err, want)
		}
	}
	if gaps, err := flight.Gaps(ctx, tenant, "stale", 1, 10); err != nil || len(gaps) != 1 || gaps[0] != 3 {
		t.Fatalf("the stale seq became a gap: %v %v", gaps, err)
	}
}

// MirrorBound proves a prefix of seqs stored only from months that start
// right after the previous one and count one row per seq of their range.
func TestMirrorBoundIsTheProvenPrefix(t *testing.T) {
	m1, _ := routing.ParseMonth("202601")
	m2, _ := routing.ParseMonth("202602")
	r := func(m routing.Month, lo, hi, n int64) routing.MonthRange {
		return routing.MonthRange{Month: m, MinSeq: lo, MaxSeq: hi, Count: n}
	}
	for _, tc := range []struct {
		name   string
		ranges []routing.MonthRange
		want   int64
	}{
		{"nothing stored", nil, 0},
		{"whole months", []routing.MonthRange{r(m1, 1, 20, 20), r(m2, 21, 30, 10)}, 30},
		{"lower seqs still on their way", []routing.MonthRange{r(m1, 7, 8, 2)}, 0},
		{"a hole inside a month", []routing.MonthRange{r(m1, 1, 20, 20), r(m2, 21, 30, 9)}, 21},
		{"a hole between months", []routing.MonthRange{r(m1, 1, 20, 20), r(m2, 23, 30, 8)}, 20},
		{"oldest month dropped", []routing.MonthRange{r(m2, 21, 30, 10)}, 0},
	} {
		if got := routing.MirrorBound(tc.ranges); got.Settled != tc.want || got.Counted {
			t.Errorf("%s: %+v, want %d (not counted)", tc.name, got, tc.want)
		}
	}
}

// A resume fence (the member "from:f:to:T0ms" at score 0) holds the
// settled watermark below its first seq, whatever is issued or pending
// above it, until persist's published time reaches T0 plus the produce
// timeout; then the first reader lifts it: its seqs without a stored row
// become gaps — except one a send retry tracks on its own again — and the
// watermark goes on to the next seq in flight.
func TestSettledStopsBelowAResumeFenceUntilPersistPassesIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	tenant, db := testenv.MigratedTenantDB(t)
	flight := routing.NewFlight(rdb, noPrefix(t), routing.NewScripts(), &countingDBs{db: db}, time.Minute, nil)
	keys, err := noPrefix(t).Tenant(tenant)
	if err != nil {
		t.Fatal(err)
	}
	now, err := routing.NewClock(rdb).Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := now.UnixMilli()
	at := func(ms int64) string { return strconv.FormatInt(ms, 10) }
	// stored: 1-3 and 5 (whole months); the fence covers 3-10, re-seeded
	// at 10; 11 was sent after the re-seed and acknowledged; 7 is a
	// retry's re-produce, in flight on its own
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		return routing.WidenMirror(ctx, tx, []routing.MirrorRow{
			{Topic: "t", MonthRange: routing.MonthRange{Month: routing.MustMonth("202601"), MinSeq: 1, MaxSeq: 3, Count: 3}, MinCreatedAt: now, MaxCreatedAt: now},
			{Topic: "t", MonthRange: routing.MonthRange{Month: routing.MustMonth("202602"), MinSeq: 5, MaxSeq: 5, Count: 1}, MinCreatedAt: now, MaxCreatedAt: now},
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range rdb.DoMulti(ctx,
		rdb.B().Set().Key(keys.Seq("t")).Value("11").Build(),
		rdb.B().Zadd().Key(keys.Pending("t")).ScoreMember().ScoreMember(0, "3:f:10:"+at(t0)).
			ScoreMember(7, "7:"+at(t0)).ScoreMember(11, "11:a").Build(),
	) {
		if err := c.Error(); err != nil {
			t.Fatal(err)
		}
	}
	settled := func(want int64) {
		t.Helper()
		got, err := flight.BoundResolve(ctx, tenant, "t", rdb.DoMulti(ctx, flight.BoundCmds(keys, "t")...))
		if err != nil || got.Settled != want {
			t.Fatalf("settled %+v %v, want %d", got, err, want)
		}
	}
	settled(2) // persist published nothing
	for _, persisted := range []int64{t0, t0 + time.Minute.Milliseconds() - 1} {
		if err := rdb.Do(ctx, rdb.B().Set().Key(keys.PersistedBefore()).Value(at(persisted)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		settled(2)
	}
	if gaps, err := flight.Gaps(ctx, tenant, "t", 1, 20); err != nil || len(gaps) != 0 {
		t.Fatalf("gaps while the fence stands: %v %v", gaps, err)
	}
	if err := rdb.Do(ctx, rdb.B().Set().Key(keys.PersistedBefore()).Value(at(t0+time.Minute.Milliseconds())).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	settled(6)
	gaps, err := flight.Gaps(ctx, tenant, "t", 1, 20)
	if want := []int64{4, 6, 8, 9, 10}; err != nil || !slices.Equal(gaps, want) {
		t.Fatalf("gaps after the lift %v %v, want %v", gaps, err, want)
	}
	if n, err := rdb.Do(ctx, rdb.B().Zcard().Key(keys.Pending("t")).Build()).AsInt64(); err != nil || n != 2 {
		t.Fatalf("pending after the lift: %d %v, want the retry's and 11's entries", n, err)
	}
}
