package routing_test

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// TestScriptsMoveVersionsForward: the scripts that move a version — the
// message version (msg_change.lua) and a user's cached-entry generation
// (cursor_put.lua when it raises, cursor_fill.lua) — hand out at least the
// Redis time in microseconds, and above the version they replace even when
// it is ahead of the clock; a cursor_put that raises nothing leaves the
// generation alone.
func TestScriptsMoveVersionsForward(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	scripts := routing.NewScripts()
	keys, err := noPrefix(t).Tenant(testenv.NewTenant(t))
	if err != nil {
		t.Fatal(err)
	}
	now := func() int64 {
		t.Helper()
		tm, err := rdb.Do(ctx, rdb.B().Time().Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		s, _ := strconv.ParseInt(tm[0], 10, 64)
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		return s*1_000_000 + us
	}
	num := func(s string, err error) int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("version %q: %v", s, err)
		}
		return n
	}
	const topic, user = "vers", int64(7)
	ttl := strconv.FormatInt(time.Hour.Milliseconds(), 10)
	msgChange := func() int64 {
		return num(scripts.MsgChange.Exec(ctx, rdb, []string{keys.HotMessages(topic), keys.MessagesVersion(topic)}, []string{ttl, "0", "0"}).ToString())
	}
	gen := func() int64 {
		return num(rdb.Do(ctx, rdb.B().Hget().Key(keys.ReadCursors(user)).Field("#").Build()).ToString())
	}
	if err := rdb.Do(ctx, rdb.B().Set().Key(keys.Seq(topic)).Value("100").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	put := func(seq int64) { cursorPut(ctx, t, rdb, scripts, keys, user, topic, seq) }
	fill := func(version string, pairs ...string) {
		t.Helper()
		args := append([]string{version, ttl, "e"}, pairs...)
		if n, err := scripts.CursorFill.Exec(ctx, rdb, []string{keys.ReadCursorsVersion(user), keys.ReadCursors(user)}, args).AsInt64(); err != nil || n != 1 {
			t.Fatalf("fill: %d %v", n, err)
		}
	}

	before := now()
	if v := msgChange(); v < before {
		t.Fatalf("message version %d is below the Redis time %d", v, before)
	}
	ahead := now() + 3_600_000_000 // an hour ahead of the clock
	if err := rdb.Do(ctx, rdb.B().Set().Key(keys.MessagesVersion(topic)).Value(strconv.FormatInt(ahead, 10)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if v := msgChange(); v != ahead+1 {
		t.Fatalf("message version %d after %d, want %d", v, ahead, ahead+1)
	}

	before = now()
	fill("", topic, "0") // a move raises only a topic the entry names
	put(5)
	g1 := gen()
	if g1 < before {
		t.Fatalf("generation %d is below the Redis time %d", g1, before)
	}
	put(3) // lower: nothing raised, nothing moved
	if g := gen(); g != g1 {
		t.Fatalf("a cursor_put that raised nothing moved the generation %d → %d", g1, g)
	}
	if err := rdb.Do(ctx, rdb.B().Hset().Key(keys.ReadCursors(user)).FieldValue().FieldValue("#", strconv.FormatInt(ahead, 10)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	put(6)
	if g := gen(); g != ahead+1 {
		t.Fatalf("generation %d after %d, want %d", g, ahead, ahead+1)
	}
	fill("", topic, "6")
	if g := gen(); g != ahead+2 {
		t.Fatalf("generation %d after a fill over %d, want %d", g, ahead+1, ahead+2)
	}
}

// cursorPut runs cursor_put.lua as a cursor move does and returns its
// answer: the topic's last issued seq (-1: no counter) and whether the
// user's cached cursor was raised (1), is in the entry and was not raised
// (0), or is not in the entry (-1).
func cursorPut(ctx context.Context, t *testing.T, rdb rueidis.Client, scripts *routing.Scripts, keys routing.Keys, user int64, topic string, seq int64) []int64 {
	t.Helper()
	args := []string{topic, strconv.FormatInt(seq, 10), strconv.FormatInt(time.Hour.Milliseconds(), 10)}
	ks := []string{keys.ReadCursors(user), keys.Seq(topic)}
	out, err := scripts.CursorPut.Result(ctx, rdb, rdb.Do(ctx, scripts.CursorPut.Cmd(rdb, ks, args)), ks, args).AsIntSlice()
	if err != nil || len(out) != 2 {
		t.Fatalf("cursor_put %s %d: %v %v", topic, seq, out, err)
	}
	return out
}

// TestCursorPutRaisesOnlyANamedTopic: a cursor move runs before its
// membership is decided, so cursor_put raises only a field the user's
// entry already holds (a fill put it there from their memberships): for a
// topic the entry does not name, or without an entry, it writes nothing —
// no field, no generation, no expiry — and answers -1; without the seq
// counter it writes nothing either, and still tells whether the entry
// names the topic.
func TestCursorPutRaisesOnlyANamedTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	scripts := routing.NewScripts()
	keys, err := noPrefix(t).Tenant(testenv.NewTenant(t))
	if err != nil {
		t.Fatal(err)
	}
	const own, far, user = "own", "far", int64(9)
	for _, tp := range []string{own, far} {
		if err := rdb.Do(ctx, rdb.B().Set().Key(keys.Seq(tp)).Value("10").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	entry := func() (map[string]string, int64) {
		t.Helper()
		res := rdb.DoMulti(ctx, rdb.B().Hgetall().Key(keys.ReadCursors(user)).Build(), rdb.B().Pttl().Key(keys.ReadCursors(user)).Build())
		m, err := res[0].AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := res[1].AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return m, ttl
	}
	want := func(step string, got []int64, last, raised int64) {
		t.Helper()
		if got[0] != last || got[1] != raised {
			t.Fatalf("%s: cursor_put answered %v, want [%d %d]", step, got, last, raised)
		}
	}

	want("no entry", cursorPut(ctx, t, rdb, scripts, keys, user, own, 3), 10, -1)
	if m, _ := entry(); len(m) != 0 {
		t.Fatalf("a move without an entry wrote %v", m)
	}
	args := []string{"", "60000", "e", own, "1"} // a short expiry, to see it left alone
	if n, err := scripts.CursorFill.Exec(ctx, rdb, []string{keys.ReadCursorsVersion(user), keys.ReadCursors(user)}, args).AsInt64(); err != nil || n != 1 {
		t.Fatalf("fill: %d %v", n, err)
	}
	filled, ttl := entry()
	want("a topic the entry does not name", cursorPut(ctx, t, rdb, scripts, keys, user, far, 3), 10, -1)
	if m, after := entry(); !maps.Equal(m, filled) || after > ttl {
		t.Fatalf("a move of a topic the entry does not name changed it: %v (expiry %d ms) → %v (%d ms)", filled, ttl, m, after)
	}
	want("a named topic", cursorPut(ctx, t, rdb, scripts, keys, user, own, 3), 10, 1)
	if m, _ := entry(); m[own] != "3" || m["#"] == filled["#"] {
		t.Fatalf("a move of a named topic: %v, want %s raised to 3 and the generation moved", m, own)
	}
	if err := rdb.Do(ctx, rdb.B().Del().Key(keys.Seq(far)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	raised, _ := entry()
	want("no seq counter", cursorPut(ctx, t, rdb, scripts, keys, user, far, 3), -1, -1)
	if m, _ := entry(); !maps.Equal(m, raised) {
		t.Fatalf("a move without the seq counter changed the entry: %v → %v", raised, m)
	}
}
