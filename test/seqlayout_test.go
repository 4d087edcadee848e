package test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/imshard/imshard/test/harness"
)

// TestSeqContinuesFromTheLayoutBefore: releases before the reservation
// string kept a topic's high-water and counter stamp in two strings of their
// own (seqhw:, seqstamp:), and a deployed Redis still holds them. The first
// allocation of such a topic moves them, atomically: under this server's
// stamp the counter goes on where it was (no jump, no seq twice); under
// another server's it is re-seeded above the durable reservation, as after
// a restart; the old strings are gone either way.
func TestSeqContinuesFromTheLayoutBefore(t *testing.T) {
	t.Parallel()
	env := shardOnly(t, harness.Options{})
	ctx := context.Background()
	alloc := env.App.Allocator()
	keys := env.Keys()
	info, err := env.Redis.Do(ctx, env.Redis.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	_, runID, _ := strings.Cut(info, "run_id:")
	runID, _, _ = strings.Cut(runID, "\r\n")
	if len(runID) != 40 {
		t.Fatalf("no run_id in INFO server: %q", runID)
	}
	str := func(key string) string {
		v, _ := env.Redis.Do(ctx, env.Redis.B().Get().Key(key).Build()).ToString()
		return v
	}
	for _, tc := range []struct {
		name, topic, stamp string
		continues          bool
	}{
		{"this server's stamp", "old1", runID, true},
		{"another server's stamp", "old2", strings.Repeat("0", 40), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var last int64
			for range 3 {
				a, err := alloc.Allocate(ctx, env.Tenant, tc.topic)
				if err != nil {
					t.Fatal(err)
				}
				last = a.Seq
			}
			hi, err := alloc.ReservedHi(ctx, env.Tenant, tc.topic)
			if err != nil || hi <= last {
				t.Fatalf("durable reservation %d (%v), want above %d", hi, err, last)
			}
			// the topic's Redis state as the layout before wrote it: the
			// counter string, its high-water and its stamp
			old := strings.TrimSuffix(keys.Seq(tc.topic), "seq:"+tc.topic)
			hwKey, stampKey := old+"seqhw:"+tc.topic, old+"seqstamp:"+tc.topic
			for _, r := range env.Redis.DoMulti(ctx,
				env.Redis.B().Del().Key(keys.SeqReservation(tc.topic)).Build(),
				env.Redis.B().Set().Key(hwKey).Value(strconv.FormatInt(hi, 10)).Build(),
				env.Redis.B().Set().Key(stampKey).Value(tc.stamp).Build()) {
				if err := r.Error(); err != nil {
					t.Fatal(err)
				}
			}
			a, err := alloc.Allocate(ctx, env.Tenant, tc.topic)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.continues && a.Seq != last+1:
				t.Fatalf("seq %d after the move, want %d: the counter goes on where it was", a.Seq, last+1)
			case !tc.continues && a.Seq <= hi:
				t.Fatalf("seq %d after the move, want above the durable reservation %d", a.Seq, hi)
			}
			n, err := env.Redis.Do(ctx, env.Redis.B().Exists().Key(hwKey, stampKey).Build()).AsInt64()
			if err != nil || n != 0 {
				t.Fatalf("%d strings of the layout before left (%v), want none", n, err)
			}
			if res := str(keys.SeqReservation(tc.topic)); !strings.HasPrefix(res, runID+":") {
				t.Fatalf("reservation %q, want this server's stamp", res)
			} else if h, _ := strconv.ParseInt(strings.TrimPrefix(res, runID+":"), 10, 64); h < a.Seq {
				t.Fatalf("reservation %q below the seq %d it issued", res, a.Seq)
			}
		})
	}
}
