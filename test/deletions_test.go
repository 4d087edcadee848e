package test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/harness"
)

// dellogRows counts the im_dellog rows of (topic, user).
func dellogRows(t *testing.T, env *harness.Env, topic string, user int64) int {
	t.Helper()
	var n int
	if err := sq.Select("COUNT(*)").From("im_dellog").Where(sq.Eq{"topic": topic, "deletedfor": user}).
		RunWith(env.DB).QueryRowContext(context.Background()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// hiddenEntry is the user's cached deletion ranges of topic ("" and false
// when not cached).
func hiddenEntry(t *testing.T, env *harness.Env, topic string, user int64) (string, bool) {
	t.Helper()
	keys := env.Keys()
	rdb := env.App.Redis()
	v, err := rdb.Do(context.Background(), rdb.B().Hget().Key(keys.Hidden(topic)).Field(strconv.FormatInt(user, 10)).Build()).ToString()
	if err != nil {
		return "", false
	}
	return v, true
}

// TestDeletionsValidation: every malformed or out-of-range hide is a 4xx
// with a code and writes nothing.
func TestDeletionsValidation(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpGroup(t, env, "delv")
	rpInsert(t, env, "delv", env.Start, rpSeqs(1, 10)...)
	tok := env.Token(rpMember, "")
	for _, c := range []struct {
		name   string
		token  string
		body   any
		status int
	}{
		{"no body", tok, nil, 400},
		{"not JSON", tok, []byte("{low:1"), 400},
		{"unknown field", tok, []byte(`{"low":1,"hi":2,"all":true}`), 400},
		{"two objects", tok, []byte(`{"low":1,"hi":2}{}`), 400},
		{"low missing", tok, []byte(`{"hi":2}`), 400},
		{"hi missing", tok, []byte(`{"low":2}`), 400},
		{"low zero", tok, []byte(`{"low":0,"hi":2}`), 400},
		{"negative", tok, []byte(`{"low":-5,"hi":2}`), 400},
		{"empty range", tok, []byte(`{"low":4,"hi":4}`), 400},
		{"reversed", tok, []byte(`{"low":5,"hi":4}`), 400},
		{"string seq", tok, []byte(`{"low":"1","hi":2}`), 400},
		{"past the last seq", tok, []byte(`{"low":5,"hi":12}`), 400},
		{"huge", tok, []byte(`{"low":1,"hi":99999999999999999999}`), 400},
		{"too large", tok, []byte(`{"low":1,"hi":2,"x":"` + strings.Repeat("a", 2000) + `"}`), 413},
		{"stranger", env.Token(rpStranger, ""), []byte(`{"low":1,"hi":2}`), 403},
		{"no token", "", []byte(`{"low":1,"hi":2}`), 401},
	} {
		code, body := env.Do("POST", "/v1/topics/delv/deletions", c.token, c.body)
		if code != c.status {
			t.Fatalf("%s: %d %s, want %d", c.name, code, body, c.status)
		}
	}
	for _, c := range []struct {
		path   string
		status int
	}{
		{"/v1/topics/delv/messages/3", 400},           // scope required
		{"/v1/topics/delv/messages/3?scope=you", 400}, // unknown scope
		{"/v1/topics/delv/messages/3?scope=all", 403}, // global delete: admins only
		{"/v1/topics/delv/messages/0?scope=me", 400},  // bad seq
		{"/v1/topics/delv/messages/x?scope=me", 400},  // bad seq
		{"/v1/topics/delv/messages/11?scope=me", 400}, // not sent yet
		{"/v1/topics/d%20v/messages/3?scope=me", 400}, // bad topic
		{"/v1/topics/delv/messages/3?scope=me&scope=me", 400},
	} {
		if code, body := env.Do("DELETE", c.path, tok, nil); code != c.status {
			t.Fatalf("DELETE %s: %d %s, want %d", c.path, code, body, c.status)
		}
	}
	if n := dellogRows(t, env, "delv", rpMember); n != 0 {
		t.Fatalf("rejected hides wrote %d rows", n)
	}
	// the full range up to the last seq is fine, and so is a repeat
	for range 2 {
		rpHide(t, env, "delv", rpMember, 1, 11)
	}
	rpExpect(t, "everything hidden", rpWalkSince(t, env, rpMember, "delv", 50), nil)
	rpExpect(t, "the other member is unaffected", rpWalkSince(t, env, rpOther, "delv", 50), rpAsc(1, 10))
}

// TestDeletionsShowAtOnce: a hide shows on the very next page of every
// kind — hot cache, MySQL, exact — although the caller's ranges were
// cached before it; DELETE ?scope=me hides one message.
func TestDeletionsShowAtOnce(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	rpGroup(t, env, "delnow")
	tok := env.Token(rpMember, "")
	for i := range 10 {
		rpPost(t, env, tok, "delnow", fmt.Sprintf("c%d", i), fmt.Sprintf("text %d", i))
	}
	latest := func() []int64 { return rpList(t, env, rpMember, "delnow", url.Values{"limit": {"50"}}).seqs() }
	rpExpect(t, "latest page (hot cache)", latest(), rpDesc(1, 10))
	if v, ok := hiddenEntry(t, env, "delnow", rpMember); !ok || v != "" {
		t.Fatalf("the caller's ranges are not cached as none: %q %v", v, ok)
	}
	rpHide(t, env, "delnow", rpMember, 4, 7)
	rpExpect(t, "latest page right after the hide", latest(), []int64{10, 9, 8, 7, 3, 2, 1})
	if code, body := env.Do("DELETE", "/v1/topics/delnow/messages/9?scope=me", tok, nil); code != 200 {
		t.Fatalf("DELETE scope=me: %d %s", code, body)
	}
	want := []int64{10, 8, 7, 3, 2, 1}
	rpExpect(t, "latest page after DELETE scope=me", latest(), want)
	if v, ok := hiddenEntry(t, env, "delnow", rpMember); !ok || v != "4-7,9-10" {
		t.Fatalf("cached ranges %q %v, want 4-7,9-10", v, ok)
	}
	if code := rpGet(t, env, rpMember, "", "/v1/topics/delnow/messages/9", nil); code != 404 {
		t.Fatalf("exact read of a hidden message: %d", code)
	}
	waitFor(t, 30*time.Second, func() bool { return len(rpWalkSince(t, env, rpOther, "delnow", 50)) == 10 }) // persisted
	// the same from MySQL: the hot cache gone, read by a process holding
	// no copy of the topic
	keys := env.Keys()
	rdb := env.App.Redis()
	if err := rdb.Do(context.Background(), rdb.B().Del().Key(keys.HotMessages("delnow")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	env = rpNoCopies(t, env)
	rpExpect(t, "latest page from MySQL", latest(), want)
	rpExpect(t, "since walk from MySQL", rpWalkSince(t, env, rpMember, "delnow", 2), []int64{1, 2, 3, 7, 8, 10})
	rpExpect(t, "the other member sees all", rpWalkSince(t, env, rpOther, "delnow", 50), rpAsc(1, 10))
}

// TestDeletionsCacheFallbacks: a caller with more ranges than the cache
// holds, a malformed entry and a stale fill are all answered right, by
// MySQL where the cache cannot.
func TestDeletionsCacheFallbacks(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "delfb")
	var want []int64
	for s := int64(1); s <= 70; s++ {
		if s%2 == 1 {
			want = append(want, s)
		}
	}
	for s := int64(2); s <= 70; s += 2 { // 35 ranges: more than one entry holds
		rpHide(t, env, "delfb", rpMember, s, s+1)
	}
	rpExpect(t, "many ranges", rpWalkSince(t, env, rpMember, "delfb", 7), want)
	if v, _ := hiddenEntry(t, env, "delfb", rpMember); v != "*" {
		t.Fatalf("entry of a caller with many ranges: %q", v)
	}
	if rpMetric(t, env, "imshard_query_hidden_cache_total", "result=miss") != 1 || rpMetric(t, env, "imshard_query_hidden_cache_total", "result=many") < 1 {
		t.Fatal("a miss, then entries of too many ranges, are counted")
	}
	keys := env.Keys()
	rdb := env.App.Redis()
	ctx := context.Background()
	set := func(v string) {
		if err := rdb.Do(ctx, rdb.B().Hset().Key(keys.Hidden("delfb")).FieldValue().FieldValue(strconv.FormatInt(rpOther, 10), v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	rpHide(t, env, "delfb", rpOther, 10, 20)
	for _, bad := range []string{"garbage", "5-3", "1-2,x"} {
		set(bad)
		rpExpect(t, "malformed entry "+bad, rpWalkBefore(t, env, rpOther, "delfb", 50), append(rpDesc(20, 70), rpDesc(1, 9)...))
	}
	// a fill computed before a hide is refused: the version moved on
	ver, err := rdb.Do(ctx, rdb.B().Get().Key(keys.HiddenVersion("delfb")).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	rpHide(t, env, "delfb", rpOther, 30, 31)
	res, err := env.App.Scripts().CacheFill.Exec(ctx, rdb, []string{keys.HiddenVersion("delfb"), keys.Hidden("delfb")},
		[]string{ver, "60000", strconv.FormatInt(rpOther, 10), "10-20"}).AsInt64()
	if err != nil || res != 0 {
		t.Fatalf("stale fill: %d %v, want refused", res, err)
	}
	if v, ok := hiddenEntry(t, env, "delfb", rpOther); ok {
		t.Fatalf("stale fill landed: %q", v)
	}
	got := rpWalkBefore(t, env, rpOther, "delfb", 50)
	rpExpect(t, "after the second hide", got, append(append(rpDesc(31, 70), rpDesc(20, 29)...), rpDesc(1, 9)...))
	if v, _ := hiddenEntry(t, env, "delfb", rpOther); v != "10-20,30-31" {
		t.Fatalf("refilled entry %q", v)
	}
}

// TestDeletionsSurviveLostRedis: with every Redis key of the tenant gone —
// deletion-range and ACL caches, routes, hot cache, counters — pages are
// rebuilt from MySQL and still hide exactly the caller's ranges.
func TestDeletionsSurviveLostRedis(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "dellost")
	rpHide(t, env, "dellost", rpMember, 5, 25)
	rpHide(t, env, "dellost", rpMember, 50, 51)
	want := append(append(rpAsc(1, 4), rpAsc(25, 49)...), rpAsc(51, 70)...)
	check := func(stage string) {
		t.Helper()
		rpExpectWalks(t, env, stage, rpMember, "dellost", 7, want)
		rpExpect(t, stage+": the other member", rpWalkSince(t, env, rpOther, "dellost", 50), rpAsc(1, 70))
	}
	check("cached")
	if v, ok := hiddenEntry(t, env, "dellost", rpMember); !ok || v != "5-25,50-51" {
		t.Fatalf("cached ranges %q %v", v, ok)
	}
	if err := env.App.KeySpace().DropTenantKeys(context.Background(), env.Redis, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if _, ok := hiddenEntry(t, env, "dellost", rpMember); ok {
		t.Fatal("the tenant's keys were not dropped")
	}
	hits := rpMetric(t, env, "imshard_query_hidden_cache_total", "result=hit")
	check("Redis lost")
	if rpMetric(t, env, "imshard_query_hidden_cache_total", "result=hit") <= hits {
		t.Fatal("pages after the refill are not counted as hits")
	}
	if v, ok := hiddenEntry(t, env, "dellost", rpMember); !ok || v != "5-25,50-51" {
		t.Fatalf("ranges not cached again from MySQL: %q %v", v, ok)
	}
}

// dellogRanges is the im_dellog rows of (topic, user) as [low, hi), by low.
func dellogRanges(t *testing.T, env *harness.Env, topic string, user int64) [][2]int64 {
	t.Helper()
	rows, err := sq.Select("low", "hi").From("im_dellog").Where(sq.Eq{"topic": topic, "deletedfor": user}).OrderBy("low").
		RunWith(env.DB).QueryContext(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][2]int64
	for rows.Next() {
		var r [2]int64
		if err := rows.Scan(&r[0], &r[1]); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// TestDeletionsMergedAndBounded: a caller's ranges of a topic are stored
// disjoint — a hide that overlaps or touches others is merged with them —
// which the read condition relies on; a caller may hold at most
// readpath.MaxHiddenRanges separate ranges of a topic, and a hide that
// would pass that is refused (409) and changes nothing, while one that
// joins ranges is still taken.
func TestDeletionsMergedAndBounded(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpGroup(t, env, "delmb")
	const top = 4 * readpath.MaxHiddenRanges
	rpInsert(t, env, "delmb", env.Start, rpSeqs(1, top)...)

	for _, c := range []struct {
		lo, hi int64
		want   [][2]int64
	}{
		{1, 3, [][2]int64{{1, 3}}},
		{5, 7, [][2]int64{{1, 3}, {5, 7}}},
		{3, 5, [][2]int64{{1, 7}}},              // touches both sides
		{10, 12, [][2]int64{{1, 7}, {10, 12}}},  // apart
		{11, 12, [][2]int64{{1, 7}, {10, 12}}},  // inside one
		{2, 11, [][2]int64{{1, 12}}},            // overlaps both
		{20, 21, [][2]int64{{1, 12}, {20, 21}}}, // apart
		{15, 30, [][2]int64{{1, 12}, {15, 30}}}, // covers one
		{12, 15, [][2]int64{{1, 30}}},           // closes the gap
		{40, 41, [][2]int64{{1, 30}, {40, 41}}}, // apart
		{42, 43, [][2]int64{{1, 30}, {40, 41}, {42, 43}}},
	} {
		rpHide(t, env, "delmb", rpMember, c.lo, c.hi)
		if got := dellogRanges(t, env, "delmb", rpMember); !slices.Equal(got, c.want) {
			t.Fatalf("after hiding [%d, %d): rows %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	want := append(append(rpAsc(30, 39), 41), rpAsc(43, 60)...)
	rpExpect(t, "since walk over merged ranges", rpWalkSince(t, env, rpMember, "delmb", 7)[:len(want)], want)

	// the other member holds the most separate ranges there may be: every
	// fourth seq from 2
	ins := sq.Insert("im_dellog").Columns("topic", "deletedfor", "low", "hi")
	for i := range int64(readpath.MaxHiddenRanges) {
		ins = ins.Values("delmb", rpOther, 4*i+2, 4*i+3)
	}
	if _, err := ins.RunWith(env.DB).ExecContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, body := env.Do("POST", "/v1/topics/delmb/deletions", env.Token(rpOther, ""), map[string]int64{"low": 4, "hi": 5})
	if code != 409 || !strings.Contains(string(body), `"conflict"`) || !strings.Contains(string(body), `"max_ranges":1000`) {
		t.Fatalf("a hide past the bound: %d %s, want 409 conflict with max_ranges", code, body)
	}
	if n := dellogRows(t, env, "delmb", rpOther); n != readpath.MaxHiddenRanges {
		t.Fatalf("a refused hide changed the rows: %d", n)
	}
	// [3, 6) touches [2, 3) and [6, 7): three become one
	rpHide(t, env, "delmb", rpOther, 3, 6)
	if n := dellogRows(t, env, "delmb", rpOther); n != readpath.MaxHiddenRanges-1 {
		t.Fatalf("a joining hide left %d rows, want %d", n, readpath.MaxHiddenRanges-1)
	}
	seen := []int64{1}
	for s := int64(7); s <= top; s++ {
		if s%4 != 2 {
			seen = append(seen, s)
		}
	}
	rpExpect(t, "the other member's walk", rpWalkSince(t, env, rpOther, "delmb", 50), seen)
}

// TestDeletionsMergedByMigration: ranges stored before hides were merged
// (overlapping, touching, nested, empty) are merged into disjoint rows by
// the schema step, which can run again.
func TestDeletionsMergedByMigration(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpGroup(t, env, "delmig")
	rpInsert(t, env, "delmig", env.Start, rpSeqs(1, 60)...)
	ctx := context.Background()
	ins := sq.Insert("im_dellog").Columns("topic", "deletedfor", "low", "hi").
		Values("delmig", rpMember, 1, 20).Values("delmig", rpMember, 5, 8).Values("delmig", rpMember, 20, 22).
		Values("delmig", rpMember, 30, 35).Values("delmig", rpMember, 33, 40).Values("delmig", rpMember, 50, 50).
		Values("delmig", rpOther, 5, 8).Values("delmig", rpOther, 9, 10)
	if _, err := ins.RunWith(env.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := env.DB.ExecContext(ctx, "DELETE FROM im_schema_migrations WHERE version = 10"); err != nil {
			t.Fatal(err)
		}
		if err := tenantdb.Migrate(ctx, env.DB); err != nil {
			t.Fatal(err)
		}
		if got, want := dellogRanges(t, env, "delmig", rpMember), [][2]int64{{1, 22}, {30, 40}}; !slices.Equal(got, want) {
			t.Fatalf("merged rows %v, want %v", got, want)
		}
		if got, want := dellogRanges(t, env, "delmig", rpOther), [][2]int64{{5, 8}, {9, 10}}; !slices.Equal(got, want) {
			t.Fatalf("the other member's rows %v, want %v", got, want)
		}
	}
	rpExpect(t, "walk over migrated ranges", rpWalkSince(t, env, rpMember, "delmig", 50), append(rpAsc(22, 29), rpAsc(40, 60)...))
}
