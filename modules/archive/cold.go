package archive

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/parquet-go/parquet-go"
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
	bytes  int64
}

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
			var found []readpath.Row
			err := c.readGroup(ctx, bucket, e, i, func(rows []Row) bool {
				for j := range rows {
					if rows[j].MessageID == id {
						found = append(found, rows[j].readRow())
						return false
					}
				}
				return true
			})
			if err != nil || found != nil {
				return found, err
			}
		}
		return nil, nil
	})
	if err != nil || len(rows) == 0 {
		return readpath.Row{}, false, err
	}
	return rows[0], true, nil
}

// IDRange implements readpath.ColdMonths, from the manifest.
func (c *Cold) IDRange(ctx context.Context, tenant string, m routing.Month) (int64, int64, bool, error) {
	e, _, err := c.entry(ctx, tenant, m)
	if err != nil {
		return 0, 0, false, err
	}
	return e.man.MinMessageID, e.man.MaxMessageID, e.man.Rows > 0, nil
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
	for _, j := range groups {
		var in []readpath.Row
		err := c.readGroup(ctx, bucket, e, j, func(rows []Row) bool {
			for k := range rows {
				if rows[k].Topic == r.Topic && rows[k].SeqID >= lo && rows[k].SeqID <= hi {
					in = append(in, rows[k].readRow())
				} else if rows[k].Topic > r.Topic || (rows[k].Topic == r.Topic && rows[k].SeqID > hi) {
					return false // sorted by (topic, seq): nothing further is in range
				}
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		if r.Desc {
			slices.Reverse(in)
		}
		for k := range in {
			if r.Keep == nil || r.Keep(&in[k]) {
				out = append(out, in[k])
				if len(out) == r.Limit {
					return out, nil
				}
			}
		}
	}
	return out, nil
}

// groupBatch is how many rows one read of a row group decodes at a time.
const groupBatch = 256

// readGroup fetches row group i in one range request and hands its rows,
// in file order, to fn until fn returns false.
func (c *Cold) readGroup(ctx context.Context, bucket *blob.Bucket, e *coldEntry, i int, fn func([]Row) bool) error {
	g := e.groups[i]
	buf, err := c.fetch(ctx, bucket, e, g.off, g.end-g.off)
	if err != nil {
		return err
	}
	at := sectionAt{off: g.off, data: buf}
	rg := e.file.RowGroups()[i]
	chunks := rg.ColumnChunks()
	fetched := make([]parquet.ColumnChunk, len(chunks))
	for j, ch := range chunks {
		fc, ok := ch.(*parquet.FileColumnChunk)
		if !ok {
			return fmt.Errorf("archive: %s: row group %d: unexpected column chunk %T", e.key, i, ch)
		}
		fetched[j] = fetchedChunk{FileColumnChunk: fc, at: at}
	}
	pr := parquet.NewGenericRowGroupReader[Row](fetchedGroup{RowGroup: rg, chunks: fetched})
	defer pr.Close()
	rows := make([]Row, groupBatch)
	for {
		n, err := pr.Read(rows)
		if n > 0 && !fn(rows[:n]) {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("archive: read %s row group %d: %w", e.key, i, err)
		}
	}
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
	if e.groups, err = spans(e.file); err != nil {
		return nil, fmt.Errorf("archive: %s: %w", e.key, err)
	}
	e.bytes = int64(len(raw)) + n
	return e, nil
}

// spans lists the row groups' byte ranges and statistics.
func spans(f *parquet.File) ([]groupSpan, error) {
	col := func(name string) (int, error) {
		leaf, ok := f.Schema().Lookup(name)
		if !ok {
			return 0, fmt.Errorf("no column %s", name)
		}
		return leaf.ColumnIndex, nil
	}
	topic, err := col("topic")
	if err != nil {
		return nil, err
	}
	seq, err := col("seqid")
	if err != nil {
		return nil, err
	}
	id, err := col("message_id")
	if err != nil {
		return nil, err
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
		lo, hi, err := bounds(topic)
		if err != nil {
			return nil, err
		}
		g.topicLo, g.topicHi = string(lo.ByteArray()), string(hi.ByteArray())
		if lo, hi, err = bounds(seq); err != nil {
			return nil, err
		}
		g.seqLo, g.seqHi = lo.Int64(), hi.Int64()
		if lo, hi, err = bounds(id); err != nil {
			return nil, err
		}
		g.idLo, g.idHi = lo.Int64(), hi.Int64()
	}
	return out, nil
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
