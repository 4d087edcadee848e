package routing_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

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
	v := loadFenced(ctx, t, rdb, [][2]string{{"local memo, memo_n, memo_max = {}, 0, 4096", "local memo, memo_n, memo_max = {}, 0, 2"}})
	run := serverRunID(ctx, t, rdb)
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
