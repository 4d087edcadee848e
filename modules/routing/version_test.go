package routing_test

import (
	"context"
	"strconv"
	"testing"
	"time"

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
	keys, err := routing.KeysFor(testenv.NewTenant(t))
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
		return num(scripts.MsgChange.Exec(ctx, rdb, []string{keys.HotMessages(topic), keys.MessagesVersion(topic)}, []string{"0", ttl}).ToString())
	}
	gen := func() int64 {
		return num(rdb.Do(ctx, rdb.B().Hget().Key(keys.ReadCursors(user)).Field("#").Build()).ToString())
	}
	put := func(seq int64) {
		t.Helper()
		if err := rdb.Do(ctx, rdb.B().Set().Key(keys.Seq(topic)).Value("100").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		args := []string{topic, strconv.FormatInt(seq, 10), ttl}
		ks := []string{keys.ReadCursors(user), keys.ReadCursorsVersion(user), keys.Seq(topic), keys.ReadFrames(user)}
		if err := scripts.CursorPut.Result(ctx, rdb, rdb.Do(ctx, scripts.CursorPut.Cmd(rdb, ks, args)), ks, args).Error(); err != nil {
			t.Fatal(err)
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
	fill := []string{"", ttl, "e", topic, "6"}
	if n, err := scripts.CursorFill.Exec(ctx, rdb, []string{keys.ReadCursorsVersion(user), keys.ReadCursors(user)}, fill).AsInt64(); err != nil || n != 1 {
		t.Fatalf("fill: %d %v", n, err)
	}
	if g := gen(); g != ahead+2 {
		t.Fatalf("generation %d after a fill over %d, want %d", g, ahead+1, ahead+2)
	}
}
