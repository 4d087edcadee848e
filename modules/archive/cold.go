package archive

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"gocloud.dev/blob"
	"golang.org/x/sync/singleflight"

	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Cold reads archived months for the read path (readpath.ColdMonths) by
// byte ranges: a month's manifest and its Parquet footer are read once and
// kept in a bounded LRU (archive.cache_bytes), so a warm read fetches only
// the row groups that can hold its rows — those the manifest's topic range
// and the footer's column statistics (topic, seqid, message_id) leave.
// Every range read also returns the object's size and time: an object
// that is no longer the one cached (a month restored and archived again)
// drops the entry and the read starts over.
type Cold struct {
	url   string
	limit int64
	m     coldMetrics

	mu     sync.Mutex
	bucket *blob.Bucket
	cache  *lru.Cache[string, *coldEntry]
	size   int64 // bytes of the cached manifests and footers
	loads  singleflight.Group
}

// DefaultCacheBytes is archive.cache_bytes' default.
const DefaultCacheBytes = 64 << 20

// NewCold builds the reader of the archives under url, caching up to
// cacheBytes of manifests and footers.
func NewCold(url string, cacheBytes int64, reg prometheus.Registerer) *Cold {
	c := &Cold{url: url, limit: max(cacheBytes, 1), m: newColdMetrics(reg)}
	// bounded by bytes (evictOver), not by count
	c.cache, _ = lru.NewWithEvict(1<<30, func(_ string, e *coldEntry) { c.size -= e.bytes })
	return c
}

// Close closes the bucket.
func (c *Cold) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bucket == nil {
		return nil
	}
	b := c.bucket
	c.bucket = nil
	return b.Close()
}

// Purge empties the cache, as a process just started has it: the next
// read of each month reads its manifest and footer again (`imshard bench
// archive` times such cold reads).
func (c *Cold) Purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cache.Purge()
	c.m.cached.Set(float64(c.size))
}

type coldMetrics struct {
	cache      *prometheus.CounterVec
	rangeBytes prometheus.Counter
	ranges     prometheus.Counter
	cached     prometheus.Gauge
}

func newColdMetrics(reg prometheus.Registerer) coldMetrics {
	f := promauto.With(reg)
	m := coldMetrics{
		cache:      f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_archive_cold_cache_total", Help: "Lookups of an archived month's manifest and Parquet footer in the process's cache: hit, or miss (read from the bucket)."}, []string{"result"}),
		rangeBytes: f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_cold_range_bytes_total", Help: "Bytes of archive objects fetched by cold reads (footers on a cache miss, row groups)."}),
		ranges:     f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_cold_range_requests_total", Help: "Range requests cold reads made to the archive bucket."}),
		cached:     f.NewGauge(prometheus.GaugeOpts{Name: "imshard_archive_cold_cache_bytes", Help: "Bytes of manifests and Parquet footers the process's archive cache holds (at most archive.cache_bytes)."}),
	}
	for _, r := range []string{"hit", "miss"} {
		m.cache.WithLabelValues(r)
	}
	return m
}

// coldEntry is one archived month's cached metadata.
type coldEntry struct {
	key    string // the Parquet object
	man    Manifest
	file   *parquet.File // opened over its footer alone
	size   int64
	mod    time.Time
	groups []groupSpan
	cols   keyColumns
	bytes  int64
}

// keyColumns are the indexes of the columns reads find rows by, and of
// those a user erase's scan reads (SentBy).
type keyColumns struct{ topic, seq, id, from, status, version int }

// groupSpan is a row group's byte range and the column statistics a read
// selects it by.
type groupSpan struct {
	off, end         int64
	topicLo, topicHi string
	seqLo, seqHi     int64
	idLo, idHi       int64
}

// errStale: the object is no longer the one the entry describes.
var errStale = errors.New("archive: the archive object changed")

// Rows implements readpath.ColdMonths.
func (c *Cold) Rows(ctx context.Context, tenant string, m routing.Month, r readpath.ColdRange) ([]readpath.Row, error) {
	return retryStale(ctx, c, tenant, m, func(e *coldEntry, bucket *blob.Bucket) ([]readpath.Row, error) {
		return c.rows(ctx, bucket, e, r)
	})
}

// RowsAt implements readpath.ColdMonths for a change of many topics'
// messages at once (a user erase's batch): each row group that can hold
// one of refs is fetched once and read once, forward, from the first row
// of its first topic of refs to the last of its last (the topic column
// decoded to find them), keeping the rows refs name. Reading a
// group's window whole costs at most the group's rows; a read per topic
// would fetch the group again and seek into it for each topic.
func (c *Cold) RowsAt(ctx context.Context, tenant string, m routing.Month, refs []routing.MessageRef) ([]readpath.Row, error) {
	want := make(map[routing.MessageRef]bool, len(refs))
	for _, r := range refs {
		want[r] = true
	}
	return retryStale(ctx, c, tenant, m, func(e *coldEntry, bucket *blob.Bucket) ([]readpath.Row, error) {
		var out []readpath.Row
		for j, sp := range e.groups {
			// refs are in the file's (topic, seqid) order: the group's are
			// those whose topic lies within its topics
			lo := sort.Search(len(refs), func(i int) bool { return refs[i].Topic >= sp.topicLo })
			hi := sort.Search(len(refs), func(i int) bool { return refs[i].Topic > sp.topicHi })
			if lo >= hi {
				continue
			}
			g, err := c.fetchGroup(ctx, bucket, e, j)
			if err != nil {
				return nil, err
			}
			from, to, err := g.topicSpan(e.cols, refs[lo].Topic, refs[hi-1].Topic)
			if err != nil {
				return nil, err
			}
			err = g.read(from, to, false, func() int { return groupBatch }, func(row *Row) bool {
				if want[routing.MessageRef{Topic: row.Topic, Seq: row.SeqID}] {
					out = append(out, row.readRow())
				}
				return true
			})
			if err != nil {
				return nil, err
			}
		}
		return out, nil
	})
}

// ByID implements readpath.ColdMonths.
func (c *Cold) ByID(ctx context.Context, tenant string, m routing.Month, id int64) (readpath.Row, bool, error) {
	rows, err := retryStale(ctx, c, tenant, m, func(e *coldEntry, bucket *blob.Bucket) ([]readpath.Row, error) {
		if e.man.Rows == 0 || id < e.man.MinMessageID || id > e.man.MaxMessageID {
			return nil, nil
		}
		for i, g := range e.groups {
			if id < g.idLo || id > g.idHi {
				continue
			}
			g, err := c.fetchGroup(ctx, bucket, e, i)
			if err != nil {
				return nil, err
			}
			at, err := g.find(e.cols.id, id)
			if err != nil || at < 0 {
				return nil, err
			}
			var found []readpath.Row
			err = g.read(at, at+1, false, func() int { return 1 }, func(r *Row) bool {
				found = append(found, r.readRow())
				return false
			})
			return found, err
		}
		return nil, nil
	})
	if err != nil || len(rows) == 0 {
		return readpath.Row{}, false, err
	}
	return rows[0], true, nil
}

// SentBy is every message user sent in tenant's archived month m, in
// (topic, seq) order, as the archive holds them (a user erase, which makes
// its tombstones from these rows; the archive has no sender index, so it
// reads each row group once, in one range request each, and decodes only
// the columns it needs: sentBy).
func (c *Cold) SentBy(ctx context.Context, tenant string, m routing.Month, user int64) ([]routing.ArchivedRow, error) {
	return retryStale(ctx, c, tenant, m, func(e *coldEntry, bucket *blob.Bucket) ([]routing.ArchivedRow, error) {
		var out []routing.ArchivedRow
		for i := range e.groups {
			g, err := c.fetchGroup(ctx, bucket, e, i)
			if err != nil {
				return nil, err
			}
			rows, err := g.sentBy(e.cols, user)
			if err != nil {
				return nil, err
			}
			out = append(out, rows...)
		}
		return out, nil
	})
}

// sentBy is the group's rows whose from_user is user, in file order: the
// from_user column decoded, then, when a row matches, the five columns a
// tombstone is made from (topic, seqid, message_id, status, version), the
// matching rows' values picked out of their pages — no row of the group
// assembled, none of its other twenty columns (the content among them)
// decompressed. Those columns are required and plain in SchemaVersion's
// layout, as the key columns are (pages).
func (g *group) sentBy(cols keyColumns, user int64) ([]routing.ArchivedRow, error) {
	var at []int64
	err := g.pages(cols.from, encoding.Int64, func(first int64, v encoding.Values) bool {
		for k, u := range v.Int64() {
			if u == user {
				at = append(at, first+int64(k))
			}
		}
		return true
	})
	if err != nil || len(at) == 0 {
		return nil, err
	}
	out := make([]routing.ArchivedRow, len(at))
	// each column's pages in order, the values of the rows at (ascending)
	ints := func(col int, set func(r *routing.ArchivedRow, x int64)) error {
		k := 0
		return g.pages(col, encoding.Int64, func(first int64, v encoding.Values) bool {
			xs := v.Int64()
			for ; k < len(at) && at[k] < first+int64(len(xs)); k++ {
				set(&out[k], xs[at[k]-first])
			}
			return k < len(at)
		})
	}
	strs := func(col int, set func(r *routing.ArchivedRow, s string)) error {
		k := 0
		return g.pages(col, encoding.ByteArray, func(first int64, v encoding.Values) bool {
			data, offs := v.ByteArray()
			for n := int64(len(offs) - 1); k < len(at) && at[k] < first+n; k++ {
				j := at[k] - first
				set(&out[k], string(data[offs[j]:offs[j+1]]))
			}
			return k < len(at)
		})
	}
	for _, err := range []error{
		strs(cols.topic, func(r *routing.ArchivedRow, s string) { r.Topic = s }),
		ints(cols.seq, func(r *routing.ArchivedRow, x int64) { r.Seq = x }),
		ints(cols.id, func(r *routing.ArchivedRow, x int64) { r.MessageID = x }),
		strs(cols.status, func(r *routing.ArchivedRow, s string) { r.Status = s }),
		ints(cols.version, func(r *routing.ArchivedRow, x int64) { r.Version = int(x) }),
	} {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// IDRange implements readpath.ColdMonths, from the manifest.
func (c *Cold) IDRange(ctx context.Context, tenant string, m routing.Month) (int64, int64, bool, error) {
	e, _, err := c.entry(ctx, tenant, m)
	if err != nil {
		return 0, 0, false, err
	}
	return e.man.MinMessageID, e.man.MaxMessageID, e.man.Rows > 0, nil
}

// TopicRanges is every topic's seq range, row count and created_at span in
// tenant's archived month m, from its manifest (the route check of a month
// whose table may be gone).
func (c *Cold) TopicRanges(ctx context.Context, tenant string, m routing.Month) ([]routing.MirrorRow, error) {
	e, _, err := c.entry(ctx, tenant, m)
	if err != nil {
		return nil, err
	}
	out := make([]routing.MirrorRow, len(e.man.Topics))
	for i, t := range e.man.Topics {
		out[i] = routing.MirrorRow{Topic: t.Topic, MonthRange: routing.MonthRange{Month: m, MinSeq: t.MinSeq, MaxSeq: t.MaxSeq, Count: t.Count},
			MinCreatedAt: time.UnixMicro(t.MinAt).UTC(), MaxCreatedAt: time.UnixMicro(t.MaxAt).UTC()}
	}
	return out, nil
}

// retryStale runs read over the month's cached entry; when that fails —
// the object changed under the entry (errStale), or a range the entry
// named is gone — it drops the entry and runs read once more, afresh.
func retryStale[T any](ctx context.Context, c *Cold, tenant string, m routing.Month, read func(*coldEntry, *blob.Bucket) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		e, bucket, err := c.entry(ctx, tenant, m)
		if err != nil {
			var zero T
			return zero, err
		}
		out, err := read(e, bucket)
		if err == nil || attempt > 0 || ctx.Err() != nil {
			return out, err
		}
		c.mu.Lock()
		c.cache.Remove(tenant + "/" + m.String())
		c.m.cached.Set(float64(c.size))
		c.mu.Unlock()
	}
}

// rows reads r from the row groups that can hold its rows, in r's order,
// stopping once r.Limit rows are kept.
func (c *Cold) rows(ctx context.Context, bucket *blob.Bucket, e *coldEntry, r readpath.ColdRange) ([]readpath.Row, error) {
	i, ok := slices.BinarySearchFunc(e.man.Topics, r.Topic, func(t TopicRange, topic string) int { return cmp.Compare(t.Topic, topic) })
	if !ok || r.Limit <= 0 {
		return nil, nil
	}
	tr := e.man.Topics[i]
	lo, hi := max(r.Lo, tr.MinSeq), min(r.Hi, tr.MaxSeq)
	if lo > hi {
		return nil, nil
	}
	var groups []int
	for j, g := range e.groups {
		if g.topicLo > r.Topic || g.topicHi < r.Topic {
			continue
		}
		if g.topicLo == r.Topic && g.topicHi == r.Topic && (g.seqHi < lo || g.seqLo > hi) {
			continue // the group holds this topic alone, outside the range
		}
		groups = append(groups, j)
	}
	if r.Desc {
		slices.Reverse(groups)
	}
	var out []readpath.Row
	want := func() int { return r.Limit - len(out) }
	for _, j := range groups {
		g, err := c.fetchGroup(ctx, bucket, e, j)
		if err != nil {
			return nil, err
		}
		from, to, err := g.window(e.cols, r.Topic, lo, hi)
		if err != nil {
			return nil, err
		}
		err = g.read(from, to, r.Desc, want, func(row *Row) bool {
			rr := row.readRow()
			if r.Patch != nil {
				r.Patch(&rr)
			}
			if r.Keep == nil || r.Keep(&rr) {
				out = append(out, rr)
			}
			return len(out) < r.Limit
		})
		if err != nil {
			return nil, err
		}
		if len(out) == r.Limit {
			break
		}
	}
	return out, nil
}

// group is a row group fetched in one range request, read from memory.
type group struct {
	key    string
	i      int
	chunks []parquet.ColumnChunk
	rg     fetchedGroup
}

// fetchGroup fetches row group i of the entry's object in one range
// request.
func (c *Cold) fetchGroup(ctx context.Context, bucket *blob.Bucket, e *coldEntry, i int) (*group, error) {
	sp := e.groups[i]
	buf, err := c.fetch(ctx, bucket, e, sp.off, sp.end-sp.off)
	if err != nil {
		return nil, err
	}
	at := sectionAt{off: sp.off, data: buf}
	rg := e.file.RowGroups()[i]
	chunks := rg.ColumnChunks()
	fetched := make([]parquet.ColumnChunk, len(chunks))
	for j, ch := range chunks {
		fc, ok := ch.(*parquet.FileColumnChunk)
		if !ok {
			return nil, fmt.Errorf("archive: %s: row group %d: unexpected column chunk %T", e.key, i, ch)
		}
		fetched[j] = fetchedChunk{FileColumnChunk: fc, at: at}
	}
	return &group{key: e.key, i: i, chunks: fetched, rg: fetchedGroup{RowGroup: rg, chunks: fetched}}, nil
}

// pages hands column col's values to fn page by page, with the index of
// each page's first row, until fn returns false. The key columns (topic,
// seqid, message_id) are required and not dictionary-encoded in
// SchemaVersion's layout, so a page's values are its rows, of kind.
func (g *group) pages(col int, kind encoding.Kind, fn func(first int64, v encoding.Values) bool) error {
	pages := g.chunks[col].Pages()
	defer pages.Close()
	var first int64
	for {
		p, err := pages.ReadPage()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("archive: read %s row group %d column %d: %w", g.key, g.i, col, err)
		}
		v := p.Data()
		if p.Dictionary() != nil || v.Kind() != kind || p.NumValues() != p.NumRows() {
			parquet.Release(p)
			return fmt.Errorf("archive: %s row group %d column %d: not a page of plain required values", g.key, g.i, col)
		}
		more := fn(first, v)
		first += p.NumRows()
		parquet.Release(p)
		if !more {
			return nil
		}
	}
}

// window is the rows [from, to) of the group whose topic is topic and
// seqid within [lo, hi]. The file is sorted by (topic, seqid), so each
// bound is a binary search of a decoded key column — two columns decoded,
// not the group's rows.
func (g *group) window(cols keyColumns, topic string, lo, hi int64) (from, to int64, err error) {
	tFrom, tTo, err := g.topicSpan(cols, topic, topic) // the topic's rows
	if err != nil || tFrom == tTo {
		return 0, 0, err
	}
	from, to = tFrom, tFrom
	err = g.pages(cols.seq, encoding.Int64, func(first int64, v encoding.Values) bool {
		seqs := v.Int64()
		a, b := max(tFrom-first, 0), min(tTo-first, int64(len(seqs)))
		if a < b {
			in := seqs[a:b]
			from += int64(sort.Search(len(in), func(k int) bool { return in[k] >= lo }))
			to += int64(sort.Search(len(in), func(k int) bool { return in[k] > hi }))
		}
		return first+int64(len(seqs)) < tTo
	})
	return from, to, err
}

// topicSpan is the rows [from, to) of the group whose topic lies within
// [first, last]: the topic column decoded, each bound a binary search of
// each page (the file is sorted by topic).
func (g *group) topicSpan(cols keyColumns, first, last string) (from, to int64, err error) {
	f, l := []byte(first), []byte(last)
	err = g.pages(cols.topic, encoding.ByteArray, func(_ int64, v encoding.Values) bool {
		data, offs := v.ByteArray()
		at := func(k int) []byte { return data[offs[k]:offs[k+1]] }
		n := len(offs) - 1
		from += int64(sort.Search(n, func(k int) bool { return bytes.Compare(at(k), f) >= 0 }))
		to += int64(sort.Search(n, func(k int) bool { return bytes.Compare(at(k), l) > 0 }))
		return true
	})
	return from, to, err
}

// find is the index of the row whose column col (an int64 key) is x, or
// -1.
func (g *group) find(col int, x int64) (int64, error) {
	at := int64(-1)
	err := g.pages(col, encoding.Int64, func(first int64, v encoding.Values) bool {
		if k := slices.Index(v.Int64(), x); k >= 0 {
			at = first + int64(k)
			return false
		}
		return true
	})
	return at, err
}

// groupBatch bounds how many rows one read of a row group decodes at a
// time.
const groupBatch = 256

// read decodes rows [from, to) of the group, at most want() rows (at
// least one, at most groupBatch) at a time, and hands them to fn in file
// order or, desc, from the last, until fn returns false. Rows outside
// the range are not decoded into rows: the reader seeks to the first row
// of each batch.
func (g *group) read(from, to int64, desc bool, want func() int, fn func(*Row) bool) error {
	if from >= to {
		return nil
	}
	pr := parquet.NewGenericRowGroupReader[Row](g.rg)
	defer pr.Close()
	buf := make([]Row, min(to-from, groupBatch))
	seek := true
	for from < to {
		n := min(int64(min(max(want(), 1), groupBatch)), to-from)
		at := from
		if desc {
			at, seek = to-n, true
		}
		if seek {
			if err := pr.SeekToRow(at); err != nil {
				return fmt.Errorf("archive: seek %s row group %d to row %d: %w", g.key, g.i, at, err)
			}
			seek = false
		}
		rows := buf[:n]
		got, err := pr.Read(rows)
		if int64(got) < n {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("archive: read %s row group %d rows [%d, %d): %w", g.key, g.i, at, at+n, err)
		}
		if desc {
			to = at
			for k := len(rows) - 1; k >= 0; k-- {
				if !fn(&rows[k]) {
					return nil
				}
			}
			continue
		}
		from = at + n
		for k := range rows {
			if !fn(&rows[k]) {
				return nil
			}
		}
	}
	return nil
}

// fetch reads n bytes at off of the entry's object, in one range request,
// if the object is still the one the entry describes (errStale).
func (c *Cold) fetch(ctx context.Context, bucket *blob.Bucket, e *coldEntry, off, n int64) ([]byte, error) {
	buf, _, _, err := fetchRange(ctx, bucket, e.key, off, n, &c.m, func(size int64, mod time.Time) error {
		if size != e.size || !mod.Equal(e.mod) {
			return fmt.Errorf("%w: %s", errStale, e.key)
		}
		return nil
	})
	return buf, err
}

// fetchRange reads n bytes at off of key, with the object's size and
// time; check, when set, vets those before anything is read.
func fetchRange(ctx context.Context, bucket *blob.Bucket, key string, off, n int64, m *coldMetrics,
	check func(size int64, mod time.Time) error) ([]byte, int64, time.Time, error) {
	rr, err := bucket.NewRangeReader(ctx, key, off, n, nil)
	if err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("archive: read %s: %w", key, err)
	}
	defer rr.Close()
	if check != nil {
		if err := check(rr.Size(), rr.ModTime()); err != nil {
			return nil, 0, time.Time{}, err
		}
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(rr, buf); err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("archive: read %s at %d: %w", key, off, err)
	}
	m.ranges.Inc()
	m.rangeBytes.Add(float64(n))
	return buf, rr.Size(), rr.ModTime(), nil
}

// entry is the month's cached metadata, loaded on a miss (one load per
// month at a time), and the bucket.
func (c *Cold) entry(ctx context.Context, tenant string, m routing.Month) (*coldEntry, *blob.Bucket, error) {
	bucket, err := c.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	k := tenant + "/" + m.String()
	c.mu.Lock()
	e, ok := c.cache.Get(k)
	c.mu.Unlock()
	if ok {
		c.m.cache.WithLabelValues("hit").Inc()
		return e, bucket, nil
	}
	c.m.cache.WithLabelValues("miss").Inc()
	v, err, _ := c.loads.Do(k, func() (any, error) {
		e, err := load(context.WithoutCancel(ctx), bucket, tenant, m, &c.m)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.cache.Add(k, e)
		c.size += e.bytes
		for c.size > c.limit && c.cache.Len() > 1 {
			c.cache.RemoveOldest()
		}
		c.m.cached.Set(float64(c.size))
		c.mu.Unlock()
		return e, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(*coldEntry), bucket, nil
}

func (c *Cold) open(ctx context.Context) (*blob.Bucket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bucket != nil {
		return c.bucket, nil
	}
	b, err := OpenBucket(ctx, c.url)
	if err != nil {
		return nil, err
	}
	c.bucket = b
	return b, nil
}

// footerGuess is the tail read first: the footer and its length, for all
// but the largest months, in one request.
const footerGuess = 64 << 10

// load reads the month's manifest and the Parquet footer.
func load(ctx context.Context, bucket *blob.Bucket, tenant string, m routing.Month, cm *coldMetrics) (*coldEntry, error) {
	raw, err := bucket.ReadAll(ctx, manifestKey(tenant, m))
	if err != nil {
		return nil, fmt.Errorf("archive: manifest of %s %s: %w", tenant, m, err)
	}
	e := &coldEntry{key: ObjectKey(tenant, m)}
	if err := json.Unmarshal(raw, &e.man); err != nil {
		return nil, fmt.Errorf("archive: manifest of %s %s: %w", tenant, m, err)
	}
	if e.man.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("archive: %s has schema version %d, this binary reads %d", e.key, e.man.SchemaVersion, SchemaVersion)
	}
	size := e.man.Bytes
	n := min(size, footerGuess)
	tail, gotSize, mod, err := fetchRange(ctx, bucket, e.key, size-n, n, cm, nil)
	if err != nil {
		return nil, err
	}
	if gotSize != size {
		return nil, fmt.Errorf("archive: %s is %d bytes, its manifest says %d", e.key, gotSize, size)
	}
	if footer := int64(binary.LittleEndian.Uint32(tail[n-8:])) + 8; footer > n && footer <= size {
		if tail, _, mod, err = fetchRange(ctx, bucket, e.key, size-footer, footer, cm, nil); err != nil {
			return nil, err
		}
		n = footer
	}
	e.size, e.mod = size, mod
	e.file, err = parquet.OpenFile(sectionAt{off: size - n, data: tail}, size,
		parquet.SkipMagicBytes(true), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return nil, fmt.Errorf("archive: open %s: %w", e.key, err)
	}
	if e.groups, e.cols, err = spans(e.file); err != nil {
		return nil, fmt.Errorf("archive: %s: %w", e.key, err)
	}
	e.bytes = int64(len(raw)) + n
	return e, nil
}

// spans lists the row groups' byte ranges and statistics, and where the
// key columns are.
func spans(f *parquet.File) ([]groupSpan, keyColumns, error) {
	var cols keyColumns
	for name, at := range map[string]*int{"topic": &cols.topic, "seqid": &cols.seq, "message_id": &cols.id,
		"from_user": &cols.from, "status": &cols.status, "version": &cols.version} {
		leaf, ok := f.Schema().Lookup(name)
		if !ok {
			return nil, cols, fmt.Errorf("no column %s", name)
		}
		*at = leaf.ColumnIndex
	}
	groups := f.RowGroups()
	out := make([]groupSpan, len(groups))
	for i, rg := range f.Metadata().RowGroups {
		g := &out[i]
		g.off = -1
		for _, ch := range rg.Columns {
			start := ch.MetaData.DataPageOffset
			if d := ch.MetaData.DictionaryPageOffset; d > 0 && d < start {
				start = d
			}
			if g.off < 0 || start < g.off {
				g.off = start
			}
			g.end = max(g.end, start+ch.MetaData.TotalCompressedSize)
		}
		chunks := groups[i].ColumnChunks()
		bounds := func(j int) (parquet.Value, parquet.Value, error) {
			fc, ok := chunks[j].(*parquet.FileColumnChunk)
			if !ok {
				return parquet.Value{}, parquet.Value{}, fmt.Errorf("row group %d: no statistics", i)
			}
			lo, hi, ok := fc.Bounds()
			if !ok {
				return lo, hi, fmt.Errorf("row group %d column %d: no statistics", i, j)
			}
			return lo, hi, nil
		}
		lo, hi, err := bounds(cols.topic)
		if err != nil {
			return nil, cols, err
		}
		g.topicLo, g.topicHi = string(lo.ByteArray()), string(hi.ByteArray())
		if lo, hi, err = bounds(cols.seq); err != nil {
			return nil, cols, err
		}
		g.seqLo, g.seqHi = lo.Int64(), hi.Int64()
		if lo, hi, err = bounds(cols.id); err != nil {
			return nil, cols, err
		}
		g.idLo, g.idHi = lo.Int64(), hi.Int64()
	}
	return out, cols, nil
}

// sectionAt serves reads of [off, off+len(data)) of an object from memory.
type sectionAt struct {
	off  int64
	data []byte
}

func (s sectionAt) ReadAt(p []byte, off int64) (int, error) {
	i := off - s.off
	if i < 0 || i > int64(len(s.data)) {
		return 0, fmt.Errorf("archive: read at %d outside the fetched range [%d, %d)", off, s.off, s.off+int64(len(s.data)))
	}
	n := copy(p, s.data[i:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// fetchedGroup is a row group whose column chunks read the bytes fetched.
type fetchedGroup struct {
	parquet.RowGroup
	chunks []parquet.ColumnChunk
}

func (g fetchedGroup) ColumnChunks() []parquet.ColumnChunk { return g.chunks }

func (g fetchedGroup) Rows() parquet.Rows { return parquet.NewRowGroupRowReader(g) }

// fetchedChunk reads its pages from the fetched bytes.
type fetchedChunk struct {
	*parquet.FileColumnChunk
	at sectionAt
}

func (c fetchedChunk) Pages() parquet.Pages { return c.PagesFrom(c.at) }
