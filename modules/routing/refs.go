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

// spanGap is the widest gap between two seqs of refs that RefsSpanCond
// still reads through as one range: a range scans at most spanGap entries
// per ref it matches.
const spanGap = 16

// spanMax bounds the seqs of one range of RefsSpanCond: its filter stays a
// short IN list, below the server's in_predicate_conversion_threshold.
const spanMax = 500

// RefsSpanCond matches the rows of refs (sorted, SortRefs) in a table whose
// rows are few beside the messages (mention entries, revisions) by its
// (topicCol, seqCol) key: each topic's seqs in runs whose neighbours lie at
// most spanGap apart (of at most spanMax seqs), each run one range of the key (seqCol BETWEEN its
// first and last) with the run's seqs as a filter the optimizer cannot turn
// back into ranges (seqCol + 0 IN (…)). A batch of a user's messages
// spread over a topic is then a few ranges instead of one dive into the
// key per seq, and each range reads only the entries there are; a lone
// seq is a range of one seq, as RefsCond's.
func RefsSpanCond(refs []MessageRef, topicCol, seqCol string) sq.Or {
	var or sq.Or
	for i := 0; i < len(refs); {
		j := i + 1
		for j < len(refs) && j-i < spanMax && refs[j].Topic == refs[i].Topic && refs[j].Seq-refs[j-1].Seq <= spanGap {
			j++
		}
		if j == i+1 {
			or = append(or, sq.And{sq.Eq{topicCol: refs[i].Topic}, sq.Eq{seqCol: refs[i].Seq}})
			i = j
			continue
		}
		seqs := make([]int64, 0, j-i)
		for _, r := range refs[i:j] {
			seqs = append(seqs, r.Seq)
		}
		or = append(or, sq.And{sq.Eq{topicCol: refs[i].Topic}, sq.Expr(seqCol+" BETWEEN ? AND ?", seqs[0], seqs[len(seqs)-1]),
			sq.Eq{seqCol + " + 0": seqs}})
		i = j
	}
	return or
}
