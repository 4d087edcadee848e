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
// into (held), up to a byte budget; each full buffer is sorted and written
// to a run file in dir, and Each merges the runs with what is left in
// memory. Run files are unlinked as soon as they are created, so a killed
// export leaves none; Close releases them.
type sorter struct {
	dir    string
	budget int64
	held   []heldPage // the pages added, in the order they came
	size   int64
	runs   []*os.File
	// the topics seen, numbered in the order they came
	ids    map[string]int32
	topics [][]byte
}

// heldPage is a page of records the sorter keeps: their buffer, an entry
// for each record, in the page's order, and the range of message ids it
// was read from (page.rng).
type heldPage struct {
	buf     []byte
	entries []entry
	rng     int
}

// entry finds a record in the sorter's memory and holds its sort key.
type entry struct {
	chunk, off, n int32 // chunk: its page in sorter.held
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

// Add takes a page of records (appendRecord), each at pg.buf[r.off:r.end]
// with its key: the sorter keeps pg.buf, which the caller must not write
// again, and spills what it holds when it reaches the budget.
func (s *sorter) Add(pg *page) error {
	k := int32(len(s.held))
	h := heldPage{buf: pg.buf, entries: make([]entry, len(pg.recs)), rng: pg.rng}
	for i, r := range pg.recs {
		topic := r.key.topic(pg.buf[r.off:r.end])
		id, ok := s.ids[string(topic)]
		if !ok {
			id = int32(len(s.topics))
			s.ids[string(topic)] = id
			s.topics = append(s.topics, slices.Clone(topic))
		}
		h.entries[i] = entry{chunk: k, off: int32(r.off), n: int32(r.end - r.off), topic: id, seq: r.key.seq}
	}
	s.held = append(s.held, h)
	s.size += int64(cap(pg.buf)) + 48*int64(len(pg.recs)) // an entry each, and its copy in sort's order
	if s.size < s.budget {
		return nil
	}
	return s.spill()
}

func (s *sorter) record(e entry) []byte {
	return s.held[e.chunk].buf[e.off : e.off+e.n]
}

// sorted is the records in memory in (topic, seqid) order: the topics by
// name, the records into one bucket per topic (a counting sort), then each
// bucket by seq. The records go into their buckets range by range (page.rng),
// each range's pages in the order they came: pages of one range of message
// ids come in id order, and ids and seqs both follow time, so a topic's
// bucket is found sorted — its records of each range in seq order, the
// ranges one after the other — and sorted again only when it is not.
func (s *sorter) sorted() []entry {
	order := make([]int32, len(s.topics))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return bytes.Compare(s.topics[a], s.topics[b]) })
	count := make([]int, len(s.topics))
	ranges := 0
	for _, h := range s.held {
		for _, e := range h.entries {
			count[e.topic]++
		}
		ranges = max(ranges, h.rng+1)
	}
	rank := make([]int, len(s.topics)) // where a topic's bucket begins
	at := 0
	for _, id := range order {
		rank[id] = at
		at += count[id]
	}
	out := make([]entry, at)
	next := slices.Clone(rank)
	for rng := range ranges {
		for _, h := range s.held {
			if h.rng != rng {
				continue
			}
			for _, e := range h.entries {
				out[next[e.topic]] = e
				next[e.topic]++
			}
		}
	}
	for id := range rank {
		bucket := out[rank[id]:next[id]]
		if !slices.IsSortedFunc(bucket, bySeq) {
			slices.SortFunc(bucket, bySeq)
		}
	}
	return out
}

func bySeq(a, b entry) int { return cmp.Compare(a.seq, b.seq) }

func (s *sorter) spill() error {
	entries := s.sorted()
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
	for _, e := range entries {
		w.Write(n[:binary.PutUvarint(n[:], uint64(e.n))])
		w.Write(s.record(e))
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("archive: sort run: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	clear(s.held) // the pages written out are the collector's
	s.held, s.size = s.held[:0], 0
	return nil
}

// Each hands every record added to fn (valid only during the call), in
// (topic, seqid) order; two records of the same topic and seq (the
// table's unique key forbids them) fail.
func (s *sorter) Each(fn func(rec []byte) error) error {
	h := &mergeHeap{}
	if mem := s.sorted(); len(mem) > 0 {
		h.cursors = append(h.cursors, &cursor{s: s, mem: mem})
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
	s.runs, s.held = nil, nil
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
