package routing

import (
	"slices"

	sq "github.com/Masterminds/squirrel"
)

// MessageRef names one stored message: its topic and seq.
type MessageRef struct {
	Topic string
	Seq   int64
}

// SortRefs orders refs by (topic, seq), the order of the month tables'
// (topic, seqid) index: a batch locks its rows, and its topics' change_seq
// rows, in one order, so two batches never wait on each other in a cycle.
func SortRefs(refs []MessageRef) {
	slices.SortFunc(refs, func(a, b MessageRef) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(min(max(a.Seq-b.Seq, -1), 1))
	})
}

// RefsCond matches the rows of refs (sorted, SortRefs) in a table keyed by
// (topicCol, seqCol): one seq list per topic, so each is a range of the
// table's (topic, seq) index rather than a scan.
func RefsCond(refs []MessageRef, topicCol, seqCol string) sq.Or {
	var or sq.Or
	for i := 0; i < len(refs); {
		j := i
		seqs := []int64{}
		for ; j < len(refs) && refs[j].Topic == refs[i].Topic; j++ {
			seqs = append(seqs, refs[j].Seq)
		}
		or = append(or, sq.Eq{topicCol: refs[i].Topic, seqCol: seqs})
		i = j
	}
	return or
}
