package archive

import (
	"crypto/sha256"
	"encoding/json"
	"testing"

	"github.com/imshard/imshard/modules/routing"
)

// TestTopicRangesFromDigests: a topic's seq range and row count in the
// manifest are its digest's (the export writes exactly the rows it
// hashed), the topics come in topic order, and a topic range reads and
// writes the manifest's JSON as archives already stored hold it.
func TestTopicRangesFromDigests(t *testing.T) {
	digest := func(seqs ...int64) *routing.Digest {
		d := &routing.Digest{}
		for _, s := range seqs {
			sum := sha256.Sum256([]byte{byte(s)})
			d.Add(s, sum[:])
		}
		return d
	}
	cases := []struct {
		name    string
		digests map[string]*routing.Digest
		want    []TopicRange // Hash left out: the digest's
	}{
		{name: "none", digests: map[string]*routing.Digest{}},
		{name: "one row", digests: map[string]*routing.Digest{"a": digest(7)},
			want: []TopicRange{{Topic: "a", MinSeq: 7, MaxSeq: 7, Count: 1}}},
		{name: "gaps and topic order", digests: map[string]*routing.Digest{"b": digest(3, 9, 4), "a": digest(1, 2, 5, 40)},
			want: []TopicRange{{Topic: "a", MinSeq: 1, MaxSeq: 40, Count: 4}, {Topic: "b", MinSeq: 3, MaxSeq: 9, Count: 3}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ranges := map[string]*TopicRange{}
			for topic := range c.digests {
				ranges[topic] = &TopicRange{Topic: topic, MinAt: 10, MaxAt: 20}
			}
			got, hash := topicRanges(ranges, c.digests)
			if len(got) != len(c.want) || hash == "" {
				t.Fatalf("got %+v (hash %q), want %+v", got, hash, c.want)
			}
			for i, w := range c.want {
				w.MinAt, w.MaxAt, w.Hash = 10, 20, c.digests[w.Topic].Hex()
				if got[i] != w {
					t.Fatalf("topic %d: got %+v, want %+v", i, got[i], w)
				}
			}
		})
	}
	// the manifest's form of a topic range, as stored archives hold it
	stored := `{"topic":"a","min_seq":1,"max_seq":40,"count":4,"min_created_at_us":10,"max_created_at_us":20,"hash":"ab"}`
	var tr TopicRange
	if err := json.Unmarshal([]byte(stored), &tr); err != nil {
		t.Fatal(err)
	}
	if want := (TopicRange{Topic: "a", MinSeq: 1, MaxSeq: 40, Count: 4, MinAt: 10, MaxAt: 20, Hash: "ab"}); tr != want {
		t.Fatalf("read %+v, want %+v", tr, want)
	}
	if raw, err := json.Marshal(tr); err != nil || string(raw) != stored {
		t.Fatalf("wrote %s (%v), want %s", raw, err, stored)
	}
}
