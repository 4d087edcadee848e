package test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/query"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
)

// TestReadPathStaleRouteReachesNewestMonth: a route that does not know the
// newest month yet still reaches every month up to the active one
// (invariant 7), while the routes-complete watermark keeps an idle topic's
// reads to its own months.
func TestReadPathStaleRouteReachesNewestMonth(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ms := rpThreeMonths(t, env, "stale")
	ctx := context.Background()
	ranges, _, err := env.App.Routes().Load(ctx, env.Tenant, "stale")
	if err != nil || len(ranges) != 3 {
		t.Fatalf("%v %v", ranges, err)
	}
	if err := env.App.Routes().Replace(ctx, env.Tenant, "stale", ranges[:1]); err != nil {
		t.Fatal(err)
	}
	rpExpect(t, "latest page through a stale route", rpList(t, env, rpMember, "stale", url.Values{"limit": {"3"}}).seqs(), []int64{70, 69, 68})
	rpExpect(t, "since walk through a stale route", rpWalkSince(t, env, rpMember, "stale", 13), rpAsc(1, 70))
	if code := rpGet(t, env, rpMember, "", "/v1/topics/stale/messages/55", nil); code != 200 {
		t.Fatalf("exact seq in a month the route misses: %d", code)
	}
	// the watermark below the newest months: they are still probed
	if err := routing.MarkRoutesComplete(ctx, env.Redis, env.Keys(), ms[0]); err != nil {
		t.Fatal(err)
	}
	rpExpect(t, "watermark behind the data", rpWalkSince(t, env, rpMember, "stale", 50), rpAsc(1, 70))

	// an idle topic whose only month is long complete probes nothing
	rpGroup(t, env, "idle")
	rpInsert(t, env, "idle", ms[0], rpSeqs(1, 5)...)
	rpSyncRoute(t, env, "idle")
	router := env.App.NewRouter()
	tr, err := router.Route(ctx, env.Tenant, "idle")
	if err != nil || len(tr.Probe) != 2 {
		t.Fatalf("without a watermark the months after the route are probed: %+v %v", tr, err)
	}
	if err := routing.MarkRoutesComplete(ctx, env.Redis, env.Keys(), ms[2]); err != nil {
		t.Fatal(err)
	}
	if err := routing.MarkRoutesComplete(ctx, env.Redis, env.Keys(), ms[1]); err != nil { // never moves back
		t.Fatal(err)
	}
	tr, err = router.Route(ctx, env.Tenant, "idle")
	if err != nil || len(tr.Probe) != 0 || tr.Source != routing.RouteFromRedis {
		t.Fatalf("a complete watermark leaves nothing to probe: %+v %v", tr, err)
	}
	rpExpect(t, "idle topic", rpList(t, env, rpMember, "idle", nil).seqs(), rpDesc(1, 5))
}

// TestReadPathFallbackWithoutRouteOrMirror: neither Redis nor the mirror
// knows the topic — reads scan only the active month and the two before,
// queue a repair, and `route check --fix` restores everything.
func TestReadPathFallbackWithoutRouteOrMirror(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ctx := context.Background()
	rpGroup(t, env, "lost")
	old := env.Start
	for i := 1; i <= 3; i++ {
		env.Activate(old.Add(i))
	}
	rpInsert(t, env, "lost", old, rpSeqs(1, 5)...)         // four months back: out of the bounded scan
	rpInsert(t, env, "lost", old.Add(2), rpSeqs(6, 10)...) // within it
	rpInsert(t, env, "lost", old.Add(3), rpSeqs(11, 12)...)
	if _, err := sq.Delete("im_group_message_topic_shards").Where(sq.Eq{"topic": "lost"}).RunWith(env.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	rpSetLast(t, env, "lost", 12) // the routes are lost, the seq counter is not
	rpExpect(t, "bounded fallback", rpWalkSince(t, env, rpMember, "lost", 50), rpAsc(6, 12))
	queued, err := routing.RepairQueue(ctx, env.Redis, env.Keys())
	if err != nil || len(queued) != 1 || queued[0] != "lost" {
		t.Fatalf("repair queued: %v %v", queued, err)
	}
	rc := env.App.NewRouteCheck()
	var seen []string
	res, err := rc.Check(ctx, env.Tenant, nil, true, func(d routecheck.Difference) { seen = append(seen, d.String()) })
	if err != nil || res.Fixed != 1 || len(seen) == 0 {
		t.Fatalf("check --fix: %+v %v %v", res, seen, err)
	}
	rpExpect(t, "after the repair", rpWalkSince(t, env, rpMember, "lost", 50), rpAsc(1, 12))
	if queued, _ := routing.RepairQueue(ctx, env.Redis, env.Keys()); len(queued) != 0 {
		t.Fatalf("repair queue not drained: %v", queued)
	}
}

// TestRouteCheckAndRebuildCommands drives `imshard route check|rebuild` as
// an operator does: differences printed and exit 1, --fix repairs, exit 0.
func TestRouteCheckAndRebuildCommands(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ms := rpThreeMonths(t, env, "rcheck")
	rpGroup(t, env, "rcheck2")
	rpInsert(t, env, "rcheck2", ms[2], rpSeqs(1, 4)...)
	rpSyncRoute(t, env, "rcheck2")
	ctx := context.Background()
	cfg := tenantConfig(t, env.Tenant, "")

	code, out := runCLI(t, nil, "--config", cfg, "route", "check")
	if code != 0 || !strings.Contains(out, "2 topics checked, 0 differences") {
		t.Fatalf("consistent routes: exit %d\n%s", code, out)
	}
	// the mirror lies about one month, Redis lost another, and a row landed
	// that neither knows
	if _, err := sq.Update("im_group_message_topic_shards").Set("max_seq", 19).Where(sq.Eq{"topic": "rcheck", "shard_month": ms[0].String()}).RunWith(env.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	keys := env.Keys()
	if err := env.Redis.Do(ctx, env.Redis.B().Hdel().Key(keys.RouteMeta("rcheck")).Field(ms[1].String()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	tbl, _, _ := env.App.Catalog().Table(ctx, env.Tenant, ms[2])
	if _, err := sq.Insert(tbl.Quoted()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "created_at", "updated_at").
		Values(1, "rcheck2", 77, 5, rpMember, time.Now(), time.Now()).RunWith(env.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	code, out = runCLI(t, nil, "--config", cfg, "route", "check", "--tenant", env.Tenant)
	if code != 1 {
		t.Fatalf("differences must exit 1, got %d\n%s", code, out)
	}
	for _, want := range []string{"topic rcheck month " + ms[0].String() + ": mirror has min=1 max=19 count=20, tables have min=1 max=20 count=20",
		"topic rcheck month " + ms[1].String() + ": redis has", "topic rcheck2 month " + ms[2].String() + ": mirror has min=1 max=4 count=4, tables have min=1 max=5 count=5",
		"topic rcheck2 month " + ms[2].String() + ": redis has"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s", want, out)
		}
	}
	var st routecheck.TopicState
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/topics/rcheck2/route", &st); code != 200 || len(st.Differences) != 2 || len(st.Tables) != 1 || st.Tables[0].MaxSeq != 5 {
		t.Fatalf("admin route view: %d %+v", code, st)
	}
	code, out = runCLI(t, nil, "--config", cfg, "route", "check", "--tenant", env.Tenant, "--topic", "rcheck2", "--fix")
	if code != 0 || !strings.Contains(out, "1 topics fixed") {
		t.Fatalf("--fix: exit %d\n%s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "route", "check", "--fix")
	if code != 0 {
		t.Fatalf("--fix all: exit %d\n%s", code, out)
	}
	if code, out = runCLI(t, nil, "--config", cfg, "route", "check"); code != 0 {
		t.Fatalf("after --fix: exit %d\n%s", code, out)
	}
	rpExpect(t, "the repaired topic", rpWalkSince(t, env, rpMember, "rcheck2", 2), rpAsc(1, 5))

	// rebuild: Redis loses every route, the mirror refills them
	for _, topic := range []string{"rcheck", "rcheck2"} {
		if err := env.App.Routes().Delete(ctx, env.Tenant, topic); err != nil {
			t.Fatal(err)
		}
	}
	code, out = runCLI(t, nil, "--config", cfg, "route", "rebuild", "--tenant", env.Tenant, "--all")
	if code != 0 || !strings.Contains(out, "rebuilt 2/2 topics") {
		t.Fatalf("rebuild --all: exit %d\n%s", code, out)
	}
	if got, found, err := env.App.Routes().Load(ctx, env.Tenant, "rcheck"); err != nil || !found || len(got) != 3 {
		t.Fatalf("rebuilt route: %v %v %v", got, found, err)
	}
	if code, out = runCLI(t, nil, "--config", cfg, "route", "rebuild", "--tenant", env.Tenant); code != 2 {
		t.Fatalf("rebuild without --topic or --all is bad usage: exit %d\n%s", code, out)
	}
}

func TestReadPathSearchAndAdminRoutes(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ms := [3]routing.Month{env.Start, env.Start.Next(), env.Start.Add(2)}
	rpGroup(t, env, "search")
	edge := ms[1].Start()
	rpInsert(t, env, "search", ms[0],
		rpRow{seq: 1, text: "hello world"},
		rpRow{seq: 2, text: "50% off_sale"},
		// sent a second after the calendar turned, stored in the still
		// active older month
		rpRow{seq: 3, text: "hello at the edge", created: edge.Add(time.Second)})
	rpInsert(t, env, "search", ms[1], rpRow{seq: 4, text: "hello again"}, rpRow{seq: 5, text: "HELLO recalled", status: "recalled"},
		rpRow{seq: 6, text: "5000 off sale"})
	rpInsert(t, env, "search", ms[2], rpRow{seq: 7, text: "hello from the third month"})
	env.Activate(ms[1])
	env.Activate(ms[2])
	rpSyncRoute(t, env, "search")
	search := func(user int64, q, from, to string, extra url.Values) (int, rpPage) {
		v := url.Values{"q": {q}, "from": {from}, "to": {to}}
		for k, vs := range extra {
			v[k] = vs
		}
		var p rpPage
		code := rpGet(t, env, user, "", "/v1/topics/search/search?"+v.Encode(), &p)
		return code, p
	}
	rfc := func(tm time.Time) string { return tm.UTC().Format(time.RFC3339) }
	code, p := search(rpMember, "hello", rfc(edge), rfc(edge.Add(24*time.Hour)), nil)
	if code != 200 {
		t.Fatalf("search: %d", code)
	}
	rpExpect(t, "window of the first day of the second month", p.seqs(), []int64{4, 3})
	_, p = search(rpMember, "hello", rfc(ms[0].Start()), rfc(ms[2].End()), url.Values{"limit": {"2"}})
	rpExpect(t, "newest first over three months", p.seqs(), []int64{7, 4})
	if !p.HasMore || p.NextBefore == nil || *p.NextBefore != 4 {
		t.Fatalf("search cursor: %+v", p)
	}
	_, p = search(rpMember, "hello", rfc(ms[0].Start()), rfc(ms[2].End()), url.Values{"limit": {"2"}, "before": {"4"}})
	rpExpect(t, "next search page", p.seqs(), []int64{3, 1})
	_, p = search(rpMember, "50% off_", rfc(ms[0].Start()), rfc(ms[2].End()), nil)
	rpExpect(t, "LIKE metacharacters match literally", p.seqs(), []int64{2})
	rpHide(t, env, "search", rpMember, 7, 8)
	_, p = search(rpMember, "hello", rfc(ms[2].Start()), rfc(ms[2].End()), nil)
	rpExpect(t, "hidden hits are dropped", p.seqs(), nil)
	for _, bad := range []url.Values{
		{"q": {"x"}, "from": {rfc(ms[0].Start())}, "to": {rfc(ms[0].Start().AddDate(0, 3, 1))}},
		{"q": {"x"}, "from": {"yesterday"}, "to": {rfc(edge)}},
		{"q": {"x"}, "to": {rfc(edge)}},
		{"from": {rfc(ms[0].Start())}, "to": {rfc(edge)}},
	} {
		if code := rpGet(t, env, rpMember, "", "/v1/topics/search/search?"+bad.Encode(), nil); code != 400 {
			t.Fatalf("search %v: %d, want 400", bad, code)
		}
	}

	var shards query.Shards
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/shards", &shards); code != 200 || shards.ActiveMonth != ms[2].String() || len(shards.Shards) < 3 {
		t.Fatalf("admin shards: %d %+v", code, shards)
	}
	active := 0
	for _, s := range shards.Shards {
		if s.Active {
			active++
		}
	}
	if active != 1 {
		t.Fatalf("one active month: %+v", shards.Shards)
	}
	var st routecheck.TopicState
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/topics/search/route", &st); code != 200 || !st.RedisFound || len(st.Redis) != 3 || len(st.Mirror) != 3 || len(st.Tables) != 3 || len(st.Differences) != 0 {
		t.Fatalf("admin route: %d %+v", code, st)
	}
	for _, path := range []string{"/v1/admin/shards", "/v1/admin/topics/search/route"} {
		if code := rpGet(t, env, rpMember, "", path, nil); code != 403 {
			t.Fatalf("%s as a member: %d", path, code)
		}
	}
}
