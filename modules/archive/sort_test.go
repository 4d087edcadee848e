package archive

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
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
			if err := s.Add(r.values()); err != nil {
				t.Fatal(err)
			}
		}
		if spilled := len(s.runs) > 1; spilled != (budget < 1<<30) {
			t.Fatalf("budget %d: %d runs", budget, len(s.runs))
		}
		var out []Row
		if err := s.Each(func(vals []any) error {
			r, err := rowOf(vals)
			out = append(out, r)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		slices.SortFunc(in, func(a, b Row) int { return keyCompare([]byte(a.Topic), a.SeqID, []byte(b.Topic), b.SeqID) })
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("budget %d: %d rows out, not the %d sorted rows in", budget, len(out), len(in))
		}
	}
	for _, budget := range []int64{1 << 30, 1} {
		s := newSorter(t.TempDir(), budget)
		r := sortRow(rand.New(rand.NewPCG(3, 3)), 1)
		for range 2 {
			if err := s.Add(r.values()); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Each(func([]any) error { return nil }); err == nil {
			t.Fatalf("budget %d: a repeated (topic, seqid) passed", budget)
		}
		s.Close()
	}
}

// TestReadRecordTruncated: a record cut anywhere is an error, not a row.
func TestReadRecordTruncated(t *testing.T) {
	r := sortRow(rand.New(rand.NewPCG(2, 2)), 3)
	rec, _, err := appendRecord(nil, r.values())
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]any, columns)
	if err := readRecord(rec, vals); err != nil {
		t.Fatal(err)
	}
	if got, err := rowOf(vals); err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip: %v %+v", err, got)
	}
	for cut := range len(rec) {
		if err := readRecord(rec[:cut], vals); err == nil {
			t.Fatalf("cut at %d of %d read as a row", cut, len(rec))
		}
	}
}
