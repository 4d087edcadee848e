package archive

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

// TestEncodedGroupsAsOneWriter: the row groups encoded apart and spliced
// in order make the file one Parquet writer given every row writes, byte
// for byte (the file archives written before hold), with the manifest's
// counts, ranges and digests those of the rows — whether the records
// stayed in memory or went through sort runs.
func TestEncodedGroupsAsOneWriter(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	var in []Row
	for i := range 3*rowGroupRows + 700 {
		in = append(in, sortRow(rng, i))
	}
	sorted := slices.Clone(in)
	slices.SortFunc(sorted, func(a, b Row) int { return keyCompare([]byte(a.Topic), a.SeqID, []byte(b.Topic), b.SeqID) })
	var want bytes.Buffer
	one := newWriter(&want)
	if _, err := one.Write(sorted); err != nil {
		t.Fatal(err)
	}
	if err := one.Close(); err != nil {
		t.Fatal(err)
	}
	wantDigests, wantRanges := map[string]*routing.Digest{}, map[string]*TopicRange{}
	var buf bytes.Buffer
	for _, r := range sorted {
		sum, err := routing.RowSum(&buf, r.values())
		if err != nil {
			t.Fatal(err)
		}
		if wantDigests[r.Topic] == nil {
			wantDigests[r.Topic] = &routing.Digest{}
			wantRanges[r.Topic] = &TopicRange{Topic: r.Topic, MinAt: r.CreatedAt, MaxAt: r.CreatedAt}
		}
		wantDigests[r.Topic].Add(r.SeqID, sum)
		tr := wantRanges[r.Topic]
		tr.MinAt, tr.MaxAt = min(tr.MinAt, r.CreatedAt), max(tr.MaxAt, r.CreatedAt)
	}
	for _, budget := range []int64{1 << 30, 200_000} {
		s := newSorter(t.TempDir(), budget)
		for _, r := range in {
			addRow(t, s, r)
		}
		var got bytes.Buffer
		pw := newWriter(&got)
		var man Manifest
		ranges, digests := map[string]*TopicRange{}, map[string]*routing.Digest{}
		var committed int64
		if err := writeSorted(context.Background(), s, pw, &man, ranges, digests, func(n int64) { committed += n }); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if err := pw.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("budget %d: %d bytes, not the %d one writer writes", budget, got.Len(), want.Len())
		}
		n := int64(len(in))
		if man.Rows != n || committed != n || man.MinMessageID != 0 || man.MaxMessageID != n-1 {
			t.Fatalf("budget %d: manifest rows %d (committed %d), ids %d..%d", budget, man.Rows, committed, man.MinMessageID, man.MaxMessageID)
		}
		if len(digests) != len(wantDigests) || len(ranges) != len(wantRanges) {
			t.Fatalf("budget %d: %d digests, %d ranges, want %d", budget, len(digests), len(ranges), len(wantDigests))
		}
		for topic, d := range wantDigests {
			if *digests[topic] != *d || *ranges[topic] != *wantRanges[topic] {
				t.Fatalf("budget %d: topic %s: %+v %+v, want %+v %+v", budget, topic, digests[topic], ranges[topic], d, wantRanges[topic])
			}
		}
	}
}

// TestWriteSortedStopsOnABadRecord: a record that does not decode fails
// the export, whichever goroutine meets it, and nothing hangs.
func TestWriteSortedStopsOnABadRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	s := newSorter(t.TempDir(), 1<<30)
	defer s.Close()
	for i := range 5 * rowGroupRows {
		addRow(t, s, sortRow(rng, i))
	}
	// a record cut short, its key intact: the merge passes it on, an
	// encoder fails on it
	last := sortRow(rng, 5*rowGroupRows)
	bad, key, err := appendRecord(nil, last.values())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add(&page{buf: bad[:len(bad)-1], recs: []pageRec{{end: len(bad) - 1, key: key}}}); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	err = writeSorted(context.Background(), s, newWriter(&got), &Manifest{}, map[string]*TopicRange{}, map[string]*routing.Digest{}, func(int64) {})
	if err == nil {
		t.Fatal("a bad record was written")
	}
}

// BenchmarkEncodeGroup: one encoder hashing, decoding and encoding a row
// group of rows shaped as bench archive's month (a client id and a short
// JSON text, the other optional columns NULL), per row.
func BenchmarkEncodeGroup(b *testing.B) {
	g := &recGroup{}
	for i := range rowGroupRows {
		id, text := fmt.Sprintf("b%d", i), fmt.Sprintf(`{"text": "bench message %d"}`, i)
		r := Row{MessageID: int64(i), Topic: fmt.Sprintf("bench_topic_%04d", i/8), GroupID: 7, SeqID: int64(i), FromUser: int64(i % 16),
			ClientMsgID: &id, MsgType: "text", Status: "normal", Content: &text, AuditStatus: "pass", Version: 1,
			CreatedAt: 1 << 50, UpdatedAt: 1 << 50}
		rec, _, err := appendRecord(nil, r.values())
		if err != nil {
			b.Fatal(err)
		}
		g.add(rec)
	}
	e := &encoder{dec: newRowDecoder()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.encode(g); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rowGroupRows), "ns/row")
}
