package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// rpTopicModel is one randomly built topic: which seqs exist, in which
// month, and which one user may see.
type rpTopicModel struct {
	topic   string
	visible []int64 // ascending: persisted, not globally deleted, not hidden from rpMember
	gaps    []int64 // ascending: the recorded gaps
}

// rpRandomTopic writes a topic of n allocated seqs over up to four months
// (random switch points), with random gaps (allocated, never persisted),
// global deletions, recalls, deletion ranges of rpMember and a partial hot
// cache.
func rpRandomTopic(t *testing.T, env *harness.Env, rng *rand.Rand, topic string, n int64) rpTopicModel {
	t.Helper()
	rpGroup(t, env, topic)
	month := env.Start
	byMonth := map[routing.Month][]rpRow{}
	status := map[int64]string{}
	for s := int64(1); s <= n; s++ {
		if rng.IntN(25) == 0 && month.Before(env.Start.Add(3)) {
			month = month.Next()
		}
		switch r := rng.IntN(100); {
		case r < 8:
			continue // a gap
		case r < 13:
			status[s] = "deleted"
		case r < 18:
			status[s] = "recalled"
		default:
			status[s] = "normal"
		}
		byMonth[month] = append(byMonth[month], rpRow{seq: s, status: status[s]})
	}
	for m, rows := range byMonth {
		rpInsert(t, env, topic, m, rows...)
	}
	gaps := rpRandomHotCache(t, env, rng, topic, n, status)
	var hidden [][2]int64
	for range rng.IntN(4) {
		lo := 1 + rng.Int64N(n)
		hi := min(lo+1+rng.Int64N(max(1, n/5)), n+1) // never past the last seq
		hidden = append(hidden, [2]int64{lo, hi})
		rpHide(t, env, topic, rpMember, lo, hi)
	}
	model := rpTopicModel{topic: topic, gaps: gaps}
	for s := int64(1); s <= n; s++ {
		st, ok := status[s]
		if !ok || st == "deleted" || slices.ContainsFunc(hidden, func(r [2]int64) bool { return s >= r[0] && s < r[1] }) {
			continue
		}
		model.visible = append(model.visible, s)
	}
	rpSyncRoute(t, env, topic)
	return model
}

// rpRandomHotCache caches a random tail of the topic as send does — every
// seq, or most with holes — records the never-persisted seqs as gaps (some
// of them when the cache has holes) and sets the topic's last seq: pages
// the cache provably covers come from Redis (over a reader's copy of the
// newest ones, when it keeps copies), the others from MySQL — the results
// must not differ.
func rpRandomHotCache(t *testing.T, env *harness.Env, rng *rand.Rand, topic string, n int64, status map[int64]string) (gaps []int64) {
	t.Helper()
	ctx := context.Background()
	keys := env.Keys()
	rdb := env.Redis
	cmds := rueidis.Commands{rdb.B().Set().Key(keys.Seq(topic)).Value(strconv.FormatInt(n, 10)).Build()}
	holes := rng.IntN(2) == 0
	for s := n - rng.Int64N(n); s <= n; s++ {
		st, persisted := status[s]
		switch {
		case !persisted && (!holes || rng.IntN(2) == 0):
			gaps = append(gaps, s)
			cmds = append(cmds, rdb.B().Zadd().Key(keys.Gaps(topic)).ScoreMember().ScoreMember(float64(s), strconv.FormatInt(s, 10)).Build())
		case persisted && (!holes || rng.IntN(10) > 0):
			m := message.Message{Topic: topic, Seq: s, MessageID: message.ID(s), Status: st, MsgType: "text", Version: 1,
				Content: json.RawMessage(`{"text":"message ` + strconv.FormatInt(s, 10) + `"}`)}
			raw, _ := json.Marshal(m.Normalized())
			cmds = append(cmds, rdb.B().Zadd().Key(keys.HotMessages(topic)).ScoreMember().ScoreMember(float64(s), string(raw)).Build())
		}
	}
	for _, r := range rdb.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return gaps
}

// check walks the topic through each reader: one keeping copies of the
// newest messages, one reading the hot cache and MySQL as they stand.
func (m rpTopicModel) check(t *testing.T, readers []*harness.Env, rng *rand.Rand, stage string) {
	t.Helper()
	limit := 1 + rng.IntN(60)
	for i, env := range readers {
		what := fmt.Sprintf("%s: %s (reader %d)", m.topic, stage, i)
		rpExpectWalks(t, env, what, rpMember, m.topic, limit, m.visible)
		// the since pages report every recorded gap once, in order
		_, gaps := rpWalkSinceGaps(t, env, rpMember, m.topic, limit)
		rpExpect(t, fmt.Sprintf("%s: gaps of the since walk, limit %d", what, limit), gaps, m.gaps)
	}
}

// TestReadPathPropertyPagingMatchesPersisted: for random topics, paging the
// whole topic with before and with since returns exactly the persisted seqs
// the user may see, each once, in order — and again after the Redis routes
// are deleted or corrupted.
func TestReadPathPropertyPagingMatchesPersisted(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	env := rpStart(t)
	var models []rpTopicModel
	for i := range 4 {
		models = append(models, rpRandomTopic(t, env, rng, "prop"+strconv.Itoa(i), 100+rng.Int64N(200)))
	}
	for m := env.Start.Next(); !m.After(env.Start.Add(3)); m = m.Next() {
		env.Activate(m)
	}
	ctx := context.Background()
	keys := env.Keys()
	rdb := env.Redis
	readers := []*harness.Env{env, rpNoCopies(t, env)}
	for _, m := range models {
		m.check(t, readers, rng, "intact routes")

		if err := env.App.Routes().Delete(ctx, env.Tenant, m.topic); err != nil {
			t.Fatal(err)
		}
		m.check(t, readers, rng, "routes deleted")

		// corrupted: the newest month dropped (stale), lying max/count, and
		// entries that are no month at all
		ranges, _, err := env.App.Routes().Load(ctx, env.Tenant, m.topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(ranges) > 1 {
			ranges = ranges[:len(ranges)-1]
		}
		for i := range ranges {
			ranges[i].MaxSeq, ranges[i].Count = ranges[i].MinSeq, 1
		}
		if err := env.App.Routes().Replace(ctx, env.Tenant, m.topic, ranges); err != nil {
			t.Fatal(err)
		}
		if err := rdb.DoMulti(ctx,
			rdb.B().Zadd().Key(keys.Route(m.topic)).ScoreMember().ScoreMember(5, "garbage").Build(),
			rdb.B().Hset().Key(keys.RouteMeta(m.topic)).FieldValue().FieldValue("209913", "nonsense").Build(),
		)[1].Error(); err != nil {
			t.Fatal(err)
		}
		m.check(t, readers, rng, "routes corrupted")
	}
	for i, r := range readers {
		t.Logf("reader %d: hot cache answered %v pages (%v over a copy), sent %v to MySQL", i,
			rpMetric(t, r, "imshard_query_hot_cache_total", "result=hit"), rpMetric(t, r, "imshard_query_hot_local_total", "result=hit"),
			rpMetric(t, r, "imshard_query_hot_cache_total", "result=miss"))
	}
}
