package test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// BenchmarkSentCall measures the send's call after the Kafka ack (the
// library's sent) on the shared Redis at 1, 8 and 64 sends a call: what a
// send costs Redis when its ack comes alone and when it shares the call
// with the sends acknowledged together (modules/send/postack.go). Each send
// is new (its own record, a pending entry the allocation made, a 300-byte
// message for the hot cache and the frame), over 100 topics. Reported:
// redis-µs/send, the FCALL's own time in INFO commandstats divided by the
// sends (what a Redis core spends inside the call, other clients' FCALLs
// of a shared server included), beside ns/send of the whole round trip.
//
//	go test ./test -run '^$' -bench SentCall -benchtime 20000x
func BenchmarkSentCall(b *testing.B) {
	rdb := testenv.Redis(b)
	ctx := context.Background()
	ks, err := routing.NewKeySpace("")
	if err != nil {
		b.Fatal(err)
	}
	tenant := testenv.NewTenant(b) // its keys are deleted on cleanup
	k, err := ks.Tenant(tenant)
	if err != nil {
		b.Fatal(err)
	}
	lib := routing.NewScripts().Fenced
	text := strings.Repeat("x", 200)
	n := 0
	for _, per := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("sends-per-call=%d", per), func(b *testing.B) {
			before := fcallUsec(b, rdb)
			sends := 0
			for b.Loop() {
				b.StopTimer()
				var keys, args []string
				pend := make([]rueidis.Completed, 0, per)
				for range per {
					n++
					topic := "t" + strconv.Itoa(n%100)
					seq := strconv.Itoa(n)
					member := seq + ":1"
					pend = append(pend, rdb.B().Zadd().Key(k.Pending(topic)).ScoreMember().ScoreMember(float64(n), member).Build())
					msg := `{"seq_id":` + seq + `,"topic":"` + topic + `","content":"` + text + `"}`
					keys = append(keys, k.Idempotency(topic, 1, "c"+seq), k.Pending(topic), k.HotMessages(topic), k.Realtime(topic),
						k.MessagesVersion(topic), k.Abandoned(topic))
					args = append(args, seq, "60000", `{"seq_id":`+seq+`}`, msg, "600000", "200", member,
						`{"type":"message","message":`+msg+`}`)
				}
				for _, r := range rdb.DoMulti(ctx, pend...) {
					if err := r.Error(); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				rep, err := lib.Sent(ctx, rdb, keys, args).AsIntSlice()
				if err != nil || len(rep) != per {
					b.Fatalf("sent for %d sends = %v %v", per, rep, err)
				}
				sends += per
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(sends), "ns/send")
			b.ReportMetric((fcallUsec(b, rdb)-before)/float64(sends), "redis-µs/send")
		})
	}
}

// fcallUsec is the time Redis has spent in FCALL since its statistics
// began (INFO commandstats).
func fcallUsec(b *testing.B, rdb rueidis.Client) float64 {
	info, err := rdb.Do(context.Background(), rdb.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:"); ok {
			for _, f := range strings.Split(strings.TrimSpace(rest), ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					u, err := strconv.ParseFloat(v, 64)
					if err != nil {
						b.Fatal(err)
					}
					return u
				}
			}
		}
	}
	return 0
}
