package archive

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

func sortRow(rng *rand.Rand, i int) Row {
	s := func(v string) *string { return &v }
	n := func(v int64) *int64 { return &v }
	r := Row{MessageID: int64(i), Topic: fmt.Sprintf("g%03d", rng.IntN(50)), GroupID: 7, SeqID: int64(i), FromUser: rng.Int64N(9),
		MsgType: "text", Status: "normal", AuditStatus: "pass", Version: 1, CreatedAt: rng.Int64N(1 << 50), UpdatedAt: -5}
	if i%3 == 0 {
		r.ClientMsgID, r.Content, r.Head, r.MentionedUserIDs = s("c"), s(`{"text":"中文 `+fmt.Sprint(i)+`"}`), s(""), s("[1]")
		r.ReplySeqID, r.RootSeqID, r.RecalledAt, r.RecalledBy, r.DeletedAt, r.ExpiresAt = n(1), n(-2), n(3), n(4), n(0), n(1<<50)
	}
	return r
}

// TestSorterOrdersAcrossRuns: rows added in any order come out in (topic,
// seqid) order, equal to what went in, whether they stayed in memory or
// went through run files; a repeated (topic, seqid) fails.
func TestSorterOrdersAcrossRuns(t *testing.T) {
	for _, budget := range []int64{1 << 30, 20_000, 1} {
		rng := rand.New(rand.NewPCG(1, uint64(budget)))
		var in []Row
		for i := range 2000 {
			in = append(in, sortRow(rng, i))
		}
		rng.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		s := newSorter(t.TempDir(), budget)
		for _, r := range in {
			addRow(t, s, r)
		}
		if spilled := len(s.runs) > 1; spilled != (budget < 1<<30) {
			t.Fatalf("budget %d: %d runs", budget, len(s.runs))
		}
		if out, ok := sortedOut(t, s, in); !ok {
			t.Fatalf("budget %d: %d rows out, not the %d sorted rows in", budget, len(out), len(in))
		}
	}
	for _, budget := range []int64{1 << 30, 1} {
		s := newSorter(t.TempDir(), budget)
		r := sortRow(rand.New(rand.NewPCG(3, 3)), 1)
		for range 2 {
			addRow(t, s, r)
		}
		if err := s.Each(func([]byte) error { return nil }); err == nil {
			t.Fatalf("budget %d: a repeated (topic, seqid) passed", budget)
		}
		s.Close()
	}
}

// TestSorterTakesRangesInTurn: pages of two ranges of message ids,
// interleaved as scanTable's readers hand them over, come out in (topic,
// seqid) order — when each range's seqs follow the one before (the
// buckets found sorted) and when they do not (a later range holding lower
// seqs: the buckets sorted again).
func TestSorterTakesRangesInTurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, lowerLater := range []bool{false, true} {
		var ranges [2][]Row
		for i := range 3000 {
			r := sortRow(rng, i)
			half := i * 2 / 3000
			if lowerLater {
				half = 1 - half
			}
			ranges[half] = append(ranges[half], r)
		}
		s := newSorter(t.TempDir(), 1<<30)
		for p := 0; p*100 < 1500; p++ {
			for k := range ranges {
				pg := &page{rng: k}
				for _, r := range ranges[k][p*100 : (p+1)*100] {
					off := len(pg.buf)
					var key recKey
					var err error
					if pg.buf, key, err = appendRecord(pg.buf, r.values()); err != nil {
						t.Fatal(err)
					}
					pg.recs = append(pg.recs, pageRec{off: off, end: len(pg.buf), key: key})
				}
				if err := s.Add(pg); err != nil {
					t.Fatal(err)
				}
			}
		}
		in := append(slices.Clone(ranges[0]), ranges[1]...)
		if out, ok := sortedOut(t, s, in); !ok {
			t.Fatalf("lower seqs later %v: %d rows out, not the %d sorted rows in", lowerLater, len(out), len(in))
		}
	}
}

// sortedOut reads every row out of s, in its order, and closes it; ok:
// they are the rows in, sorted (in is sorted in place).
func sortedOut(t *testing.T, s *sorter, in []Row) (out []Row, ok bool) {
	t.Helper()
	if err := s.Each(func(rec []byte) error {
		r, err := decodeRecord(rec)
		out = append(out, r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	slices.SortFunc(in, func(a, b Row) int { return keyCompare([]byte(a.Topic), a.SeqID, []byte(b.Topic), b.SeqID) })
	return out, reflect.DeepEqual(in, out)
}

// addRow adds r to s as the export adds a row it read.
func addRow(t *testing.T, s *sorter, r Row) {
	t.Helper()
	rec, key, err := appendRecord([]byte("a page's earlier records"), r.values())
	if err != nil {
		t.Fatal(err)
	}
	pr := pageRec{off: len("a page's earlier records"), end: len(rec), key: key}
	if got := rec[pr.off:pr.end]; string(key.topic(got)) != r.Topic || key.seq != r.SeqID {
		t.Fatalf("key %q %d of %q %d", key.topic(got), key.seq, r.Topic, r.SeqID)
	}
	if err := s.Add(&page{buf: rec, recs: []pageRec{pr}}); err != nil {
		t.Fatal(err)
	}
}

// decodeRecord is the Row of rec, decoded from the middle of other bytes
// as the export's records are.
func decodeRecord(rec []byte) (Row, error) {
	const before = "an earlier record"
	d := newRowDecoder()
	d.records(append([]byte(before), rec...))
	return d.row(len(before), len(before)+len(rec))
}

// TestDecodeRowTruncated: a record decodes into the row it was made from;
// a record cut anywhere is an error, not a row.
func TestDecodeRowTruncated(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for i := range 6 {
		r := sortRow(rng, i)
		rec, _, err := appendRecord(nil, r.values())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := decodeRecord(rec); err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip: %v %+v", err, got)
		}
		for cut := range len(rec) {
			if _, err := decodeRecord(rec[:cut]); err == nil {
				t.Fatalf("cut at %d of %d read as a row", cut, len(rec))
			}
		}
		if _, err := decodeRecord(append(rec, kindNull)); err == nil {
			t.Fatal("a record too long read as a row")
		}
	}
}

// TestCanonicalRecord: a record hashes to the bytes routing.CanonicalRow
// writes for the driver values it was made from, whatever the values (JSON
// the fast path takes, JSON it leaves to the decoding path, text that is
// not JSON, NULLs, times in any zone), and to the hashes archived
// manifests hold.
func TestCanonicalRecord(t *testing.T) {
	at := time.Date(2026, 11, 3, 4, 5, 6, 789_654_000, time.FixedZone("X", 3600))
	pinned := map[string][]any{
		"8c420f20bc39df449cc69cbc5dc1c8bc778d4a3a3996cd445f1d0f964196071d": {int64(-9), []byte("中文"), int64(0),
			int64(1 << 40), int64(-1), []byte(""), []byte("image"), []byte("recalled"),
			[]byte(" {\"b\" : [1, 2.50, {\"z\":null,\"a\":\"<&>\"}], \"a\":\"x\\u0041\"} "), []byte(""), []byte("[3, 1]"),
			int64(1), int64(5), int64(2), int64(3), int64(1024), int64(1), []byte("reject"), int64(4), at,
			int64(42), at.Add(time.Hour), at.Add(-time.Microsecond), at, at.Add(time.Second)},
		"6d43d956fc1f8aa82fc978e6f01f18507d3c4c0e0e1b296310b552c426287be0": {int64(3), []byte("t"), int64(3), int64(3),
			int64(3), []byte("cmid"), []byte("text"), []byte("normal"), []byte(`not json`), []byte(`{"a":1,"a":2}`),
			[]byte("[]"), int64(0), nil, nil, int64(0), int64(0), int64(0), []byte("pass"), int64(0), nil, nil, nil, nil, at, at},
	}
	rows := [][]any{}
	for _, vals := range pinned {
		rows = append(rows, vals)
	}
	rng := rand.New(rand.NewPCG(4, 4))
	for i := range 200 {
		rows = append(rows, func() []any { r := sortRow(rng, i); return r.values() }())
	}
	var want, got bytes.Buffer
	for _, vals := range rows {
		want.Reset()
		got.Reset()
		if err := routing.CanonicalRow(&want, vals); err != nil {
			t.Fatal(err)
		}
		rec, _, err := appendRecord(nil, vals)
		if err != nil {
			t.Fatal(err)
		}
		if err := canonicalRecord(&got, rec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("record %q, CanonicalRow %q", got.Bytes(), want.Bytes())
		}
	}
	for sum, vals := range pinned {
		rec, _, err := appendRecord(nil, vals)
		if err != nil {
			t.Fatal(err)
		}
		got.Reset()
		if err := canonicalRecord(&got, rec); err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(got.Bytes()); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%q hashes to %x, archived manifests hold %s", got.Bytes(), h, sum)
		}
		if err := canonicalRecord(&got, rec[:len(rec)-1]); err == nil {
			t.Error("a cut record hashed")
		}
	}
}

func BenchmarkDecodeRow(b *testing.B) {
	r := sortRow(rand.New(rand.NewPCG(2, 2)), 4)
	r.Content = new(string)
	*r.Content = `{"text":"bench message 12345"}`
	rec, _, _ := appendRecord(nil, r.values())
	d := newRowDecoder()
	d.records(rec)
	for b.Loop() {
		if _, err := d.row(0, len(rec)); err != nil {
			b.Fatal(err)
		}
		d.ints, d.strs = d.ints[:0], d.strs[:0]
	}
}

func BenchmarkCanonicalRecord(b *testing.B) {
	r := sortRow(rand.New(rand.NewPCG(2, 2)), 4)
	r.Content = new(string)
	*r.Content = `{"text":"bench message 12345"}`
	rec, _, _ := appendRecord(nil, r.values())
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if err := canonicalRecord(&buf, rec); err != nil {
			b.Fatal(err)
		}
	}
}
