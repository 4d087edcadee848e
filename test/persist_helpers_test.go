package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// persistIDs hands out unique message ids (snowflakes in production).
var persistIDs atomic.Int64

// persistEvent is a valid event of tenant, as send would produce it.
func persistEvent(tenant, topic string, seq int64, m routing.Month, from int64, cmid string) message.Event {
	return message.Event{
		V: message.EventVersion, EventID: fmt.Sprintf("ev-%s-%d", topic, seq), Tenant: tenant, Topic: topic,
		GroupID: 7, SeqID: seq, ShardMonth: m.String(), MessageID: message.ID(persistIDs.Add(1)),
		FromUser: message.ID(from), ClientMsgID: cmid, MsgType: "text",
		Content: json.RawMessage(`{"text":"m` + strconv.FormatInt(seq, 10) + `"}`), CreatedAt: message.NewTime(time.Now()),
	}
}

// persistProduce writes events to the message topic (keyed tenant/topic).
func persistProduce(t *testing.T, env *harness.Env, evs ...message.Event) {
	t.Helper()
	persistProduceTo(t, env.Config.Kafka.Brokers, env.Config.Kafka.Topic, evs...)
}

func persistProduceTo(t *testing.T, brokers []string, topic string, evs ...message.Event) {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i := range evs {
		v, err := json.Marshal(&evs[i])
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: topic, Key: evs[i].Key(), Value: v}
	}
	persistProduceRecords(t, brokers, recs...)
}

func persistProduceRecords(t *testing.T, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// persistStored maps topic → seq → month of every row in the months' tables
// and fails the test on a (topic, seq) stored twice.
func persistStored(t *testing.T, db *sql.DB, months ...routing.Month) map[string]map[int64]routing.Month {
	t.Helper()
	out := map[string]map[int64]routing.Month{}
	for _, m := range months {
		table, err := routing.TableFor(m)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query("SELECT topic, seqid FROM " + table.Quoted())
		if err != nil {
			if strings.Contains(err.Error(), "1146") {
				continue
			}
			t.Fatal(err)
		}
		for rows.Next() {
			var topic string
			var seq int64
			if err := rows.Scan(&topic, &seq); err != nil {
				t.Fatal(err)
			}
			if out[topic] == nil {
				out[topic] = map[int64]routing.Month{}
			}
			if prev, dup := out[topic][seq]; dup {
				t.Fatalf("%s seq %d stored twice: %s and %s", topic, seq, prev, m)
			}
			out[topic][seq] = m
		}
		rows.Close()
	}
	return out
}

func persistCount(stored map[string]map[int64]routing.Month) int {
	n := 0
	for _, s := range stored {
		n += len(s)
	}
	return n
}

// persistWaitCount waits until the months' tables hold n rows in all.
func persistWaitCount(t *testing.T, env *harness.Env, n int, d time.Duration, months ...routing.Month) map[string]map[int64]routing.Month {
	t.Helper()
	return persistWaitCountIn(t, env.DB, n, d, months...)
}

func persistWaitCountIn(t *testing.T, db *sql.DB, n int, d time.Duration, months ...routing.Month) map[string]map[int64]routing.Month {
	t.Helper()
	var got map[string]map[int64]routing.Month
	deadline := time.Now().Add(d)
	for {
		got = persistStored(t, db, months...)
		if persistCount(got) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c := persistCount(got); c != n {
		t.Fatalf("stored %d rows, want %d", c, n)
	}
	return got
}

// persistCheckRoutes checks, for every topic, that the MySQL mirror agrees
// with the month tables and the Redis route with the mirror.
func persistCheckRoutes(t *testing.T, env *harness.Env, stored map[string]map[int64]routing.Month) {
	t.Helper()
	persistCheckRoutesOf(t, env.DB, env.App.Routes(), env.Tenant, stored)
}

func persistCheckRoutesOf(t *testing.T, db *sql.DB, routes *routing.Routes, tenant string, stored map[string]map[int64]routing.Month) {
	t.Helper()
	ctx := context.Background()
	for topic, seqs := range stored {
		want := map[routing.Month]*routing.MonthRange{}
		for seq, m := range seqs {
			r := want[m]
			if r == nil {
				r = &routing.MonthRange{Month: m, MinSeq: seq, MaxSeq: seq}
				want[m] = r
			}
			r.MinSeq, r.MaxSeq = min(r.MinSeq, seq), max(r.MaxSeq, seq)
			r.Count++
		}
		mirror, err := routing.LoadMirror(ctx, db, topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(mirror) != len(want) {
			t.Fatalf("%s: mirror %+v, tables %d months", topic, mirror, len(want))
		}
		for _, mr := range mirror {
			if w := want[mr.Month]; w == nil || *w != mr {
				t.Fatalf("%s: mirror %+v, tables %+v", topic, mr, w)
			}
		}
		var route []routing.MonthRange
		deadline := time.Now().Add(10 * time.Second)
		for {
			route, _, err = routes.Load(ctx, tenant, topic)
			if err == nil && fmt.Sprint(route) == fmt.Sprint(mirror) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Redis route %v (%v), mirror %v", topic, route, err, mirror)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// persistDeadLetters reads every record of the dead-letter topic.
func persistDeadLetters(t *testing.T, env *harness.Env) []*kgo.Record {
	t.Helper()
	return kafkaReadAll(t, env.Config.Kafka.Brokers, env.Config.Kafka.DLQTopic)
}

func persistHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// persistMetric sums the samples of a metric family on env's /metrics whose
// labels contain every given label pair (`name{...}` lines).
func persistMetric(t *testing.T, env *harness.Env, name string, labels ...string) float64 {
	t.Helper()
	return opsMetric(t, env.OpsURL, name, labels...)
}

// opsMetric is persistMetric of the process whose operations server is at
// opsURL.
func opsMetric(t *testing.T, opsURL, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
	for _, line := range strings.Split(opsMetrics(t, opsURL), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
