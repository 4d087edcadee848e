package routing_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/lua"
	"github.com/imshard/imshard/test/testenv"
)

// TestFencedMemoAnswersAsAMatch: the fenced library keeps the captures of
// the strings it parses (match in lua/fenced.lua); loaded with room for
// two strings only, so that the memo is dropped again and again, the gate
// and the reservation still read as their strings say, whatever was read
// before — a gate moved on, a reservation raised, from another incarnation.
func TestFencedMemoAnswersAsAMatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redisClient(t)
	keys, err := noPrefix(t).Tenant(testenv.NewTenant(t))
	if err != nil {
		t.Fatal(err)
	}
	const full = "local memo, memo_n, memo_max = {}, 0, 4096"
	if strings.Count(lua.Fenced, full) != 1 {
		t.Fatalf("the library no longer holds %q", full)
	}
	v := fmt.Sprintf("memo%d", time.Now().UnixNano())
	code := strings.ReplaceAll(strings.Replace(lua.Fenced, full, "local memo, memo_n, memo_max = {}, 0, 2", 1), "{{version}}", v)
	if err := rdb.Do(ctx, rdb.B().FunctionLoad().FunctionCode(code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rdb.Do(context.Background(), rdb.B().FunctionDelete().LibraryName("imshard_fenced_"+v).Build()).Error()
	})
	info, err := rdb.Do(ctx, rdb.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	_, run, _ := strings.Cut(info, "run_id:")
	run = strings.TrimSpace(strings.SplitN(run, "\n", 2)[0])
	set := func(k, val string) {
		t.Helper()
		if err := rdb.Do(ctx, rdb.B().Set().Key(k).Value(val).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	gate := func() string {
		t.Helper()
		rep, err := rdb.Do(ctx, rdb.B().Fcall().Function("imshard_gate_get_"+v).Numkeys(1).Key(keys.MigrationGate()).Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		n, _ := rep[0].AsInt64()
		flags, _ := rep[1].ToString()
		state, _ := rep[2].ToString()
		return fmt.Sprintf("%d %s %s", n, flags, state)
	}
	extend := func(topic string) int64 {
		t.Helper()
		n, err := rdb.Do(ctx, rdb.B().Fcall().Function("imshard_extend_"+v).Numkeys(2).
			Key(keys.Seq(topic), keys.SeqReservation(topic)).Arg("0").Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	gates := []struct{ val, want string }{
		{run + ":1:00:none", "1 00 none"},
		{run + ":2:10:copying", "2 10 copying"},
		{"0123456789abcdef:3:00:none", "0  "},
		{run + ":4:11:switching", "4 11 switching"},
	}
	for round := range 3 {
		for _, g := range gates {
			set(keys.MigrationGate(), g.val)
			if got := gate(); got != g.want {
				t.Errorf("round %d: gate %q read as %q, want %q", round, g.val, got, g.want)
			}
		}
		for i, hw := range []int64{1000, 5000, 70000} {
			topic := "memo" + strconv.Itoa(i)
			set(keys.Seq(topic), "1")
			set(keys.SeqReservation(topic), run+":"+strconv.FormatInt(hw+int64(round), 10))
			if got := extend(topic); got != hw+int64(round) {
				t.Errorf("round %d: reservation %d read as %d", round, hw+int64(round), got)
			}
			set(keys.SeqReservation(topic), "0123456789abcdef:"+strconv.FormatInt(hw, 10))
			if got := extend(topic); got != -1 {
				t.Errorf("round %d: a reservation of another incarnation read as %d, want -1", round, got)
			}
		}
	}
}
