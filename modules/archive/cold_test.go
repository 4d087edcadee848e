package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// putMonth writes an archive of topics t0..t(n-1), each with seqs
// 1..perTopic (message id = topic*1e6 + seq), and its manifest to url.
func putMonth(t testing.TB, url, tenant string, m routing.Month, topics, perTopic int) {
	t.Helper()
	ctx := context.Background()
	var buf bytes.Buffer
	pw := newWriter(&buf)
	man := Manifest{SchemaVersion: SchemaVersion, Tenant: tenant, Month: m.String(), Object: ObjectKey(tenant, m)}
	names := make([]string, topics)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
	}
	slices.Sort(names) // the file and the manifest in topic order, as an export writes them
	for _, topic := range names {
		var i int
		fmt.Sscanf(topic, "t%d", &i)
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

// coldMonth is a reader caching cacheBytes over a bucket in a temporary
// directory (its url) holding tenant "ten"'s month m of topics topics
// of perTopic rows (putMonth); the reader is closed at the end of t.
func coldMonth(t testing.TB, topics, perTopic int, cacheBytes int64) (*Cold, string, routing.Month) {
	t.Helper()
	url := "file://" + t.TempDir()
	m, _ := routing.ParseMonth("202601")
	putMonth(t, url, "ten", m, topics, perTopic)
	c := NewCold(url, cacheBytes, prometheus.NewRegistry())
	t.Cleanup(func() { _ = c.Close() })
	return c, url, m
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

// RowsAt reads the rows of many topics' messages (a user erase's batch)
// with each row group fetched and read once: sixty topics of 100 rows fit
// in one row group, so their rows take one range request, where a read
// per topic took one each; three topics in three groups, one of them in
// two, take three; the rows come in refs' order, one the month lacks left
// out.
func TestColdRowsAtFetchesEachRowGroupOnce(t *testing.T) {
	c, url, m := coldMonth(t, 60, 100, 1<<20)
	ctx := context.Background()
	var refs []routing.MessageRef
	for i := range 60 {
		for seq := int64(4); seq <= 100; seq += 4 {
			refs = append(refs, routing.MessageRef{Topic: fmt.Sprintf("t%d", i), Seq: seq})
		}
	}
	routing.SortRefs(refs)
	held := slices.Clone(refs)
	refs = append(refs, routing.MessageRef{Topic: "t7", Seq: 101}, routing.MessageRef{Topic: "zz", Seq: 1})
	routing.SortRefs(refs)
	rows, err := c.RowsAt(ctx, "ten", m, refs)
	if err != nil || len(rows) != len(held) {
		t.Fatalf("rows at: %d rows, %v", len(rows), err)
	}
	for i, r := range rows {
		if want := held[i]; r.Topic != want.Topic || r.Seq != want.Seq || string(r.Content) != fmt.Sprintf(`{"text":"%s-%d"}`, r.Topic, r.Seq) {
			t.Fatalf("row %d: %+v, want %+v", i, r, want)
		}
	}
	if n := testutil.ToFloat64(c.m.ranges); n != 2 {
		t.Fatalf("rows of 60 topics made %v range requests, want 2 (the footer, one row group)", n)
	}

	// topics across row groups: three topics of 7,000 rows in three groups
	// of 8,192, the middle topic in two of them
	putMonth(t, url, "ten", m.Next(), 3, 7000)
	refs = refs[:0]
	for _, topic := range []string{"t0", "t1", "t2"} {
		for seq := int64(1); seq <= 7000; seq += 499 {
			refs = append(refs, routing.MessageRef{Topic: topic, Seq: seq})
		}
	}
	if rows, err = c.RowsAt(ctx, "ten", m.Next(), refs); err != nil || len(rows) != len(refs) {
		t.Fatalf("rows at across groups: %d rows, %v", len(rows), err)
	}
	for i, r := range rows {
		if r.Topic != refs[i].Topic || r.Seq != refs[i].Seq {
			t.Fatalf("row %d across groups: %s/%d, want %+v", i, r.Topic, r.Seq, refs[i])
		}
	}
	if n := testutil.ToFloat64(c.m.ranges); n != 2+4 {
		t.Fatalf("rows of three topics in three groups made %v range requests, want 4 (the footer, three row groups)", n-2)
	}
}

// BenchmarkColdPage reads the newest 50 messages of a topic below a seq
// from a warm cache (footer cached): a month of 1,000 topics of 200 rows,
// about 80 topics a row group.
func BenchmarkColdPage(b *testing.B) {
	c, _, m := coldMonth(b, 1000, 200, 1<<26)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		topic := fmt.Sprintf("t%d", (i*7919)%1000)
		rows, err := c.Rows(ctx, "ten", m, readpath.ColdRange{Topic: topic, Lo: 1, Hi: 150, Desc: true, Limit: 50})
		if err != nil || len(rows) != 50 || rows[0].Seq != 150 {
			b.Fatalf("rows: %v %v", seqsOf(rows), err)
		}
	}
}

// A page read decodes only the window of its topic and seq range, in
// batches from either end: ranges at a group's edges, across groups, and
// longer than one batch give the rows a whole-group scan gives.
func TestColdRowsReadTheirWindow(t *testing.T) {
	url := "file://" + t.TempDir()
	m, _ := routing.ParseMonth("202601")
	putMonth(t, url, "ten", m, 4, 3000) // 12,000 rows: t1 spans two row groups
	c := NewCold(url, 1<<20, prometheus.NewRegistry())
	defer c.Close()
	ctx := context.Background()
	keepOdd := func(r *readpath.Row) bool { return r.Seq%2 == 1 }
	want := func(lo, hi int64, desc bool, limit int, keep bool) string {
		var out []int64
		for s := lo; s <= hi; s++ {
			if !keep || s%2 == 1 {
				out = append(out, s)
			}
		}
		if desc {
			slices.Reverse(out)
		}
		return fmt.Sprint(out[:min(limit, len(out))])
	}
	for _, tc := range []struct {
		name   string
		topic  string
		lo, hi int64
		desc   bool
		limit  int
		keep   bool
	}{
		{"newest page", "t1", 1, 3000, true, 50, false},
		{"oldest page", "t1", 1, 3000, false, 50, false},
		{"across the group boundary, newest first", "t1", 2000, 2600, true, 600, false},
		{"across the group boundary, oldest first", "t1", 2000, 2600, false, 600, false},
		{"longer than a batch, filtered", "t2", 10, 2990, true, 700, true},
		{"one seq", "t3", 3000, 3000, false, 5, false},
		{"the first topic's first rows", "t0", 1, 3, false, 50, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := readpath.ColdRange{Topic: tc.topic, Lo: tc.lo, Hi: tc.hi, Desc: tc.desc, Limit: tc.limit}
			if tc.keep {
				r.Keep = keepOdd
			}
			rows, err := c.Rows(ctx, "ten", m, r)
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range rows {
				if row.Topic != tc.topic || string(row.Content) != fmt.Sprintf(`{"text":"%s-%d"}`, tc.topic, row.Seq) {
					t.Fatalf("row %s/%d: %s", row.Topic, row.Seq, row.Content)
				}
			}
			if got, w := fmt.Sprint(seqsOf(rows)), want(tc.lo, tc.hi, tc.desc, tc.limit, tc.keep); got != w {
				t.Fatalf("seqs %.80s…, want %.80s…", got, w)
			}
		})
	}
}

// sentByMonth writes tenant "ten"'s month of 3 topics of 6,000 rows (three
// row groups, the middle topic across two), every third row sent by user
// 7, some deleted and edited, and answers a reader over it and the rows.
func sentByMonth(t testing.TB) (*Cold, routing.Month, []Row) {
	t.Helper()
	ctx := context.Background()
	url := "file://" + t.TempDir()
	m, _ := routing.ParseMonth("202601")
	var rows []Row
	for i, topic := range []string{"a", "b", "c"} {
		for s := int64(1); s <= 6000; s++ {
			text := fmt.Sprintf(`{"text":"%s-%d"}`, topic, s)
			r := Row{MessageID: int64(i)*1e6 + s, Topic: topic, SeqID: s, FromUser: 5 + 2*(s%3/2), MsgType: "text",
				Status: "normal", Content: &text, Version: 1 + s%4, CreatedAt: 1.7e15, UpdatedAt: 1.7e15}
			if s%5 == 0 {
				r.Status, r.Content = "deleted", nil
			}
			rows = append(rows, r)
		}
	}
	var buf bytes.Buffer
	pw := newWriter(&buf)
	if _, err := pw.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	man := Manifest{SchemaVersion: SchemaVersion, Tenant: "ten", Month: m.String(), Object: ObjectKey("ten", m),
		Rows: int64(len(rows)), Bytes: int64(buf.Len()), MinMessageID: 1, MaxMessageID: 2e6 + 6000}
	for _, topic := range []string{"a", "b", "c"} {
		man.Topics = append(man.Topics, TopicRange{Topic: topic, MinSeq: 1, MaxSeq: 6000, Count: 6000})
	}
	raw, _ := json.Marshal(man)
	bucket, err := OpenBucket(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	if err := bucket.WriteAll(ctx, ObjectKey("ten", m), buf.Bytes(), nil); err != nil {
		t.Fatal(err)
	}
	if err := bucket.WriteAll(ctx, manifestKey("ten", m), raw, nil); err != nil {
		t.Fatal(err)
	}
	c := NewCold(url, 1<<26, prometheus.NewRegistry())
	t.Cleanup(func() { _ = c.Close() })
	return c, m, rows
}

// SentBy, which decodes only the from_user column and then five columns
// of the rows that match, answers what a filter of every whole row gives:
// each of the user's rows, in file order, with its message id, status and
// version, across row groups and pages.
func TestColdSentByReadsTheUsersRows(t *testing.T) {
	c, m, rows := sentByMonth(t)
	for _, user := range []int64{7, 5, 6} {
		var want []routing.ArchivedRow
		for _, r := range rows {
			if r.FromUser == user {
				want = append(want, routing.ArchivedRow{Topic: r.Topic, Seq: r.SeqID, MessageID: r.MessageID, Status: r.Status, Version: int(r.Version)})
			}
		}
		got, err := c.SentBy(context.Background(), "ten", m, user)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("user %d: %d rows, want %d (first %+v, want %+v)", user, len(got), len(want), got[:min(len(got), 1)], want[:min(len(want), 1)])
		}
	}
}

// BenchmarkColdSentBy is a user erase's scan of an archived month of
// 18,000 rows (three row groups) for the third of them one user sent, from
// a warm cache.
func BenchmarkColdSentBy(b *testing.B) {
	c, m, _ := sentByMonth(b)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if rows, err := c.SentBy(ctx, "ten", m, 7); err != nil || len(rows) != 6000 {
			b.Fatalf("%d rows: %v", len(rows), err)
		}
	}
}
