package archive

import (
	"bufio"
	"bytes"
	"cmp"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// sorter puts a month's rows, read in the table's clustered order
// (message_id: sequential pages, where (topic, seqid) order would look up
// every row through the secondary index), into the archive's (topic,
// seqid) order. Rows are kept encoded (record) in the pages they were read
// into (chunks), up to a byte budget; each full buffer is sorted and written to a run file in
// dir, and Each merges the runs with what is left in memory. Run files
// are unlinked as soon as they are created, so a killed export leaves
// none; Close releases them.
type sorter struct {
	dir     string
	budget  int64
	chunks  [][]byte // the records in memory: the pages added
	entries []entry  // one per record in memory
	size    int64
	runs    []*os.File
	// the topics seen, numbered in the order they came
	ids    map[string]int32
	topics [][]byte
}

// entry finds a record in the sorter's memory and holds its sort key.
type entry struct {
	chunk, off, n int32
	topic         int32 // sorter.topics
	seq           int64
}

// defaultSortBytes is an export's sort buffer when none is configured.
const defaultSortBytes = 256 << 20

// newSorter sorts in budget bytes of memory (defaultSortBytes when not
// positive), writing runs to dir (the system's temporary directory when
// empty).
func newSorter(dir string, budget int64) *sorter {
	if budget <= 0 {
		budget = defaultSortBytes
	}
	if dir == "" {
		dir = os.TempDir()
	}
	return &sorter{dir: dir, budget: budget, ids: map[string]int32{}}
}

// Add takes a page of records (appendRecord), each at buf[r.off:r.end]
// with its key: the sorter keeps buf, which the caller must not write
// again, and spills what it holds when it reaches the budget.
func (s *sorter) Add(buf []byte, recs []pageRec) error {
	k := int32(len(s.chunks))
	s.chunks = append(s.chunks, buf)
	for _, r := range recs {
		topic := r.key.topic(buf[r.off:r.end])
		id, ok := s.ids[string(topic)]
		if !ok {
			id = int32(len(s.topics))
			s.ids[string(topic)] = id
			s.topics = append(s.topics, slices.Clone(topic))
		}
		s.entries = append(s.entries, entry{chunk: k, off: int32(r.off), n: int32(r.end - r.off), topic: id, seq: r.key.seq})
	}
	s.size += int64(cap(buf)) + 32*int64(len(recs)) // an entry each, and its slice's room to grow
	if s.size < s.budget {
		return nil
	}
	return s.spill()
}

func (s *sorter) record(e entry) []byte {
	return s.chunks[e.chunk][e.off : e.off+e.n]
}

// sort orders the records in memory by (topic, seqid): the topics by
// name, the records into one bucket per topic (a counting sort), then
// each bucket by seq — which pages of one range of message ids give
// already (ids and seqs both follow time), so a bucket of one range is
// found sorted; scanTable's ranges come interleaved, and a bucket with
// records of both is sorted again.
func (s *sorter) sort() {
	order := make([]int32, len(s.topics))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return bytes.Compare(s.topics[a], s.topics[b]) })
	count := make([]int, len(s.topics))
	for _, e := range s.entries {
		count[e.topic]++
	}
	rank := make([]int, len(s.topics)) // where a topic's bucket begins
	at := 0
	for _, id := range order {
		rank[id] = at
		at += count[id]
	}
	out := make([]entry, len(s.entries))
	next := slices.Clone(rank)
	for _, e := range s.entries {
		out[next[e.topic]] = e
		next[e.topic]++
	}
	for id := range rank {
		bucket := out[rank[id]:next[id]]
		if !slices.IsSortedFunc(bucket, bySeq) {
			slices.SortFunc(bucket, bySeq)
		}
	}
	s.entries = out
}

func bySeq(a, b entry) int { return cmp.Compare(a.seq, b.seq) }

func (s *sorter) spill() error {
	s.sort()
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return fmt.Errorf("archive: sort directory: %w", err)
	}
	f, err := os.CreateTemp(s.dir, "imshard-archive-sort-*")
	if err != nil {
		return fmt.Errorf("archive: sort run: %w", err)
	}
	// unlinked at once: a killed run leaves no file behind
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return err
	}
	s.runs = append(s.runs, f)
	w := bufio.NewWriterSize(f, 1<<20)
	var n [binary.MaxVarintLen64]byte
	for _, e := range s.entries {
		w.Write(n[:binary.PutUvarint(n[:], uint64(e.n))])
		w.Write(s.record(e))
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("archive: sort run: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	clear(s.chunks) // the pages written out are the collector's
	s.chunks, s.entries, s.size = s.chunks[:0], s.entries[:0], 0
	return nil
}

// Each hands every record added to fn (valid only during the call), in
// (topic, seqid) order; two records of the same topic and seq (the
// table's unique key forbids them) fail.
func (s *sorter) Each(fn func(rec []byte) error) error {
	s.sort()
	h := &mergeHeap{}
	if len(s.entries) > 0 {
		h.cursors = append(h.cursors, &cursor{s: s, mem: s.entries})
	}
	for _, f := range s.runs {
		h.cursors = append(h.cursors, &cursor{run: bufio.NewReaderSize(f, 1<<20)})
	}
	for i := 0; i < len(h.cursors); {
		ok, err := h.cursors[i].next()
		if err != nil {
			return err
		}
		if !ok {
			h.cursors = slices.Delete(h.cursors, i, i+1)
			continue
		}
		i++
	}
	heap.Init(h)
	var lastTopic []byte
	lastSeq, first := int64(0), true
	for h.Len() > 0 {
		c := h.cursors[0]
		if !first && keyCompare(lastTopic, lastSeq, c.topic, c.seq) >= 0 {
			return fmt.Errorf("archive: rows out of order or repeated at topic %q seq %d", c.topic, c.seq)
		}
		if err := fn(c.rec); err != nil {
			return err
		}
		// the topic outlives the record's buffer, which next reuses
		lastTopic, lastSeq, first = append(lastTopic[:0], c.topic...), c.seq, false
		ok, err := c.next()
		if err != nil {
			return err
		}
		if ok {
			heap.Fix(h, 0)
		} else {
			heap.Pop(h)
		}
	}
	return nil
}

// Close releases the run files and the memory.
func (s *sorter) Close() {
	for _, f := range s.runs {
		f.Close()
	}
	s.runs, s.chunks, s.entries = nil, nil, nil
}

func keyCompare(at []byte, as int64, bt []byte, bs int64) int {
	if c := bytes.Compare(at, bt); c != 0 {
		return c
	}
	return cmp.Compare(as, bs)
}

// cursor is one sorted source of the merge: the memory or a run; rec is
// its current record, topic and seq its key.
type cursor struct {
	s     *sorter
	mem   []entry
	run   *bufio.Reader
	buf   []byte
	rec   []byte
	topic []byte
	seq   int64
}

func (c *cursor) next() (bool, error) {
	if c.run == nil {
		if len(c.mem) == 0 {
			return false, nil
		}
		e := c.mem[0]
		c.rec, c.topic, c.seq, c.mem = c.s.record(e), c.s.topics[e.topic], e.seq, c.mem[1:]
		return true, nil
	}
	n, err := binary.ReadUvarint(c.run)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	if err == nil {
		c.buf = slices.Grow(c.buf[:0], int(n))[:n]
		_, err = io.ReadFull(c.run, c.buf)
	}
	if err != nil {
		return false, fmt.Errorf("archive: sort run: %w", err)
	}
	c.rec = c.buf
	c.topic, c.seq, err = recordKey(c.rec)
	return err == nil, err
}

type mergeHeap struct{ cursors []*cursor }

func (h *mergeHeap) Len() int { return len(h.cursors) }
func (h *mergeHeap) Less(i, j int) bool {
	a, b := h.cursors[i], h.cursors[j]
	return keyCompare(a.topic, a.seq, b.topic, b.seq) < 0
}
func (h *mergeHeap) Swap(i, j int) { h.cursors[i], h.cursors[j] = h.cursors[j], h.cursors[i] }
func (h *mergeHeap) Push(x any)    { h.cursors = append(h.cursors, x.(*cursor)) }
func (h *mergeHeap) Pop() any {
	c := h.cursors[len(h.cursors)-1]
	h.cursors = h.cursors[:len(h.cursors)-1]
	return c
}
