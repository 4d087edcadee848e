package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// PersistParams configure `imshard bench persist`: the persist role beside
// the raw multi-row insert of the same rows (same batch size and writers,
// with the mirror upsert) in paired, alternating rounds, and once the same
// batches into a legacy single table that already holds LegacyRows rows
// (docs/performance.md).
type PersistParams struct {
	Rows, Batch, Writers, Topics int
	Pairs                        int // rounds; each runs both sides once, the first side alternating
	LegacyRows                   int // 0 = no legacy run
	Tenant                       string
	DB                           *sql.DB        // the tenant's database
	Redis                        rueidis.Client // INFO commandstats and cpu around each side
	PersistMonth, RawMonth       routing.Month
	Topic                        string    // a Kafka topic of the benchmark's own
	KafkaConn                    []kgo.Opt // how to reach the brokers
	// Persist runs the persist role, consuming Topic with Batch and
	// Writers, until ctx ends; onBatch sees every stored batch (its rows,
	// and how long it took from its dispatch).
	Persist  func(ctx context.Context, onBatch func(rows int, d time.Duration)) error
	Progress io.Writer
}

// Sides of the persist comparison.
const (
	SidePersist = "persist"
	SideRaw     = "raw insert"
)

// PersistResult is one measured run of a side.
type PersistResult struct {
	Name     string
	Rows     int
	Batches  int
	Elapsed  time.Duration
	P50, P99 time.Duration // per batch
	// what the run cost beside the rows, per batch or per row; the servers
	// are shared, so their counters include other clients (the raw side,
	// which sends nothing to Redis, shows how much)
	ProcCPUUS    float64 // this process's CPU µs per row (the in-process Kafka broker included)
	AllocsPerRow float64 // heap allocations per row in this process
	RedisCalls   float64 // Redis commands per batch (INFO commandstats, scripts' inner commands included)
	RedisCPUUS   float64 // Redis server CPU µs per row (INFO cpu)
	SQLCalls     float64 // MySQL statements per batch (Questions: queries and prepared executes)
	SQLPrepares  float64 // MySQL statement prepares per batch (Com_stmt_prepare)
	LockWaits    float64 // InnoDB row lock waits per batch
	LockWaitMS   float64 // InnoDB row lock wait ms per batch
}

// Rate is rows per second.
func (r PersistResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Rows) / r.Elapsed.Seconds()
}

// RowsPerBatch is the mean batch size.
func (r PersistResult) RowsPerBatch() float64 {
	if r.Batches == 0 {
		return 0
	}
	return float64(r.Rows) / float64(r.Batches)
}

// PersistReport holds the rounds (persist, raw insert in each) and the
// legacy run.
type PersistReport struct {
	Rounds        [][2]PersistResult
	Legacy        PersistResult // zero without a legacy run
	LegacyFixture int64         // rows in the legacy table before its run
}

// Median is the median of each figure of side i (0 persist, 1 raw insert)
// over the rounds.
func (r PersistReport) Median(i int) PersistResult {
	out := PersistResult{}
	if len(r.Rounds) == 0 {
		return out
	}
	out.Name = r.Rounds[0][i].Name
	col := func(f func(PersistResult) float64) float64 {
		v := make([]float64, len(r.Rounds))
		for k, round := range r.Rounds {
			v[k] = f(round[i])
		}
		return median(v)
	}
	dur := func(f func(PersistResult) time.Duration) time.Duration {
		return time.Duration(col(func(x PersistResult) float64 { return float64(f(x)) }))
	}
	out.Rows = r.Rounds[0][i].Rows
	out.Batches = int(col(func(x PersistResult) float64 { return float64(x.Batches) }))
	// the median rate as an elapsed time for the round's rows
	if rate := col(PersistResult.Rate); rate > 0 {
		out.Elapsed = time.Duration(float64(out.Rows) / rate * float64(time.Second))
	}
	out.P50 = dur(func(x PersistResult) time.Duration { return x.P50 })
	out.P99 = dur(func(x PersistResult) time.Duration { return x.P99 })
	out.ProcCPUUS = col(func(x PersistResult) float64 { return x.ProcCPUUS })
	out.AllocsPerRow = col(func(x PersistResult) float64 { return x.AllocsPerRow })
	out.RedisCalls = col(func(x PersistResult) float64 { return x.RedisCalls })
	out.RedisCPUUS = col(func(x PersistResult) float64 { return x.RedisCPUUS })
	out.SQLCalls = col(func(x PersistResult) float64 { return x.SQLCalls })
	out.SQLPrepares = col(func(x PersistResult) float64 { return x.SQLPrepares })
	out.LockWaits = col(func(x PersistResult) float64 { return x.LockWaits })
	out.LockWaitMS = col(func(x PersistResult) float64 { return x.LockWaitMS })
	return out
}

// Ratio is the median over the rounds of persist's rate divided by the raw
// insert's in the same round.
func (r PersistReport) Ratio() float64 {
	v := make([]float64, 0, len(r.Rounds))
	for _, round := range r.Rounds {
		if raw := round[1].Rate(); raw > 0 {
			v = append(v, round[0].Rate()/raw)
		}
	}
	return median(v)
}

// Persist runs the rounds, then the legacy run, in one process on the same
// services. Before every round both sides' month tables are emptied, so
// each round stores its rows into empty tables; the rounds' events are new
// (their seqs go on from the round before), so the Redis routes and the
// route mirror, which the tables' emptying leaves, only widen.
func Persist(ctx context.Context, p PersistParams) (PersistReport, error) {
	var rep PersistReport
	persistTable, err := routing.TableFor(p.PersistMonth)
	if err != nil {
		return rep, err
	}
	rawTable, err := routing.TableFor(p.RawMonth)
	if err != nil {
		return rep, err
	}
	pairs := max(p.Pairs, 1)
	perTopic := int64((p.Rows + p.Topics - 1) / p.Topics)
	for r := range pairs {
		seqBase := int64(r) * perTopic
		for _, t := range []routing.Table{persistTable, rawTable} {
			if _, err := p.DB.ExecContext(ctx, "TRUNCATE TABLE "+t.Quoted()); err != nil {
				return rep, fmt.Errorf("bench: empty %s: %w", t.Name(), err)
			}
		}
		evs := benchEvents(p.Tenant, p.Rows, p.Topics, p.PersistMonth, seqBase)
		if err := benchProduce(ctx, p.KafkaConn, p.Topic, evs); err != nil {
			return rep, err
		}
		raw := benchEvents(p.Tenant, p.Rows, p.Topics, p.RawMonth, seqBase)
		var round [2]PersistResult
		sides := []func() error{
			func() (err error) {
				round[0], err = p.measure(ctx, SidePersist, func() (PersistResult, error) { return benchPersist(ctx, p, len(evs)) })
				return err
			},
			func() (err error) {
				round[1], err = p.measure(ctx, SideRaw, func() (PersistResult, error) {
					return benchRaw(ctx, p, SideRaw, rawTable.Quoted(), p.RawMonth, raw)
				})
				return err
			},
		}
		// the first side alternates, so that load from elsewhere on a
		// shared machine and drift within a round fall on both sides alike
		for j := range sides {
			if err := sides[(r+j)%2](); err != nil {
				return rep, fmt.Errorf("round %d: %w", r+1, err)
			}
		}
		rep.Rounds = append(rep.Rounds, round)
		p.logf("round %d: persist %.0f/s (p50 %s, p99 %s), raw insert %.0f/s (p50 %s, p99 %s): %.2f", r+1,
			round[0].Rate(), round[0].P50.Round(time.Millisecond), round[0].P99.Round(time.Millisecond),
			round[1].Rate(), round[1].P50.Round(time.Millisecond), round[1].P99.Round(time.Millisecond),
			round[0].Rate()/round[1].Rate())
	}
	if p.LegacyRows <= 0 {
		return rep, nil
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

// mysqlCounters are the server status counters read around each side.
var mysqlCounters = []string{"Questions", "Com_stmt_prepare", "Innodb_row_lock_waits", "Innodb_row_lock_time"}

func (p *PersistParams) mysqlStatus(ctx context.Context) (map[string]float64, error) {
	rows, err := p.DB.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN (?, ?, ?, ?)",
		mysqlCounters[0], mysqlCounters[1], mysqlCounters[2], mysqlCounters[3])
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var name string
		var v float64
		if err := rows.Scan(&name, &v); err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, rows.Err()
}

// measure runs one side with this process's, Redis's and MySQL's counters
// around it.
func (p *PersistParams) measure(ctx context.Context, side string, run func() (PersistResult, error)) (PersistResult, error) {
	p.logf("%s: %d rows, %d writers, batch %d …", side, p.Rows, p.Writers, p.Batch)
	sql0, err := p.mysqlStatus(ctx)
	if err != nil {
		return PersistResult{}, err
	}
	var redis0 redisStats
	if p.Redis != nil {
		if redis0, err = readRedisStats(ctx, p.Redis); err != nil {
			return PersistResult{}, err
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := processCPU()
	res, err := run()
	if err != nil {
		return res, err
	}
	cpu1 := processCPU()
	runtime.ReadMemStats(&m1)
	sql1, err := p.mysqlStatus(ctx)
	if err != nil {
		return res, err
	}
	rows, batches := float64(max(res.Rows, 1)), float64(max(res.Batches, 1))
	res.ProcCPUUS = (cpu1 - cpu0).Seconds() * 1e6 / rows
	res.AllocsPerRow = float64(m1.Mallocs-m0.Mallocs) / rows
	res.SQLCalls = (sql1["Questions"] - sql0["Questions"]) / batches
	res.SQLPrepares = (sql1["Com_stmt_prepare"] - sql0["Com_stmt_prepare"]) / batches
	res.LockWaits = (sql1["Innodb_row_lock_waits"] - sql0["Innodb_row_lock_waits"]) / batches
	res.LockWaitMS = (sql1["Innodb_row_lock_time"] - sql0["Innodb_row_lock_time"]) / batches
	if p.Redis != nil {
		redis1, err := readRedisStats(ctx, p.Redis)
		if err != nil {
			return res, err
		}
		var calls float64
		for cmd, n := range redis1.calls {
			if cmd != "info" {
				calls += n - redis0.calls[cmd]
			}
		}
		res.RedisCalls = calls / batches
		res.RedisCPUUS = (redis1.cpu - redis0.cpu) * 1e6 / rows
	}
	return res, nil
}

func (p *PersistParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// benchEvents are rows messages spread round-robin over topics, their seqs
// above seqBase, with content of a typical chat size; their message ids
// (month, then a counter above seqBase × topics) are unique in the month.
func benchEvents(tenant string, rows, topics int, m routing.Month, seqBase int64) []message.Event {
	evs := make([]message.Event, rows)
	now := message.NewTime(time.Now())
	for i := range evs {
		topic := "b" + strconv.Itoa(i%topics)
		seq := seqBase + int64(i/topics+1)
		evs[i] = message.Event{
			V: message.EventVersion, EventID: fmt.Sprintf("%s-%d-%d", m, i%topics, seq), Tenant: tenant, Topic: topic,
			GroupID: message.ID(i%topics + 1), SeqID: seq, ShardMonth: m.String(),
			MessageID: message.ID(int64(m.Int())<<32 | (seqBase*int64(topics) + int64(i+1))), FromUser: message.ID(i%50 + 1),
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
	res := PersistResult{Name: SidePersist, Rows: n}
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
	res.Batches = len(lat)
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
				err := rawBatch(ctx, p.DB, quoted, m, b)
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
	res.Batches = len(lat)
	res.P50, res.P99 = percentiles(lat)
	if len(errs) > 0 {
		return res, fmt.Errorf("bench: %s: %w (and %d more)", name, errs[0], len(errs)-1)
	}
	return res, nil
}

// rawBatch stores evs into the table of the quoted name (a month table, or
// the legacy table of the same template) with the statements of persist's
// transaction, without the role around them — no dedup probe, no Redis
// follow-ups: in one transaction the multi-row insert and the mirror upsert
// for month m, its topics in order as persist locks them. The benchmark's
// events carry no head and no mentions: those columns stay NULL and the
// mention index untouched, as persist leaves them for such events.
func rawBatch(ctx context.Context, db *sql.DB, quoted string, m routing.Month, evs []message.Event) error {
	q := sq.Insert(quoted).Columns("message_id", "topic", "group_id", "seqid", "from_user", "client_msg_id", "msg_type",
		"content", "head", "mentioned_user_ids", "mention_all", "reply_seqid", "root_seqid", "content_size",
		"created_at", "updated_at")
	ranges := map[string]*routing.MirrorRow{}
	for _, e := range evs {
		at := e.CreatedAt.UTC()
		q = q.Values(int64(e.MessageID), e.Topic, int64(e.GroupID), e.SeqID, int64(e.FromUser), e.ClientMsgID, e.MsgType,
			string(e.Content), nil, nil, false, e.ReplySeqID, e.RootSeqID, len(e.Content), at, at)
		r := ranges[e.Topic]
		if r == nil {
			r = &routing.MirrorRow{Topic: e.Topic, MonthRange: routing.MonthRange{Month: m, MinSeq: e.SeqID, MaxSeq: e.SeqID},
				MinCreatedAt: at, MaxCreatedAt: at}
			ranges[e.Topic] = r
		}
		r.MinSeq, r.MaxSeq, r.Count = min(r.MinSeq, e.SeqID), max(r.MaxSeq, e.SeqID), r.Count+1
		if at.Before(r.MinCreatedAt) {
			r.MinCreatedAt = at
		}
		if at.After(r.MaxCreatedAt) {
			r.MaxCreatedAt = at
		}
	}
	mirror := make([]routing.MirrorRow, 0, len(ranges))
	for _, r := range ranges {
		mirror = append(mirror, *r)
	}
	slices.SortFunc(mirror, func(a, b routing.MirrorRow) int { return strings.Compare(a.Topic, b.Topic) })
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := q.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("bench: raw insert: %w", err)
	}
	if err := routing.WidenMirror(ctx, tx, mirror); err != nil {
		return err
	}
	return tx.Commit()
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
		seed := benchEvents(p.Tenant, min(20_000, p.LegacyRows), p.Topics, p.RawMonth.Add(-1), 0)
		for lo := 0; lo < len(seed); lo += 1000 {
			if err := rawBatch(ctx, p.DB, quoted, p.RawMonth.Add(-1), seed[lo:min(lo+1000, len(seed))]); err != nil {
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
