package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"runtime"

	"github.com/parquet-go/parquet-go"
	"golang.org/x/sync/errgroup"

	"github.com/imshard/imshard/modules/routing"
)

// An export's records, once sorted, become row groups on every core: the
// merge cuts them into groups of rowGroupRows records, each group is
// hashed, decoded and encoded on its own by one of the encoders (a Parquet
// file of that one row group, in memory), and the groups are spliced into
// the archive in order — parquet-go copies a row group written with the
// archive's own options byte for byte (its column chunks, page index and
// bloom filter), so the archive is the file one writer given every row
// would have written (TestEncodedGroupsAsOneWriter).

// recGroup is one row group's records, in order, copied out of the sorter
// (whose buffers the merge reuses).
type recGroup struct {
	n    int // its place in the archive
	buf  []byte
	ends []int // where each record ends in buf
}

func (g *recGroup) add(rec []byte) {
	g.buf = append(g.buf, rec...)
	g.ends = append(g.ends, len(g.buf))
}

// topicPart is one topic's share of a row group: its rows' digest and
// creation times.
type topicPart struct {
	topic        string
	digest       routing.Digest
	minAt, maxAt int64
}

// encodedGroup is a row group ready for the archive: a Parquet file of
// that group alone, and what the manifest takes from its rows.
type encodedGroup struct {
	n            int
	file         []byte
	rows         int64
	minID, maxID int64
	topics       []topicPart // in the group's (topic) order
}

// encoder turns record groups into encoded groups; one per goroutine.
type encoder struct {
	dec   *rowDecoder
	rows  []Row
	canon bytes.Buffer
	pw    *parquet.GenericWriter[Row]
}

func (e *encoder) encode(g *recGroup) (*encodedGroup, error) {
	out := &encodedGroup{n: g.n}
	e.rows = e.rows[:0]
	e.dec.records(g.buf)
	start := 0
	for _, end := range g.ends {
		e.canon.Reset()
		if err := canonicalRecord(&e.canon, g.buf[start:end]); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(e.canon.Bytes())
		r, err := e.dec.row(start, end)
		start = end
		if err != nil {
			return nil, err
		}
		k := len(out.topics) - 1
		if k < 0 || out.topics[k].topic != r.Topic {
			out.topics = append(out.topics, topicPart{topic: r.Topic, minAt: r.CreatedAt, maxAt: r.CreatedAt})
			k++
		}
		p := &out.topics[k]
		p.digest.Add(r.SeqID, sum[:])
		p.minAt, p.maxAt = min(p.minAt, r.CreatedAt), max(p.maxAt, r.CreatedAt)
		if out.rows == 0 || r.MessageID < out.minID {
			out.minID = r.MessageID
		}
		out.maxID = max(out.maxID, r.MessageID)
		out.rows++
		e.rows = append(e.rows, r)
	}
	var file bytes.Buffer
	if e.pw == nil {
		e.pw = newWriter(&file)
	} else {
		e.pw.Reset(&file)
	}
	_, err := e.pw.Write(e.rows)
	if err == nil {
		err = e.pw.Close()
	}
	clear(e.rows) // the texts are not kept past the group
	e.dec.reset()
	out.file = file.Bytes()
	return out, err
}

// groupsInFlight bounds the record groups an export holds at once, read
// from the sorter but not yet in the archive.
func groupsInFlight(encoders int) int { return 2 * encoders }

// writeSorted writes the sorter's records to pw in row groups of
// rowGroupRows, encoded by one goroutine per core beside the merge, and
// folds each group's rows into the manifest (man's rows and message-id
// range, ranges) and the topics' digests; committed counts each group's
// rows as it is written.
func writeSorted(ctx context.Context, s *sorter, pw *parquet.GenericWriter[Row], man *Manifest,
	ranges map[string]*TopicRange, digests map[string]*routing.Digest, committed func(rows int64)) error {
	workers := max(1, runtime.GOMAXPROCS(0))
	g, ctx := errgroup.WithContext(ctx)
	tokens := make(chan struct{}, groupsInFlight(workers))
	todo, done := make(chan *recGroup, workers), make(chan *encodedGroup, groupsInFlight(workers))
	free := make(chan *recGroup, groupsInFlight(workers))
	g.Go(func() error { // the merge
		defer close(todo)
		var cur *recGroup
		send := func() error {
			select {
			case todo <- cur:
				cur = nil
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		n := 0
		err := s.Each(func(rec []byte) error {
			if cur == nil {
				select {
				case tokens <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
				select {
				case cur = <-free:
					cur.buf, cur.ends = cur.buf[:0], cur.ends[:0]
				default:
					cur = &recGroup{ends: make([]int, 0, rowGroupRows)}
				}
				cur.n = n
				n++
			}
			cur.add(rec)
			if len(cur.ends) < rowGroupRows {
				return nil
			}
			return send()
		})
		if err == nil && cur != nil {
			err = send()
		}
		return err
	})
	var encoders errgroup.Group
	for range workers {
		encoders.Go(func() error {
			e := &encoder{dec: newRowDecoder()}
			for rg := range todo {
				enc, err := e.encode(rg)
				if err != nil {
					return err
				}
				select { // its buffers for a later group
				case free <- rg:
				default:
				}
				select {
				case done <- enc:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(done)
		return encoders.Wait()
	})
	g.Go(func() error { // the groups into the archive, in order
		pending := map[int]*encodedGroup{}
		next := 0
		for enc := range done {
			pending[enc.n] = enc
			for pending[next] != nil {
				if err := commitGroup(pw, pending[next], man, ranges, digests); err != nil {
					return err
				}
				committed(pending[next].rows)
				delete(pending, next)
				next++
				<-tokens
			}
		}
		return nil
	})
	return g.Wait()
}

// commitGroup splices one encoded group into the archive and folds it
// into the manifest.
func commitGroup(pw *parquet.GenericWriter[Row], enc *encodedGroup, man *Manifest,
	ranges map[string]*TopicRange, digests map[string]*routing.Digest) error {
	f, err := parquet.OpenFile(bytes.NewReader(enc.file), int64(len(enc.file)))
	if err != nil {
		return fmt.Errorf("archive: row group %d: %w", enc.n, err)
	}
	for _, rg := range f.RowGroups() {
		if _, err := pw.WriteRowGroup(rg); err != nil {
			return fmt.Errorf("archive: row group %d: %w", enc.n, err)
		}
	}
	if man.Rows == 0 || enc.minID < man.MinMessageID {
		man.MinMessageID = enc.minID
	}
	man.MaxMessageID = max(man.MaxMessageID, enc.maxID)
	man.Rows += enc.rows
	for _, p := range enc.topics {
		tr := ranges[p.topic]
		if tr == nil {
			tr = &TopicRange{Topic: p.topic, MinAt: p.minAt, MaxAt: p.maxAt}
			ranges[p.topic] = tr
		}
		tr.MinAt, tr.MaxAt = min(tr.MinAt, p.minAt), max(tr.MaxAt, p.maxAt)
		d := digests[p.topic]
		if d == nil {
			d = &routing.Digest{}
			digests[p.topic] = d
		}
		d.Merge(p.digest)
	}
	return nil
}
