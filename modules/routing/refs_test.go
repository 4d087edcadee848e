package routing

import (
	"reflect"
	"testing"
)

// TestRefsSpanCond: a topic's seqs at most spanGap apart are one range with
// the seqs as a filter; a seq further away starts another; a lone seq, and
// a new topic, are their own; a run of more than spanMax seqs is cut.
func TestRefsSpanCond(t *testing.T) {
	refs := []MessageRef{{"a", 4}, {"a", 8}, {"a", 8 + spanGap}, {"a", 9 + 2*spanGap}, {"b", 1}, {"b", 3}, {"c", 7}}
	query, args, err := RefsSpanCond(refs, "x.topic", "x.seq").ToSql()
	if err != nil {
		t.Fatal(err)
	}
	want := "((x.topic = ? AND x.seq BETWEEN ? AND ? AND x.seq + 0 IN (?,?,?)) OR (x.topic = ? AND x.seq = ?) OR " +
		"(x.topic = ? AND x.seq BETWEEN ? AND ? AND x.seq + 0 IN (?,?)) OR (x.topic = ? AND x.seq = ?))"
	if query != want {
		t.Fatalf("query:\n%s\nwant:\n%s", query, want)
	}
	wantArgs := []any{"a", int64(4), int64(8 + spanGap), int64(4), int64(8), int64(8 + spanGap), "a", int64(9 + 2*spanGap),
		"b", int64(1), int64(3), int64(1), int64(3), "c", int64(7)}
	if !reflect.DeepEqual(args, wantArgs) {
		t.Fatalf("args: %v, want %v", args, wantArgs)
	}
	long := make([]MessageRef, spanMax+1)
	for i := range long {
		long[i] = MessageRef{"d", int64(i + 1)}
	}
	cond := RefsSpanCond(long, "topic", "seq")
	if len(cond) != 2 {
		t.Fatalf("%d seqs in a row: %d ranges, want 2", len(long), len(cond))
	}
	if _, args, _ := cond[1].ToSql(); !reflect.DeepEqual(args, []any{"d", int64(spanMax + 1)}) {
		t.Fatalf("the cut run's rest: %v", args)
	}
}
