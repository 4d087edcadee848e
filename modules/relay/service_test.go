package relay

import (
	"errors"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/feed"
)

// TestAcknowledgedKeepsEachTopicFromItsFirstFailure: results arrive in the
// order the broker answered, not the order produced; a topic's rows after
// its first failure are kept even when their own records were acknowledged,
// so the next pass sends them again behind the failed one; another topic's
// rows are unaffected.
func TestAcknowledgedKeepsEachTopicFromItsFirstFailure(t *testing.T) {
	rows := []feed.Row{
		{ID: 1, Topic: "a", ChangeSeq: 1},
		{ID: 2, Topic: "b", ChangeSeq: 7},
		{ID: 3, Topic: "a", ChangeSeq: 2},
		{ID: 4, Topic: "a", ChangeSeq: 3},
		{ID: 5, Topic: "b", ChangeSeq: 8},
	}
	recs := make([]*kgo.Record, len(rows))
	for i := range rows {
		recs[i] = &kgo.Record{}
	}
	boom := errors.New("boom")
	for _, c := range []struct {
		name    string
		results kgo.ProduceResults
		want    []int64
		err     bool
	}{
		{"all acknowledged, answered out of order", kgo.ProduceResults{{Record: recs[4]}, {Record: recs[1]}, {Record: recs[0]}, {Record: recs[3]}, {Record: recs[2]}},
			[]int64{1, 2, 3, 4, 5}, false},
		{"a's second fails, its third acknowledged", kgo.ProduceResults{{Record: recs[0]}, {Record: recs[1]}, {Record: recs[2], Err: boom}, {Record: recs[3]}, {Record: recs[4]}},
			[]int64{1, 2, 5}, true},
		{"a record without a result is a failure", kgo.ProduceResults{{Record: recs[0]}, {Record: recs[2]}, {Record: recs[3]}, {Record: recs[4]}},
			[]int64{1, 3, 4}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := acknowledged(rows, recs, c.results)
			if !slices.Equal(got, c.want) || (err != nil) != c.err {
				t.Fatalf("acknowledged = %v, %v; want %v, error %v", got, err, c.want, c.err)
			}
		})
	}
}

// TestSendableHoldsATopicFromItsFirstOversizeEvent: an event the producer
// would refuse is not handed to it, and neither are its topic's later
// ones (which would be acknowledged past it); other topics go on.
func TestSendableHoldsATopicFromItsFirstOversizeEvent(t *testing.T) {
	big := make([]byte, maxEventBytes+1)
	rows := []feed.Row{
		{ID: 1, Topic: "a", ChangeSeq: 1, Event: []byte("{}")},
		{ID: 2, Topic: "a", ChangeSeq: 2, Event: big},
		{ID: 3, Topic: "b", ChangeSeq: 1, Event: []byte("{}")},
		{ID: 4, Topic: "a", ChangeSeq: 3, Event: []byte("{}")},
	}
	got, err := sendable(rows)
	var ids []int64
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if !slices.Equal(ids, []int64{1, 3}) || err == nil {
		t.Fatalf("sendable = %v, %v; want [1 3] and an error naming a/2", ids, err)
	}
	if got, err := sendable(rows[:1]); len(got) != 1 || err != nil {
		t.Fatalf("a small event: %v, %v", got, err)
	}
}
