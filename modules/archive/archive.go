// Package archive moves sealed months out of MySQL into object storage:
// a Parquet file per month (zstd, (topic, seqid) order, row groups small
// enough for range reads, a bloom filter on topic) and a small JSON
// manifest, written through gocloud.dev/blob (file://, s3://, gs://,
// azblob://). Each step is recorded in the tenant's im_archives row and is
// idempotent, so a run killed at any point resumes where it stopped; the
// month table is read only, never changed, by the steps here.
package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"sort"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets
	_ "gocloud.dev/blob/s3blob"   // s3:// buckets (S3, MinIO, Ceph)
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
)

// Config is the archive section.
type Config struct {
	URL           string
	RowsPerSecond int
	// SortDir and SortBytes: where an export's sort writes its runs, and
	// the rows it keeps in memory before it writes one (archive.sort_dir,
	// archive.sort_bytes).
	SortDir   string
	SortBytes int64
	// KeepTable is how long an archived month's table stays after the
	// mark before it is dropped (archive.keep_table; at least
	// routing.RestoreSettle).
	KeepTable time.Duration
	// IdempotencyTTL is send.idempotency_ttl: a retry within it whose
	// idempotency record Redis lost is looked for in the tables of the
	// active month and the one before, and a missing table reads as "not
	// sent", so no month's table is dropped before the TTL (and the
	// produce timeout) has passed since the month's end (dropDue).
	IdempotencyTTL time.Duration
}

// Params wires an Archiver.
type Params struct {
	Config         Config
	DBs            routing.DBs
	Catalog        *routing.Catalog
	Redis          rueidis.Client
	KeySpace       routing.KeySpace
	ProduceTimeout time.Duration // send.produce_timeout, for the completeness proof
	// AfterMonths is a tenant's archive_after_months (0: never
	// automatically), for the patrol (Apply).
	AfterMonths func(tenant string) int
	Log         zerolog.Logger
	Registerer  prometheus.Registerer
}

// Archiver exports and verifies month archives.
type Archiver struct {
	p     Params
	m     *metrics
	clock routing.Clock
}

// New builds an Archiver.
func New(p Params) *Archiver {
	if p.AfterMonths == nil {
		p.AfterMonths = func(string) int { return 0 }
	}
	return &Archiver{p: p, m: newMetrics(p.Registerer), clock: routing.NewClock(p.Redis)}
}

// Steps of a month's archive, in order (im_archives.step).
const (
	StepPrechecked = "prechecked"
	StepExported   = "exported"
	StepVerified   = "verified"
	// StepMarked: the catalog row is archived (set in one transaction
	// with this step); changes of the month answer 409 from then on.
	StepMarked = "marked"
)

// Errors of the pre-checks: the month is left as it was.
var (
	ErrNotSealed  = errors.New("archive: the month is not sealed")
	ErrIncomplete = errors.New("archive: the month is not proven complete")
	ErrMismatch   = errors.New("archive: the archive differs from the month table")
	// ErrChanged refuses the mark: the month table changed after it was
	// verified, or the month is no longer sealed; the month is exported
	// and verified again by the next run.
	ErrChanged = errors.New("archive: the month changed after its verification")
)

// SchemaVersion is the manifest's and the Parquet file's layout version.
const SchemaVersion = 1

// rowGroupRows bounds a row group: a cold read of one topic's page
// fetches one or two groups (about 300 KiB of short texts), not the month,
// while the footer the cold reader caches stays near 2.5 KiB per group
// (smaller groups would fetch less per read but grow every cached footer
// as much).
const rowGroupRows = 8192

// Report is what one archive run did (or, dry, would do).
type Report struct {
	Tenant string
	Month  routing.Month
	Step   string
	Rows   int64
	Topics int
	Bytes  int64
	Key    string
	DryRun bool
	// Export is how long this run's export took (0: it exported nothing).
	Export time.Duration
	// TableDropped: this run dropped the month's table (a run of a month
	// marked at least archive.keep_table ago).
	TableDropped bool
}

// TopicRange is one topic's part of the archive, in the manifest.
type TopicRange struct {
	Topic  string `json:"topic"`
	MinSeq int64  `json:"min_seq"`
	MaxSeq int64  `json:"max_seq"`
	Count  int64  `json:"count"`
	MinAt  int64  `json:"min_created_at_us"`
	MaxAt  int64  `json:"max_created_at_us"`
	Hash   string `json:"hash"`
}

// Manifest describes one archived month.
type Manifest struct {
	SchemaVersion int          `json:"schema_version"`
	Tenant        string       `json:"tenant"`
	Month         string       `json:"month"`
	Object        string       `json:"object"`
	Bytes         int64        `json:"bytes"`
	FileSHA256    string       `json:"file_sha256"`
	Rows          int64        `json:"rows"`
	MinMessageID  int64        `json:"min_message_id"`
	MaxMessageID  int64        `json:"max_message_id"`
	Topics        []TopicRange `json:"topics"`
	Hash          string       `json:"hash"` // over the topics' hashes, in topic order
	CreatedAt     time.Time    `json:"created_at"`
}

// ObjectKey is where a month's Parquet file lives in the bucket; the
// manifest is beside it.
func ObjectKey(tenant string, m routing.Month) string {
	return tenant + "/" + m.String() + "/messages.parquet"
}

func manifestKey(tenant string, m routing.Month) string {
	return tenant + "/" + m.String() + "/manifest.json"
}

// OpenBucket opens archive.url. A file:// bucket is created when missing
// and writes its temporary files beside the final ones (the data
// directory, not /tmp, which may be another file system).
func OpenBucket(ctx context.Context, raw string) (*blob.Bucket, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("archive: url: %w", err)
	}
	if u.Scheme == "file" {
		q := u.Query()
		for _, k := range []string{"create_dir", "no_tmp_dir"} {
			if q.Get(k) == "" {
				q.Set(k, "1")
			}
		}
		u.RawQuery = q.Encode()
	}
	b, err := blob.OpenBucket(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("archive: open %s: %w", u.Redacted(), err)
	}
	return b, nil
}

// Archive runs (or resumes) the archive of tenant's month: pre-checks
// (sealed, proven complete, counts and per-topic hashes of the table),
// export to Parquet and the manifest, a re-read of the archive compared
// with the table, then the mark: the catalog row archived, if the table is
// still the one verified. dryRun stops after the pre-checks and writes
// nothing. The month stays readable from its table throughout. A run
// that writes holds the tenant's archive lock (ErrBusy while another
// holds it).
func (a *Archiver) Archive(ctx context.Context, tenant string, m routing.Month, dryRun bool) (Report, error) {
	rep := Report{Tenant: tenant, Month: m, Key: ObjectKey(tenant, m), DryRun: dryRun}
	db, err := a.p.DBs.DB(ctx, tenant)
	if err != nil || dryRun {
		return a.archive(ctx, db, rep, err)
	}
	err = exclusive(ctx, db, func() error {
		rep, err = a.archive(ctx, db, rep, nil)
		return err
	})
	return rep, err
}

// archive is Archive's run, with db the tenant's database (or its error).
func (a *Archiver) archive(ctx context.Context, db *sql.DB, rep Report, err error) (Report, error) {
	if err != nil {
		return rep, err
	}
	tenant, m, dryRun := rep.Tenant, rep.Month, rep.DryRun
	st, err := loadState(ctx, db, m)
	if err != nil || st.step == StepMarked {
		if err == nil && !dryRun {
			// marked: what is left is the table's drop, once due
			var dropped []routing.Month
			dropped, err = a.dropDue(ctx, db, tenant, m)
			rep.TableDropped = len(dropped) > 0
		}
		return report(rep, st), err
	}
	t, err := a.precheck(ctx, db, tenant, m)
	if err != nil {
		return rep, err
	}
	if dryRun {
		d, err := a.tableDigests(ctx, db, t)
		if err != nil {
			return rep, err
		}
		rep.Step, rep.Rows, rep.Topics = st.step, total(d), len(d)
		return rep, nil
	}
	if st.step == "" {
		testhook.CrashArchive(StepPrechecked)
		if err := saveState(ctx, db, m, state{step: StepPrechecked, key: rep.Key}); err != nil {
			return rep, err
		}
		st.step = StepPrechecked
	}
	bucket, err := OpenBucket(ctx, a.p.Config.URL)
	if err != nil {
		return rep, err
	}
	defer bucket.Close()
	if st.step == StepPrechecked {
		start := time.Now()
		man, err := a.export(ctx, db, bucket, tenant, t)
		if err != nil {
			_ = recordError(ctx, db, m, err)
			return rep, err
		}
		rep.Export = time.Since(start)
		a.m.exportSeconds.Observe(rep.Export.Seconds())
		raw, _ := json.Marshal(man)
		testhook.CrashArchive(StepExported)
		if err := saveState(ctx, db, m, state{step: StepExported, key: rep.Key, rows: man.Rows, bytes: man.Bytes,
			hash: man.Hash, manifest: string(raw)}); err != nil {
			return rep, err
		}
		st.step = StepExported
	}
	if st.step == StepExported {
		// the stamp is taken before the verification reads the table: a
		// change landing during or after it makes the mark refuse
		stamp, err := tableStamp(ctx, db, t)
		if err != nil {
			return rep, err
		}
		if err := a.verify(ctx, db, bucket, tenant, t); err != nil {
			_ = recordError(ctx, db, m, err)
			a.m.verifyFailures.Inc()
			return rep, err
		}
		testhook.CrashArchive(StepVerified)
		if err := setVerified(ctx, db, m, stamp); err != nil {
			return rep, err
		}
		st.step, st.stamp = StepVerified, stamp
	}
	if err := a.mark(ctx, db, tenant, t, st.stamp); err != nil {
		_ = recordError(ctx, db, m, err)
		return rep, err
	}
	st, err = loadState(ctx, db, m)
	if err != nil {
		return rep, err
	}
	a.m.archived.Inc()
	a.p.Log.Info().Str("tenant", tenant).Str("month", m.String()).Int64("rows", st.rows).Int64("bytes", st.bytes).
		Msg("month archive written, verified and marked")
	return report(rep, st), nil
}

// Apply is the shard manager patrol's part, for one tenant: it resumes
// every month whose archive stopped half-way (a killed run, a refused
// mark), then archives each sealed month archive_after_months or more
// behind the current month, oldest first, one at a time. The first
// failure ends the run (the next patrol tries again) and is counted in
// imshard_archive_failures_total.
func (a *Archiver) Apply(ctx context.Context, tenant string) error {
	todo, err := a.due(ctx, tenant)
	for _, m := range todo {
		if err != nil {
			break
		}
		_, err = a.Archive(ctx, tenant, m, false)
	}
	if err == nil {
		_, err = a.DropTables(ctx, tenant)
	}
	if errors.Is(err, ErrBusy) {
		return nil // a command archives or restores the tenant now; the next patrol goes on
	}
	if err != nil && ctx.Err() == nil {
		a.m.failures.WithLabelValues(tenant).Inc()
	}
	return err
}

// due lists the months Apply archives: those with an unfinished archive,
// then those past the tenant's archive_after_months, oldest first.
func (a *Archiver) due(ctx context.Context, tenant string) ([]routing.Month, error) {
	progress, err := a.Progress(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []routing.Month
	for m, p := range progress {
		if p.Step != StepMarked {
			out = append(out, m)
		}
	}
	if after := a.p.AfterMonths(tenant); after > 0 {
		now, err := a.clock.Month(ctx)
		if err != nil {
			return nil, err
		}
		shards, err := a.p.Catalog.List(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, s := range shards {
			if _, touched := progress[s.Month]; !touched && s.Status == routing.StatusSealed && !now.Before(s.Month.Add(after)) {
				out = append(out, s.Month)
			}
		}
	}
	slices.SortFunc(out, func(x, y routing.Month) int { return x.Compare(y) })
	return out, nil
}

// report fills rep from the month's recorded state.
func report(rep Report, st state) Report {
	rep.Step, rep.Rows, rep.Bytes = st.step, st.rows, st.bytes
	var man Manifest
	if json.Unmarshal([]byte(st.manifest), &man) == nil {
		rep.Topics = len(man.Topics)
	}
	return rep
}

// tableStamp is what tells a month table changed: its row count, the sum
// of its rows' versions (every change raises a version) and its newest
// updated_at — one scan, none of the hashing a verification does.
func tableStamp(ctx context.Context, db sq.BaseRunner, t routing.Table) (string, error) {
	var n, versions int64
	var newest sql.NullTime
	if err := sq.Select("COUNT(*)", "COALESCE(SUM(version), 0)", "MAX(updated_at)").From(t.Quoted()).
		RunWith(db).QueryRowContext(ctx).Scan(&n, &versions, &newest); err != nil {
		return "", fmt.Errorf("archive: stamp %s: %w", t.Name(), err)
	}
	return fmt.Sprintf("%d/%d/%d", n, versions, newest.Time.UnixMicro()), nil
}

// mark sets the month's catalog row to archived and records the step, in
// one transaction, under the catalog row's exclusive lock — which waits
// for every change of the month under way (routing.LockForChange) — and
// only if the month is still sealed and its table still the one verified
// (the stamp). Otherwise the month goes back to prechecked: the next run
// exports and verifies it again.
func (a *Archiver) mark(ctx context.Context, db *sql.DB, tenant string, t routing.Table, stamp string) error {
	m := t.Month()
	var changed error
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		status, err := routing.LockForArchive(ctx, tx, m)
		if err != nil {
			return err
		}
		now, err := tableStamp(ctx, tx, t)
		if err != nil {
			return err
		}
		if status != routing.StatusSealed || now != stamp {
			changed = fmt.Errorf("%w: %s is %s, table %s, verified as %s", ErrChanged, m, status, now, stamp)
			return changed
		}
		if _, err := routing.SetArchived(ctx, tx, m, true); err != nil {
			return err
		}
		// what an earlier restore merged is in the table this archive
		// was exported from
		if err := routing.ClearOverlay(ctx, tx, m); err != nil {
			return err
		}
		if err := setMarked(ctx, tx, m); err != nil {
			return err
		}
		testhook.CrashArchive(StepMarked)
		return nil
	})
	if changed != nil {
		if err := setStep(ctx, db, m, StepPrechecked); err != nil {
			return err
		}
		return changed
	}
	if err != nil {
		return fmt.Errorf("archive: mark %s: %w", m, err)
	}
	a.p.Catalog.Invalidate(tenant)
	return nil
}

// precheck makes sure the month is sealed and proven complete.
func (a *Archiver) precheck(ctx context.Context, db *sql.DB, tenant string, m routing.Month) (routing.Table, error) {
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return routing.Table{}, err
	}
	i := slices.IndexFunc(shards, func(s routing.Shard) bool { return s.Month == m })
	if i < 0 {
		return routing.Table{}, fmt.Errorf("%w: %s", routing.ErrShardNotRegistered, m)
	}
	s := shards[i]
	if s.Status != routing.StatusSealed {
		return routing.Table{}, fmt.Errorf("%w: %s is %s", ErrNotSealed, m, s.Status)
	}
	keys, err := a.p.KeySpace.Tenant(tenant)
	if err != nil {
		return routing.Table{}, err
	}
	proof, err := routing.ProveComplete(ctx, db, a.p.Redis, keys, s, a.p.ProduceTimeout)
	if err != nil {
		return routing.Table{}, err
	}
	if !proof.Complete() {
		return routing.Table{}, fmt.Errorf("%w: %s: %s", ErrIncomplete, proof.Reason, proof.Detail)
	}
	return s.Table, nil
}

// scanChunk is how many rows one keyset-paged read of the table takes:
// at a few hundred bytes a record, a page of about a megabyte, and a
// month of a million rows in a hundred statements.
const scanChunk = 10000

// pace is archive.rows_per_second over one pass of a run (a read of the
// month table, a restore's writes into it): the pass moves rows in
// batches of at most a second's worth, each waiting for its rows, so the
// pass keeps the limit to within one batch from its start — a batch
// larger than the limit would let its whole burst through at once.
type pace struct {
	lim   *rate.Limiter // nil: unthrottled
	batch int
}

// pace is the throttle of a pass that moves up to batch rows at a time.
func (a *Archiver) pace(batch int) pace {
	rps := a.p.Config.RowsPerSecond
	if rps <= 0 {
		return pace{batch: batch}
	}
	batch = min(batch, rps)
	return pace{lim: rate.NewLimiter(rate.Limit(rps), batch), batch: batch}
}

// wait blocks until n (at most the batch) more rows may move.
func (p pace) wait(ctx context.Context, n int) error {
	if p.lim == nil {
		return nil
	}
	return p.lim.WaitN(ctx, n)
}

// scanTable reads t in its clustered order (message_id) in keyset pages
// (each its own short statement: no long transaction holds the table),
// throttled to archive.rows_per_second, handing each page of records
// (appendRecord) to fn. The clustered order reads the table's pages one
// after the other; what needs (topic, seqid) order sorts the records
// itself (sorter). The message ids are cut into scanReaders ranges, each
// read by a reader of its own on a connection of its own (the server
// reads and sends them on as many threads), and fn is handed their pages
// as they come, from one range or the other: what it does with them
// (the export's sort, the verification's per-topic XOR of hashes) does
// not depend on their order. A reader encodes each row into its page as
// the driver hands it over (no copy of the driver's values in between)
// and reads its next page while fn works through the last one. A page fn
// keeps (keep: the export's sorter holds its records where the reader
// wrote them, not copied) is not read into again; the reader takes a new
// one in its place.
func (a *Archiver) scanTable(ctx context.Context, db *sql.DB, t routing.Table, fn func(pg *page) (keep bool, err error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bounds, err := scanRanges(ctx, db, t)
	if err != nil {
		return err
	}
	pc := a.pace(scanChunk)
	pages := 2 * (len(bounds) - 1) // two a reader: one read into while fn has the other
	full, free := make(chan *page, pages), make(chan *page, pages)
	for range pages {
		free <- &page{recs: make([]pageRec, 0, pc.batch)}
	}
	readers, rctx := errgroup.WithContext(ctx) // the first reader's error stops the others
	for i := range len(bounds) - 1 {
		readers.Go(func() error { return a.readPages(rctx, db, t, pc, i, bounds[i], bounds[i+1], free, full) })
	}
	read := make(chan error, 1)
	go func() {
		defer close(full)
		read <- readers.Wait()
	}()
	for pg := range full {
		keep, err := fn(pg)
		if err != nil {
			cancel()
			for range full { // let the readers end
			}
			return err
		}
		if keep { // its records' entries are copied: the slice is free
			pg = &page{buf: make([]byte, 0, cap(pg.buf)), recs: pg.recs}
		}
		free <- pg
	}
	return <-read
}

// scanReaders is how many ranges of message ids scanTable reads at once.
const scanReaders = 2

// scanRanges is the bounds of scanTable's ranges of t's message ids
// (cutIDs), a single range for an empty table.
func scanRanges(ctx context.Context, db *sql.DB, t routing.Table) ([]int64, error) {
	var lo, hi sql.NullInt64
	if err := sq.Select("MIN(message_id)", "MAX(message_id)").From(t.Quoted()).RunWith(db).QueryRowContext(ctx).Scan(&lo, &hi); err != nil {
		return nil, fmt.Errorf("archive: read %s: %w", t.Name(), err)
	}
	if !lo.Valid || !hi.Valid {
		return []int64{math.MinInt64, math.MaxInt64}, nil
	}
	return cutIDs(lo.Int64, hi.Int64, scanReaders), nil
}

// cutIDs cuts the message ids into n ranges, (bounds[i], bounds[i+1]],
// of about as many ids each between lo and hi, the first and the last
// open (from MinInt64, to MaxInt64): together they hold every id, in the
// table or not.
func cutIDs(lo, hi int64, n int) []int64 {
	span := uint64(hi) - uint64(lo) // the distance, whatever the signs
	bounds := []int64{math.MinInt64}
	for i := 1; i < n; i++ {
		bounds = append(bounds, lo+int64(span/uint64(n)*uint64(i)))
	}
	return append(bounds, math.MaxInt64)
}

// page is one keyset page of scanTable: its rows' records, one after the
// other in buf, read from scanTable's range rng of message ids.
type page struct {
	buf  []byte
	recs []pageRec
	rng  int
}

type pageRec struct {
	off, end int
	key      recKey
}

// driverValue takes a column's value as the driver returns it, without
// the copy database/sql makes of text for a *any: it is valid until the
// next row is read.
type driverValue struct{ v any }

func (d *driverValue) Scan(src any) error {
	d.v = src
	return nil
}

// readPages reads the rows of ids in (after, upTo], scanTable's range rng,
// into pages from free, sending each to full. Its pages are one prepared
// statement on a connection of its own, executed page after page: the
// server sends the rows in the binary protocol, which neither it nor the
// driver turns into decimal text and back (the integers and times are
// the same values the text protocol gives, so are their records and
// hashes).
func (a *Archiver) readPages(ctx context.Context, db *sql.DB, t routing.Table, pc pace, rng int, after, upTo int64, free <-chan *page, full chan<- *page) error {
	query, _, err := sq.Select(routing.LegacyColumnNames()...).From(t.Quoted()).Where("message_id > ? AND message_id <= ?").
		OrderBy("message_id").Limit(uint64(pc.batch)).ToSql()
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("archive: read %s: %w", t.Name(), err)
	}
	defer conn.Close()
	stmt, err := conn.PrepareContext(ctx, query)
	if err != nil {
		return fmt.Errorf("archive: read %s: %w", t.Name(), err)
	}
	defer stmt.Close()
	dv, dest, vals := make([]driverValue, columns), make([]any, columns), make([]any, columns)
	for i := range dv {
		dest[i] = &dv[i]
	}
	last := after
	for {
		if err := pc.wait(ctx, pc.batch); err != nil {
			return err
		}
		var pg *page
		select {
		case pg = <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
		rows, err := stmt.QueryContext(ctx, last, upTo)
		if err != nil {
			return fmt.Errorf("archive: read %s: %w", t.Name(), err)
		}
		pg.buf, pg.recs, pg.rng = pg.buf[:0], pg.recs[:0], rng
		for rows.Next() {
			if err = rows.Scan(dest...); err != nil {
				break
			}
			for i := range dv {
				vals[i] = dv[i].v
			}
			id, ok := vals[0].(int64)
			if !ok {
				err = fmt.Errorf("archive: read %s: message_id %T", t.Name(), vals[0])
				break
			}
			off := len(pg.buf)
			var key recKey
			if pg.buf, key, err = appendRecord(pg.buf, vals); err != nil {
				break
			}
			pg.recs = append(pg.recs, pageRec{off: off, end: len(pg.buf), key: key})
			last = id
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
		if err != nil {
			return err
		}
		n := len(pg.recs)
		if n > 0 {
			full <- pg // room for every page: never blocks
		}
		if n < pc.batch {
			return nil
		}
	}
}

// tableDigests hashes every topic of t (routing.Digest, as the migration
// verifies).
func (a *Archiver) tableDigests(ctx context.Context, db *sql.DB, t routing.Table) (map[string]*routing.Digest, error) {
	out := map[string]*routing.Digest{}
	var buf bytes.Buffer
	err := a.scanTable(ctx, db, t, func(pg *page) (bool, error) {
		for _, r := range pg.recs {
			rec := pg.buf[r.off:r.end]
			buf.Reset()
			if err := canonicalRecord(&buf, rec); err != nil {
				return false, err
			}
			sum := sha256.Sum256(buf.Bytes())
			topic := r.key.topic(rec)
			d := out[string(topic)]
			if d == nil {
				d = &routing.Digest{}
				out[string(topic)] = d
			}
			d.Add(r.key.seq, sum[:])
		}
		return false, nil
	})
	return out, err
}

func total(d map[string]*routing.Digest) int64 {
	var n int64
	for _, x := range d {
		n += x.N
	}
	return n
}

// hashingWriter counts and hashes what goes to the bucket.
type hashingWriter struct {
	w io.Writer
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (h *hashingWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// export writes the Parquet file and the manifest (both overwritten when
// a killed run left them half done: a blob write is visible only once
// closed, so an object is whole or absent).
func (a *Archiver) export(ctx context.Context, db *sql.DB, bucket *blob.Bucket, tenant string, t routing.Table) (Manifest, error) {
	key := ObjectKey(tenant, t.Month())
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // an unfinished blob write is discarded
	bw, err := bucket.NewWriter(wctx, key, &blob.WriterOptions{ContentType: "application/vnd.apache.parquet"})
	if err != nil {
		return Manifest{}, fmt.Errorf("archive: write %s: %w", key, err)
	}
	hw := &hashingWriter{w: bw, h: sha256.New()}
	pw := newWriter(hw)
	man := Manifest{SchemaVersion: SchemaVersion, Tenant: tenant, Month: t.Month().String(), Object: key, CreatedAt: time.Now().UTC()}
	ranges, digests := map[string]*TopicRange{}, map[string]*routing.Digest{}
	sorted := newSorter(a.p.Config.SortDir, a.p.Config.SortBytes)
	defer sorted.Close()
	err = a.scanTable(ctx, db, t, func(pg *page) (bool, error) { return true, sorted.Add(pg) })
	if err == nil {
		err = writeSorted(ctx, sorted, pw, &man, ranges, digests, func(rows int64) { a.m.rows.Add(float64(rows)) })
	}
	if err == nil {
		err = pw.Close()
	}
	if err == nil {
		err = bw.Close()
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("archive: export %s: %w", key, err)
	}
	man.Bytes, man.FileSHA256 = hw.n, hex.EncodeToString(hw.h.Sum(nil))
	man.Topics, man.Hash = topicRanges(ranges, digests)
	raw, err := json.MarshalIndent(man, "", " ")
	if err != nil {
		return Manifest{}, err
	}
	if err := bucket.WriteAll(ctx, manifestKey(tenant, t.Month()), raw, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
		return Manifest{}, fmt.Errorf("archive: write manifest: %w", err)
	}
	a.m.bytes.Add(float64(man.Bytes))
	return man, nil
}

// newWriter is the Parquet layout of SchemaVersion, writing to w.
func newWriter(w io.Writer) *parquet.GenericWriter[Row] {
	return parquet.NewGenericWriter[Row](w,
		parquet.Compression(&parquet.Zstd),
		parquet.MaxRowsPerRowGroup(rowGroupRows),
		parquet.BloomFilters(parquet.SplitBlockFilter(10, "topic")),
		parquet.SortingWriterConfig(parquet.SortingColumns(parquet.Ascending("topic"), parquet.Ascending("seqid"))),
	)
}

// topicRanges orders the topics, completes each one's range from its
// digest — the export writes exactly the rows it hashed, so the digest's
// seq range and row count are the topic's in the archive — and hashes
// their hashes into one.
func topicRanges(ranges map[string]*TopicRange, digests map[string]*routing.Digest) ([]TopicRange, string) {
	out := make([]TopicRange, 0, len(ranges))
	for topic, r := range ranges {
		d := digests[topic]
		r.MinSeq, r.MaxSeq, r.Count, r.Hash = d.Lo, d.Hi, d.N, d.Hex()
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	h := sha256.New()
	for _, r := range out {
		h.Write([]byte(r.Topic + "\x00" + r.Hash + "\n"))
	}
	return out, hex.EncodeToString(h.Sum(nil))
}

// readerAt reads an object by byte ranges (a Parquet reader asks for the
// footer, then the pages it needs).
type readerAt struct {
	ctx    context.Context
	bucket *blob.Bucket
	key    string
}

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	rr, err := r.bucket.NewRangeReader(r.ctx, r.key, off, int64(len(p)), nil)
	if err != nil {
		return 0, err
	}
	defer rr.Close()
	n, err := io.ReadFull(rr, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return n, err
}

// readRows reads the archive at key in batches, in its (topic, seqid)
// order, handing each batch to fn.
func readRows(ctx context.Context, bucket *blob.Bucket, key string, fn func([]Row) error) error {
	attrs, err := bucket.Attributes(ctx, key)
	if err != nil {
		return fmt.Errorf("archive: %s: %w", key, err)
	}
	f, err := parquet.OpenFile(readerAt{ctx: ctx, bucket: bucket, key: key}, attrs.Size)
	if err != nil {
		return fmt.Errorf("archive: open %s: %w", key, err)
	}
	pr := parquet.NewGenericReader[Row](f)
	defer pr.Close()
	rows := make([]Row, 512)
	for {
		n, err := pr.Read(rows)
		if n > 0 {
			if ferr := fn(rows[:n]); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("archive: read %s: %w", key, err)
		}
	}
}

// readDigests re-reads the archive and hashes it as the table is hashed.
func readDigests(ctx context.Context, bucket *blob.Bucket, key string) (map[string]*routing.Digest, error) {
	out := map[string]*routing.Digest{}
	var buf bytes.Buffer
	err := readRows(ctx, bucket, key, func(rows []Row) error {
		for i := range rows {
			sum, err := routing.RowSum(&buf, rows[i].values())
			if err != nil {
				return err
			}
			d := out[rows[i].Topic]
			if d == nil {
				d = &routing.Digest{}
				out[rows[i].Topic] = d
			}
			d.Add(rows[i].SeqID, sum)
		}
		return nil
	})
	return out, err
}

// verify compares the archive, read back from the bucket, with the table
// now: every topic's count, seq range and hash.
func (a *Archiver) verify(ctx context.Context, db *sql.DB, bucket *blob.Bucket, tenant string, t routing.Table) error {
	got, err := readDigests(ctx, bucket, ObjectKey(tenant, t.Month()))
	if err != nil {
		return err
	}
	want, err := a.tableDigests(ctx, db, t)
	if err != nil {
		return err
	}
	return compare(want, got)
}

// compare reports the topics whose table digests (want) and archive
// digests (got) differ, as ErrMismatch.
func compare(want, got map[string]*routing.Digest) error {
	var diffs []string
	for topic, w := range want {
		if g := got[topic]; g == nil || *g != *w {
			diffs = append(diffs, topic)
		}
	}
	for topic := range got {
		if want[topic] == nil {
			diffs = append(diffs, topic)
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("%w: %d topics differ (first %s)", ErrMismatch, len(diffs), diffs[0])
	}
	return nil
}
