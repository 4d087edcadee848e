package robustness

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// settledRun is a long history every checker must pass: users 1..8 in
// topics g0..g3, sends in turn, a since walk and a stream per topic, cursor
// PUTs and edit chains, then the quiesce mark and each user's final list.
func settledRun(sends int) *hist {
	const users, topics = 8, 4
	b := h()
	for tp := range topics {
		for u := int64(1); u <= users; u++ {
			b.at(0, 1, join(u, fmt.Sprintf("g%d", tp)))
		}
	}
	type topicRun struct {
		last, walked int64
		sender       map[int64]int64
	}
	runs := make([]topicRun, topics)
	cursors := map[[2]int64]int64{}
	for tp := range topics {
		runs[tp].sender = map[int64]int64{}
		b.at(2, 3, stream(int64(tp+1), 8, fmt.Sprintf("g%d", tp), 0))
	}
	at := 10
	for i := range sends {
		tp := i % topics
		topic, r := fmt.Sprintf("g%d", tp), &runs[tp]
		user := int64(i%users + 1)
		r.last++
		r.sender[r.last] = user
		b.at(at, at+2, send(user, topic, r.last))
		b.at(at+3, at+3, frameMsg(int64(tp+1), topic, r.last))
		switch {
		case i%7 == 0:
			seqs := []int64{}
			for s := r.walked + 1; s <= r.last; s++ {
				seqs = append(seqs, s)
			}
			b.at(at+3, at+4, since(7, topic, r.walked, r.last, seqs...))
			r.walked = r.last
		case i%11 == 0:
			reader := int64(i%users + 1)
			cursors[[2]int64{int64(tp), reader}] = r.last
			b.at(at+3, at+4, cursor(reader, topic, r.last, r.last))
		case i%13 == 0:
			b.at(at+3, at+4, edit(user, topic, r.last, 1, 2, 0))
		}
		at += 5
	}
	b.at(at, at, Op{Kind: Quiesce})
	// each topic's final walk as its last sender reads it
	for tp := range topics {
		r := runs[tp]
		seqs := make([]int64, 0, r.last)
		for s := int64(1); s <= r.last; s++ {
			seqs = append(seqs, s)
		}
		b.at(at+1, at+2, since(r.sender[r.last], fmt.Sprintf("g%d", tp), 0, r.last, seqs...))
	}
	for u := int64(1); u <= users; u++ {
		list := Op{Kind: List, User: u, Status: 200}
		for tp := range topics {
			r := runs[tp]
			read := cursors[[2]int64{int64(tp), u}]
			for s := r.last; s > read; s-- {
				if r.sender[s] == u {
					read = s
					break
				}
			}
			var unread int64
			for s := read + 1; s <= r.last; s++ {
				if r.sender[s] != u {
					unread++
				}
			}
			m := msg(fmt.Sprintf("g%d", tp), r.last)
			list.Topics = append(list.Topics, TopicEntry{Topic: m.Topic, LastSeq: r.last, ReadSeq: read,
				Unread: min(unread, unreadCap), UnreadCapped: unread > unreadCap, LastMessage: &m})
		}
		b.at(at+1, at+2, list)
	}
	// reads after an edit show its version
	edited := map[string]time.Time{}
	for i := range b.ops {
		o := &b.ops[i]
		if o.Kind == Edit {
			edited[mid(o.Topic, o.Seq)] = o.End
			continue
		}
		for j := range o.Messages {
			if e, ok := edited[o.Messages[j].MessageID]; ok && e.Before(o.Start) {
				o.Messages[j].Version = 2
			}
		}
		for j := range o.Topics {
			if m := o.Topics[j].LastMessage; m != nil {
				if e, ok := edited[m.MessageID]; ok && e.Before(o.Start) {
					m.Version = 2
				}
			}
		}
	}
	return b
}

func TestCheckPassesASettledRun(t *testing.T) {
	ops := settledRun(2000).ops
	if vs := Check(ops); len(vs) > 0 {
		t.Fatalf("a settled run broke %d invariants, the first: %+v", len(vs), vs[0])
	}
	if len(Checkers) != 9 {
		t.Fatalf("Check runs %d checkers, want the 9 of the suite", len(Checkers))
	}
}

// A long run's history (about 100k ops) checks clean. How long it takes is
// BenchmarkCheckLongRun's to say (every checker indexes by topic and user
// instead of scanning the history per op), not a timed assertion's: a test
// must not fail because the machine is busy.
func TestCheckPassesALongRun(t *testing.T) {
	ops := settledRun(44000).ops
	if vs := Check(ops); len(vs) > 0 {
		t.Fatalf("a settled run of %d ops broke %d invariants, the first: %+v", len(ops), len(vs), vs[0])
	}
}

func BenchmarkCheckLongRun(b *testing.B) {
	ops := settledRun(44000).ops
	for b.Loop() {
		if vs := Check(ops); len(vs) > 0 {
			b.Fatalf("a settled run broke %d invariants", len(vs))
		}
	}
	b.ReportMetric(float64(len(ops)), "ops/history")
}

func TestShrink(t *testing.T) {
	t.Run("finds the acknowledged send a long walk lost", func(t *testing.T) {
		ops := settledRun(3000).ops
		var page *Op
		for i := range ops {
			if ops[i].Kind == PageSince && len(ops[i].Messages) > 3 && ops[i].Topic == "g2" {
				page = &ops[i]
			}
		}
		page.Messages = append(page.Messages[:1], page.Messages[2:]...)
		small := Shrink(ops, Delivery)
		if len(Delivery.Check(small)) == 0 || len(small) > 3 {
			t.Fatalf("shrunk to %d ops:\n%s", len(small), Format(small))
		}
		if !strings.Contains(Format(small), "since") {
			t.Fatalf("the shrunk history lost the page:\n%s", Format(small))
		}
	})
	t.Run("keeps the ops a violation needs beyond those it names", func(t *testing.T) {
		ops := settledRun(3000).ops
		// breaks when three scattered ops are all there, naming one of them
		needs := []int64{ops[100].ID, ops[2000].ID, ops[len(ops)/2].ID}
		c := Checker{Name: "three", Check: func(ops []Op) []Violation {
			found := 0
			for _, o := range ops {
				for _, id := range needs {
					if o.ID == id {
						found++
					}
				}
			}
			if found < len(needs) {
				return nil
			}
			return []Violation{{Checker: "three", Ops: needs[:1]}}
		}}
		small := Shrink(ops, c)
		kinds := map[Kind]int{}
		for _, o := range small {
			kinds[o.Kind]++
		}
		if len(small) != 4 || kinds[Quiesce] != 1 {
			t.Fatalf("shrunk to %d ops, want the 3 it needs and the quiesce mark:\n%s", len(small), Format(small))
		}
		if again := Shrink(ops, c); Format(again) != Format(small) {
			t.Fatal("Shrink is not deterministic")
		}
	})
	t.Run("keeps the writes a count was judged against", func(t *testing.T) {
		// one message mentioning user 2 and everyone, counted twice
		both := send(1, "g", 2)
		both.Mentions, both.MentionAll = []int64{2}, true
		b := h().at(0, 1, join(1, "g")).at(0, 1, join(2, "g")).at(2, 3, send(1, "g", 1)).at(4, 5, both).
			at(6, 7, send(1, "g", 3)).at(8, 9, bySeq(3, "g", 1)).at(10, 10, Op{Kind: Quiesce})
		last := msg("g", 3)
		b.at(11, 12, Op{Kind: List, User: 2, Status: 200, Topics: []TopicEntry{{Topic: "g", LastSeq: 3,
			Unread: 3, MentionUnread: 2, LastMessage: &last}}})
		small := Shrink(b.ops, Model)
		kinds := map[Kind]int{}
		for _, o := range small {
			kinds[o.Kind]++
		}
		// the last send shows seq 3 mentions nobody: without it the list's
		// last message could mention user 2 and the count would fit
		if kinds[Join] != 1 || kinds[Send] != 2 || len(small) != 5 {
			t.Fatalf("shrunk to %d ops, want the join, the sends of seqs 2 and 3, the mark and the list:\n%s", len(small), Format(small))
		}
	})
	t.Run("leaves a passing history alone", func(t *testing.T) {
		ops := settledRun(50).ops
		if got := Shrink(ops, Delivery); len(got) != len(ops) {
			t.Fatalf("shrunk a passing history to %d of %d ops", len(got), len(ops))
		}
	})
}

func TestFormat(t *testing.T) {
	out := Format(h().at(0, 10, send(1, "g", 1)).at(12, 13, withGaps(since(2, "g", 0, 3, 1, 3), 2)).ops)
	want := []string{
		"0.000s c1   #1      send               acme/g user=1 client_msg_id=g-1 → 201 messages=[1:g-1] (0.010s)",
		"0.012s c2   #2      since              acme/g user=2 since=0 limit=0 → 200 messages=[1:g-1 3:g-3] gaps=[2] next_since=3 has_more=false (0.001s)",
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Fatalf("Format printed\n%s\nwant a line\n%s", out, w)
		}
	}
}
