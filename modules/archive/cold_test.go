package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// putMonth writes an archive of topics t0..t(n-1), each with seqs
// 1..perTopic (message id = topic*1e6 + seq), and its manifest to url.
func putMonth(t *testing.T, url, tenant string, m routing.Month, topics, perTopic int) {
	t.Helper()
	ctx := context.Background()
	var buf bytes.Buffer
	pw := newWriter(&buf)
	man := Manifest{SchemaVersion: SchemaVersion, Tenant: tenant, Month: m.String(), Object: ObjectKey(tenant, m)}
	for i := range topics {
		topic := fmt.Sprintf("t%d", i)
		rows := make([]Row, perTopic)
		for s := range rows {
			text := fmt.Sprintf(`{"text":"%s-%d"}`, topic, s+1)
			rows[s] = Row{MessageID: int64(i)*1e6 + int64(s+1), Topic: topic, SeqID: int64(s + 1), MsgType: "text",
				Status: "normal", Content: &text, Version: 1, CreatedAt: 1.7e15, UpdatedAt: 1.7e15}
		}
		if _, err := pw.Write(rows); err != nil {
			t.Fatal(err)
		}
		man.Topics = append(man.Topics, TopicRange{Topic: topic, MinSeq: 1, MaxSeq: int64(perTopic), Count: int64(perTopic)})
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	man.Rows, man.Bytes = int64(topics*perTopic), int64(buf.Len())
	man.MinMessageID, man.MaxMessageID = 1, int64(topics-1)*1e6+int64(perTopic)
	raw, _ := json.Marshal(man)
	bucket, err := OpenBucket(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	if err := bucket.WriteAll(ctx, ObjectKey(tenant, m), buf.Bytes(), nil); err != nil {
		t.Fatal(err)
	}
	if err := bucket.WriteAll(ctx, manifestKey(tenant, m), raw, nil); err != nil {
		t.Fatal(err)
	}
}

func seqsOf(rows []readpath.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

// A cold read fetches the footer once (then served from the cache) and
// only the row groups the statistics leave; readers run concurrently; an
// object replaced under the cache (archived again) is read afresh.
func TestColdReadsFetchOnlyTheRowGroupsNeeded(t *testing.T) {
	url := "file://" + t.TempDir()
	m, _ := routing.ParseMonth("202601")
	putMonth(t, url, "ten", m, 3, 7000) // 21,000 rows: three row groups
	c := NewCold(url, 1<<20, prometheus.NewRegistry())
	defer c.Close()
	ctx := context.Background()
	ranges := func() float64 { return testutil.ToFloat64(c.m.ranges) }

	keepOdd := func(r *readpath.Row) bool { return r.Seq%2 == 1 }
	rows, err := c.Rows(ctx, "ten", m, readpath.ColdRange{Topic: "t1", Lo: 6990, Hi: 7000, Desc: true, Limit: 3, Keep: keepOdd})
	if err != nil || fmt.Sprint(seqsOf(rows)) != "[6999 6997 6995]" {
		t.Fatalf("rows: %v %v", seqsOf(rows), err)
	}
	if n := ranges(); n != 2 {
		t.Fatalf("a cold read made %v range requests, want 2 (the footer, one row group)", n)
	}
	rows, err = c.Rows(ctx, "ten", m, readpath.ColdRange{Topic: "t2", Lo: 1, Hi: 1 << 62, Limit: 2})
	if err != nil || fmt.Sprint(seqsOf(rows)) != "[1 2]" {
		t.Fatalf("rows: %v %v", seqsOf(rows), err)
	}
	if n := ranges(); n != 3 {
		t.Fatalf("a warm read made %v range requests, want 1", n-2)
	}
	if rows, err := c.Rows(ctx, "ten", m, readpath.ColdRange{Topic: "t9", Lo: 1, Hi: 10, Limit: 2}); err != nil || len(rows) != 0 || ranges() != 3 {
		t.Fatalf("a topic the month lacks: %v %v, %v requests", rows, err, ranges())
	}
	row, ok, err := c.ByID(ctx, "ten", m, 2e6+6500)
	if err != nil || !ok || row.Topic != "t2" || row.Seq != 6500 || string(row.Content) != `{"text":"t2-6500"}` {
		t.Fatalf("by id: %+v %v %v", row, ok, err)
	}
	if lo, hi, ok, err := c.IDRange(ctx, "ten", m); err != nil || !ok || lo != 1 || hi != 2e6+7000 {
		t.Fatalf("id range: %d %d %v %v", lo, hi, ok, err)
	}

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := int64(1 + i*800)
			rows, err := c.Rows(ctx, "ten", m, readpath.ColdRange{Topic: "t0", Lo: seq, Hi: seq, Limit: 1})
			if err != nil || len(rows) != 1 || rows[0].Seq != seq {
				t.Errorf("concurrent read of %d: %v %v", seq, seqsOf(rows), err)
			}
		}()
	}
	wg.Wait()

	putMonth(t, url, "ten", m, 2, 100) // restored and archived again: another object
	rows, err = c.Rows(ctx, "ten", m, readpath.ColdRange{Topic: "t1", Lo: 1, Hi: 1 << 62, Desc: true, Limit: 1})
	if err != nil || fmt.Sprint(seqsOf(rows)) != "[100]" {
		t.Fatalf("after the object changed: %v %v", seqsOf(rows), err)
	}
}
