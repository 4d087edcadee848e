package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// PersistParams configure `imshard bench persist`: the persist role against
// the raw multi-row insert of the same rows (same batch size and writers,
// with the mirror upsert), and the same batches into a legacy single table
// that already holds LegacyRows rows (docs/performance.md).
type PersistParams struct {
	Rows, Batch, Writers, Topics int
	LegacyRows                   int
	Tenant                       string
	DB                           *sql.DB // the tenant's database
	PersistMonth, RawMonth       routing.Month
	Topic                        string    // a Kafka topic of the benchmark's own
	KafkaConn                    []kgo.Opt // how to reach the brokers
	// Persist runs the persist role, consuming Topic with Batch and
	// Writers, until ctx ends; onBatch sees every stored batch (its rows,
	// and how long it took from its dispatch).
	Persist func(ctx context.Context, onBatch func(rows int, d time.Duration)) error
	// RawBatch stores evs into the table of the quoted name with persist's
	// own statements, without the role around them: in one transaction the
	// multi-row insert and the mirror upsert for month m.
	RawBatch func(ctx context.Context, db *sql.DB, quoted string, m routing.Month, evs []message.Event) error
	Progress io.Writer
}

// PersistResult is one measured run.
type PersistResult struct {
	Name     string
	Rows     int
	Elapsed  time.Duration
	P50, P99 time.Duration // per batch
}

// Rate is rows per second.
func (r PersistResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Rows) / r.Elapsed.Seconds()
}

// PersistReport holds the three runs.
type PersistReport struct {
	Persist, Raw, Legacy PersistResult
	LegacyFixture        int64 // rows in the legacy table before its run
}

// Persist runs the three measurements in one process on the same services.
func Persist(ctx context.Context, p PersistParams) (PersistReport, error) {
	var rep PersistReport
	evs := benchEvents(p.Tenant, p.Rows, p.Topics, p.PersistMonth, 0)
	p.logf("producing %d events to %s …", len(evs), p.Topic)
	if err := benchProduce(ctx, p.KafkaConn, p.Topic, evs); err != nil {
		return rep, err
	}
	p.logf("persist: %d writers, batch %d …", p.Writers, p.Batch)
	var err error
	if rep.Persist, err = benchPersist(ctx, p, len(evs)); err != nil {
		return rep, err
	}

	rawTable, err := routing.TableFor(p.RawMonth)
	if err != nil {
		return rep, err
	}
	p.logf("raw insert + mirror upsert into %s …", rawTable.Name())
	raw := benchEvents(p.Tenant, p.Rows, p.Topics, p.RawMonth, 0)
	if rep.Raw, err = benchRaw(ctx, p, "raw insert", rawTable.Quoted(), p.RawMonth, raw); err != nil {
		return rep, err
	}

	p.logf("legacy fixture: %d rows in %s …", p.LegacyRows, routing.LegacyTable)
	var history int64
	if rep.LegacyFixture, history, err = benchLegacyFixture(ctx, p); err != nil {
		return rep, err
	}
	// the same topics go on where their history in the legacy table ends
	legacy := benchEvents(p.Tenant, p.Rows, p.Topics, p.RawMonth.Next(), history)
	p.logf("same batches into %s …", routing.LegacyTable)
	rep.Legacy, err = benchRaw(ctx, p, "legacy table", "`"+routing.LegacyTable+"`", p.RawMonth.Next(), legacy)
	return rep, err
}

func (p *PersistParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// benchEvents are rows messages spread round-robin over topics, their seqs
// above seqBase, with content of a typical chat size.
func benchEvents(tenant string, rows, topics int, m routing.Month, seqBase int64) []message.Event {
	evs := make([]message.Event, rows)
	now := message.NewTime(time.Now())
	for i := range evs {
		topic := "b" + strconv.Itoa(i%topics)
		seq := seqBase + int64(i/topics+1)
		evs[i] = message.Event{
			V: message.EventVersion, EventID: fmt.Sprintf("%s-%d-%d", m, i%topics, seq), Tenant: tenant, Topic: topic,
			GroupID: message.ID(i%topics + 1), SeqID: seq, ShardMonth: m.String(),
			MessageID: message.ID(int64(m.Int())<<32 | seqBase<<20 | int64(i+1)), FromUser: message.ID(i%50 + 1),
			ClientMsgID: "c" + strconv.FormatInt(seq, 10), MsgType: "text",
			Content:   json.RawMessage(`{"text":"benchmark message number ` + strconv.Itoa(i) + `, about as long as a chat line"}`),
			CreatedAt: now,
		}
	}
	return evs
}

func benchProduce(ctx context.Context, conn []kgo.Opt, topic string, evs []message.Event) error {
	cl, err := kgo.NewClient(append(slices.Clone(conn), kgo.ProducerBatchMaxBytes(1<<20))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	const chunk = 5000
	for lo := 0; lo < len(evs); lo += chunk {
		hi := min(lo+chunk, len(evs))
		recs := make([]*kgo.Record, 0, hi-lo)
		for i := lo; i < hi; i++ {
			v, err := json.Marshal(&evs[i])
			if err != nil {
				return err
			}
			recs = append(recs, &kgo.Record{Topic: topic, Key: evs[i].Key(), Value: v})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("bench: produce: %w", err)
		}
	}
	return nil
}

// benchPersist runs the real persist Service until it has committed n rows;
// the clock runs from its first batch's dispatch until its last batch is done, so the
// consumer-group join is not billed; a batch counts once its Redis
// follow-ups are done too.
func benchPersist(ctx context.Context, p PersistParams, n int) (PersistResult, error) {
	res := PersistResult{Name: "persist", Rows: n}
	var (
		mu        sync.Mutex
		lat       []time.Duration
		first     time.Time
		last      time.Time
		committed atomic.Int64
		done      = make(chan struct{})
	)
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() {
		stopped <- p.Persist(runCtx, func(k int, d time.Duration) {
			now := time.Now()
			mu.Lock()
			lat = append(lat, d)
			if first.IsZero() || now.Add(-d).Before(first) {
				first = now.Add(-d)
			}
			last = now
			mu.Unlock()
			if committed.Add(int64(k)) == int64(n) {
				close(done)
			}
		})
	}()
	select {
	case <-done:
	case err := <-stopped:
		cancel()
		if err == nil {
			err = errors.New("bench: persist stopped early")
		}
		return res, err
	case <-ctx.Done():
	}
	cancel()
	if err := <-stopped; err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	mu.Lock()
	defer mu.Unlock()
	res.Elapsed = last.Sub(first)
	res.P50, res.P99 = percentiles(lat)
	return res, nil
}

// benchRaw stores evs in batches of p.Batch with p.Writers goroutines,
// one transaction per batch: the multi-row insert plus the mirror upsert.
func benchRaw(ctx context.Context, p PersistParams, name, quoted string, m routing.Month, evs []message.Event) (PersistResult, error) {
	res := PersistResult{Name: name, Rows: len(evs)}
	batches := make(chan []message.Event)
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for w := 0; w < p.Writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				t0 := time.Now()
				err := p.RawBatch(ctx, p.DB, quoted, m, b)
				mu.Lock()
				lat = append(lat, time.Since(t0))
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	for lo := 0; lo < len(evs); lo += p.Batch {
		batches <- evs[lo:min(lo+p.Batch, len(evs))]
	}
	close(batches)
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.P50, res.P99 = percentiles(lat)
	if len(errs) > 0 {
		return res, fmt.Errorf("bench: %s: %w (and %d more)", name, errs[0], len(errs)-1)
	}
	return res, nil
}

// benchLegacyFixture creates the legacy table and fills it to p.LegacyRows
// rows of history of the benchmark's own topics, as a legacy table holds it:
// one multi-row seed, then INSERT … SELECT doubling (each copy continues
// every topic's seqs above the current maximum), so 2M rows take minutes,
// not an hour. It returns the rows and the highest seq.
func benchLegacyFixture(ctx context.Context, p PersistParams) (rows, maxSeq int64, err error) {
	if _, err := p.DB.ExecContext(ctx, routing.LegacyDDL()); err != nil {
		return 0, 0, fmt.Errorf("bench: create legacy table: %w", err)
	}
	quoted := "`" + routing.LegacyTable + "`"
	count := func() error {
		return sq.Select("COUNT(*)", "COALESCE(MAX(seqid), 0)").From(quoted).RunWith(p.DB).QueryRowContext(ctx).
			Scan(&rows, &maxSeq)
	}
	if err := count(); err != nil {
		return 0, 0, err
	}
	if rows == 0 {
		seed := benchEvents(p.Tenant, min(20_000, max(p.LegacyRows, 1)), p.Topics, p.RawMonth.Add(-1), 0)
		for lo := 0; lo < len(seed); lo += 1000 {
			if err := p.RawBatch(ctx, p.DB, quoted, p.RawMonth.Add(-1), seed[lo:min(lo+1000, len(seed))]); err != nil {
				return 0, 0, fmt.Errorf("bench: legacy seed: %w", err)
			}
		}
		if err := count(); err != nil {
			return 0, 0, err
		}
	}
	cols := []string{"message_id", "topic", "group_id", "seqid", "from_user", "client_msg_id", "msg_type", "content",
		"created_at", "updated_at"}
	for rows < int64(p.LegacyRows) {
		take := min(rows, int64(p.LegacyRows)-rows)
		var maxID int64
		if err := sq.Select("MAX(message_id)").From(quoted).RunWith(p.DB).QueryRowContext(ctx).Scan(&maxID); err != nil {
			return 0, 0, err
		}
		// the copies get ids and seqs above every existing one: no key clashes
		sel := sq.Select().Column("message_id + ?", maxID).Column("topic").Column("group_id").
			Column("seqid + ?", maxSeq).Column("from_user").Column("CONCAT(client_msg_id, '-', ?)", rows).
			Column("msg_type").Column("content").Column("created_at").Column("updated_at").
			From(quoted).OrderBy("message_id").Limit(uint64(take))
		if _, err := sq.Insert(quoted).Columns(cols...).Select(sel).RunWith(p.DB).ExecContext(ctx); err != nil {
			return 0, 0, fmt.Errorf("bench: legacy doubling: %w", err)
		}
		if err := count(); err != nil {
			return 0, 0, err
		}
		p.logf("  legacy fixture: %d rows", rows)
	}
	return rows, maxSeq, nil
}
