package bench

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Groups creates the groups and members the benchmark reads as (acl.Checker).
type Groups interface {
	PutGroup(ctx context.Context, tenant, topic string, groupID int64, name, status string) error
	PutMember(ctx context.Context, tenant, topic string, userID int64, role string, mutedUntil *time.Time) error
}

// QueryParams shape one `imshard bench query` run. The tenant must be the
// benchmark's own: its month tables get the fixture rows.
type QueryParams struct {
	// Page is the query role's `before` page (its message count); Reader
	// the read path under it, whose statement for one table is the raw
	// baseline (tablePage)
	Page   func(ctx context.Context, p httpapi.Principal, topic string, before int64, limit int) (int, error)
	Reader *readpath.Reader
	// Edit and Recall are the query role's changes (their change_seq)
	Edit     func(ctx context.Context, p httpapi.Principal, topic string, seq int64, content json.RawMessage, expectedVersion int) (int64, error)
	Recall   func(ctx context.Context, p httpapi.Principal, topic string, seq int64, reason string) (int64, error)
	Routes   *routing.Routes
	Groups   Groups
	Redis    rueidis.Client
	KeySpace routing.KeySpace
	DB       *sql.DB
	Tenant   string
	// Tables are the months of history, oldest first, ending with the
	// current month; pages are read in the last two.
	Tables      []routing.Table
	BaseURL     string // the query role's API
	Token       string // a member of every fixture topic
	Topics      int
	Rows        int
	Concurrency int
	Duration    time.Duration
	Warmup      time.Duration
	Only        []string // run only the runs whose name contains one of these (all when empty)
	// MonthsOnly builds the month tables without the legacy table's copy
	// of their rows (the move bench's fixture, which reads no legacy page)
	MonthsOnly bool
	Progress   io.Writer
}

// tablePage runs, through r, the statement a `before` page runs on one
// table (given by its quoted name: a month table, or the legacy table of
// the same template) for a caller who hid nothing: the newest limit
// messages of topic below before — the raw limit of a page.
func tablePage(ctx context.Context, r *readpath.Reader, db *sql.DB, quoted, topic string, before int64, limit int) ([]message.Message, error) {
	return sourcePage(ctx, r, db, "", readpath.Source{Table: quoted}, topic, before, limit)
}

// sourcePage is tablePage on one source of tenant's: a month table, read
// from its archive when its month is archived (src.Month set).
func sourcePage(ctx context.Context, r *readpath.Reader, db *sql.DB, tenant string, src readpath.Source, topic string, before int64, limit int) ([]message.Message, error) {
	src.Q = readpath.ListQuery{Topic: topic, Order: readpath.Desc, Bound: before, Limit: limit, HidNothing: true}
	return r.ReadSource(ctx, db, tenant, src)
}

// QueryResult is one measured run.
type QueryResult struct {
	Name     string
	Skipped  bool // not selected by QueryParams.Only
	Count    int
	Errors   int
	Elapsed  time.Duration
	P50, P99 time.Duration
}

// Rate is the completed operations per second.
func (r QueryResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Count) / r.Elapsed.Seconds()
}

// QueryReport holds every run of the read benchmark.
type QueryReport struct {
	OneMonth  QueryResult // service: a 50-page inside one month
	TwoMonths QueryResult // service: a 50-page spanning two months
	HotCache  QueryResult // service: the latest 50-page from the hot cache
	HotSolo   QueryResult // the same with one reader: the path's own latency, no queueing
	HTTP      QueryResult // the same pages as RawMonth, through HTTP
	RawMonth  QueryResult // raw SQL: the page's statement on its month table
	RawLegacy QueryResult // raw SQL: the same statement on the single 2M-row table
	Changes   ChangeReport
}

const benchUser int64 = 1

const (
	benchPage      = 50
	benchHotTopics = 100
	benchHotDepth  = 200
	benchBatch     = 1000
)

func benchTopic(i int) string { return fmt.Sprintf("bq%05d", i) }

func (p *QueryParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// span is the seqs of every topic in month table j: base+1 … base+n. A
// topic's Rows/Topics messages are spread evenly over the months, the
// remainder going to the newest ones, its seqs continuing across months.
func (p *QueryParams) span(j int) (base, n int64) {
	total, months := int64(p.Rows/p.Topics), int64(len(p.Tables))
	each, extra := total/months, total%months
	for i := range int64(j) {
		base += each
		if i >= months-extra {
			base++
		}
	}
	n = each
	if int64(j) >= months-extra {
		n++
	}
	return base, n
}

// last is the newest seq of every topic.
func (p *QueryParams) last() int64 {
	base, n := p.span(len(p.Tables) - 1)
	return base + n
}

// prev and cur are the two measured months: their table and seq span.
func (p *QueryParams) prev() (routing.Table, int64, int64) {
	j := len(p.Tables) - 2
	base, n := p.span(j)
	return p.Tables[j], base, n
}

func (p *QueryParams) cur() (routing.Table, int64, int64) {
	j := len(p.Tables) - 1
	base, n := p.span(j)
	return p.Tables[j], base, n
}

// Fixtures reports whether complete fixture rows are already in place (a
// previous run kept them), and whether anything of them is (a dirty start).
func (p *QueryParams) Fixtures(ctx context.Context) (complete, dirty bool) {
	type want struct {
		table string
		rows  int64
	}
	wants := []want{{"`" + routing.LegacyTable + "`", p.last() * int64(p.Topics)}}
	for j, t := range p.Tables {
		_, n := p.span(j)
		wants = append(wants, want{t.Quoted(), n * int64(p.Topics)})
	}
	complete = true
	for _, c := range wants {
		var n int64
		if err := sq.Select("COUNT(*)").From(c.table).RunWith(p.DB).QueryRowContext(ctx).Scan(&n); err != nil {
			complete = false // the legacy table does not exist yet
			continue
		}
		complete = complete && n == c.rows
		dirty = dirty || n > 0
	}
	return complete, dirty
}

// Check rejects a shape whose months are too small for the measured pages.
func (p *QueryParams) Check() error {
	if len(p.Tables) < 2 {
		return fmt.Errorf("bench: %d months of history; need at least 2", len(p.Tables))
	}
	if _, n := p.span(0); n < 2*benchPage {
		return fmt.Errorf("bench: %d rows over %d topics and %d months leaves %d per topic and month; need at least %d",
			p.Rows, p.Topics, len(p.Tables), n, 2*benchPage)
	}
	return nil
}

// Build writes the fixture: Topics topics of Rows/Topics messages each,
// spread over the months of Tables as a year of history is, ids and times
// growing with seq across all topics (as real traffic interleaves them);
// the same rows in the legacy single table (unless MonthsOnly); the mirror, Redis routes,
// groups with a member, and the hot cache of the first topics. Rows are
// made by doubling (INSERT … SELECT of the table onto itself with seq
// shifted), not one by one.
func (p *QueryParams) Build(ctx context.Context) error {
	if err := p.Check(); err != nil {
		return err
	}
	start := time.Now()
	for j, t := range p.Tables {
		base, n := p.span(j)
		if err := fillMonth(ctx, p.DB, t, p.Topics, base, n); err != nil {
			return err
		}
		p.logf("bench: %s filled (%d rows, %s)", t.Name(), n*int64(p.Topics), time.Since(start).Round(time.Second))
	}
	if !p.MonthsOnly {
		if err := p.buildLegacy(ctx, start); err != nil {
			return err
		}
	}
	for _, t := range p.Tables {
		if err := routing.Fenced(ctx, p.DB, func(tx *sql.Tx) error { return routing.MirrorFromTable(ctx, tx, t) }); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	ranges := make([]routing.MonthRange, len(p.Tables))
	for j, t := range p.Tables {
		base, n := p.span(j)
		ranges[j] = routing.MonthRange{Month: t.Month(), MinSeq: base + 1, MaxSeq: base + n, Count: n}
	}
	for i := range p.Topics {
		topic := benchTopic(i)
		if err := p.Routes.Replace(ctx, p.Tenant, topic, ranges); err != nil {
			return err
		}
		if err := p.Groups.PutGroup(ctx, p.Tenant, topic, int64(i+1), topic, "active"); err != nil {
			return err
		}
		if err := p.Groups.PutMember(ctx, p.Tenant, topic, benchUser, "member", nil); err != nil {
			return err
		}
	}
	p.logf("bench: mirror, routes and groups written (%s)", time.Since(start).Round(time.Second))
	return p.fillHotCache(ctx)
}

// buildLegacy copies the month tables' rows into the legacy single table.
func (p *QueryParams) buildLegacy(ctx context.Context, start time.Time) error {
	if _, err := p.DB.ExecContext(ctx, routing.LegacyDDL()); err != nil {
		return fmt.Errorf("bench: create legacy table: %w", err)
	}
	for _, t := range p.Tables {
		if _, err := sq.Insert("`" + routing.LegacyTable + "`").Select(sq.Select("*").From(t.Quoted()).OrderBy("message_id")).
			RunWith(p.DB).ExecContext(ctx); err != nil {
			return fmt.Errorf("bench: legacy copy of %s: %w", t.Name(), err)
		}
		p.logf("bench: legacy table has %s's rows (%s)", t.Name(), time.Since(start).Round(time.Second))
	}
	return nil
}

// fillMonth writes seqs base+1 … base+n of each of topics topics
// (benchTopic) into t: seq base+1 of each topic by multi-row inserts, then
// doublings. Their times spread over the month up to now at most: the
// current month's rows all lie in the past, as real traffic's do, so that a
// send made during the bench takes ids above every fixture row (a move's
// last chunk, not one in the middle of its key range).
func fillMonth(ctx context.Context, db *sql.DB, t routing.Table, topics int, base, n int64) error {
	m := t.Month()
	span := max(min(m.End().Sub(m.Start()), time.Since(m.Start()))-time.Minute, time.Minute)
	stepUs := span.Microseconds() / (n * int64(topics))
	startUs := m.Start().UnixMicro()
	// created_at and message_id of (topic i = group_id-1, k-th seq of the
	// month): time grows with k across all topics; the id is a snowflake of
	// that time with the topic as node bits and the seq as sequence bits
	createdUs := func(k, gid string) string {
		return fmt.Sprintf("(%d + ((%s) * %d + (%s) - 1) * %d)", startUs, k, topics, gid, stepUs)
	}
	cols := []string{"message_id", "topic", "group_id", "seqid", "from_user", "client_msg_id", "msg_type", "status",
		"content", "version", "created_at", "updated_at"}
	ins := sq.Insert(t.Quoted()).Columns(cols...)
	for i := range topics {
		us := startUs + int64(i)*stepUs
		at := time.UnixMicro(us).UTC()
		seq := base + 1
		ins = ins.Values(at.UnixMilli()<<22|int64(i&0x3ff)<<12|seq&0xfff, benchTopic(i), i+1, seq, benchUser,
			"b"+strconv.FormatInt(seq, 10), "text", "normal", fmt.Sprintf(`{"text":"bench message %d"}`, seq), 1, at, at)
		if (i+1)%benchBatch == 0 || i == topics-1 {
			if _, err := ins.RunWith(db).ExecContext(ctx); err != nil {
				return fmt.Errorf("bench: seed %s: %w", t.Name(), err)
			}
			ins = sq.Insert(t.Quoted()).Columns(cols...)
		}
	}
	for have := int64(1); have < n; have *= 2 {
		shift := strconv.FormatInt(have, 10)
		k := "seqid - " + strconv.FormatInt(base, 10) + " - 1 + " + shift
		created := createdUs(k, "group_id")
		sel := sq.Select(
			"((FLOOR("+created+" / 1000)) << 22) | (((group_id - 1) & 1023) << 12) | ((seqid + "+shift+") & 4095)",
			"topic", "group_id", "seqid + "+shift, "from_user", "CONCAT('b', seqid + "+shift+")", "msg_type", "status",
			"JSON_OBJECT('text', CONCAT('bench message ', seqid + "+shift+"))", "version",
			"FROM_UNIXTIME("+created+" / 1000000)", "FROM_UNIXTIME("+created+" / 1000000)").
			From(t.Quoted()).Where(sq.LtOrEq{"seqid": base + n - have})
		if _, err := sq.Insert(t.Quoted()).Columns(cols...).Select(sel).RunWith(db).ExecContext(ctx); err != nil {
			return fmt.Errorf("bench: double %s: %w", t.Name(), err)
		}
	}
	return nil
}

// Load is the fixture as a MoveTenant of the move bench: it sends to the
// hot topics, whose seq counters the fixture set, and reads pages of every
// topic.
func (p *QueryParams) Load(token string) MoveTenant {
	t := MoveTenant{Tenant: p.Tenant, Token: token, Last: p.last()}
	for i := range p.Topics {
		t.ReadTopics = append(t.ReadTopics, benchTopic(i))
	}
	t.SendTopics = t.ReadTopics[:min(benchHotTopics, p.Topics)]
	return t
}

// fillHotCache puts the newest messages of the first topics in the hot
// cache as send does, read back from MySQL.
func (p *QueryParams) fillHotCache(ctx context.Context) error {
	keys, err := p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return err
	}
	last := p.last()
	cur, _, _ := p.cur()
	for i := range min(benchHotTopics, p.Topics) {
		topic := benchTopic(i)
		ms, err := tablePage(ctx, p.Reader, p.DB, cur.Quoted(), topic, last+1, benchHotDepth)
		if err != nil {
			return err
		}
		for _, r := range p.Redis.DoMulti(ctx, HotFill(p.Redis, keys, topic, ms, last)...) {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return err
			}
		}
	}
	return nil
}

// HotFill is what the send path leaves in Redis for a topic's messages ms
// (stored rows read back), last being the topic's last issued seq: the
// messages in its hot cache, the seq counter and the topic's versions
// (SentVersions).
func HotFill(rdb rueidis.Client, keys routing.Keys, topic string, ms []message.Message, last int64) []rueidis.Completed {
	cmds := append(SentVersions(rdb, keys, topic, time.Now()),
		rdb.B().Set().Key(keys.Seq(topic)).Value(strconv.FormatInt(last, 10)).Build())
	if len(ms) == 0 {
		return cmds
	}
	cmd := rdb.B().Zadd().Key(keys.HotMessages(topic)).ScoreMember()
	for _, m := range ms {
		raw, _ := json.Marshal(m)
		cmd = cmd.ScoreMember(float64(m.Seq), string(raw))
	}
	return append(cmds, cmd.Build())
}

// SentVersions are the versions a send gives a topic that holds none
// (lua/fenced.lua, send): its message version, which lives
// routing.MessagesVersionTTL, and its deletion-range version, each at
// least the time in microseconds as next_version makes them. A query
// process keeps a copy of a topic's newest messages, and remembers unread
// counts, only under versions Redis holds: a fixture without them measures
// every page parsing the whole hot cache, which no sent topic does.
func SentVersions(rdb rueidis.Client, keys routing.Keys, topic string, now time.Time) []rueidis.Completed {
	v := strconv.FormatInt(now.UnixMicro(), 10)
	return []rueidis.Completed{
		rdb.B().Set().Key(keys.MessagesVersion(topic)).Value(v).Nx().PxMilliseconds(routing.MessagesVersionTTL.Milliseconds()).Build(),
		rdb.B().Set().Key(keys.HiddenVersion(topic)).Value(v).Nx().Build(),
	}
}

// versionHot gives the hot topics the versions a send would have left
// (SentVersions) where they are gone: a kept fixture outlives its message
// versions' TTL.
func (p *QueryParams) versionHot(ctx context.Context) error {
	keys, err := p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return err
	}
	var cmds []rueidis.Completed
	now := time.Now()
	for i := range min(benchHotTopics, p.Topics) {
		cmds = append(cmds, SentVersions(p.Redis, keys, benchTopic(i), now)...)
	}
	for _, r := range p.Redis.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return err
		}
	}
	return nil
}

// run drives op from readers goroutines for Warmup, then measures it for
// Duration.
func (p *QueryParams) run(ctx context.Context, name string, readers int, op func(ctx context.Context, rng *rand.Rand) error) QueryResult {
	return p.runStaged(ctx, name, readers, func(_ context.Context, rng *rand.Rand) (func(context.Context) error, error) {
		return func(ctx context.Context) error { return op(ctx, rng) }, nil
	})
}

// runStaged is run for operations with an untimed first stage: stage does
// it and returns the timed rest.
func (p *QueryParams) runStaged(ctx context.Context, name string, readers int, stage func(ctx context.Context, rng *rand.Rand) (func(context.Context) error, error)) QueryResult {
	if len(p.Only) > 0 && !slices.ContainsFunc(p.Only, func(o string) bool { return strings.Contains(name, o) }) {
		return QueryResult{Name: name, Skipped: true}
	}
	p.logf("bench: %s …", name)
	var (
		mu        sync.Mutex
		latencies []time.Duration
		errs      int
		firstErr  error
	)
	warmEnd := time.Now().Add(p.Warmup)
	end := warmEnd.Add(p.Duration)
	var wg sync.WaitGroup
	for w := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var mine []time.Duration
			bad := 0
			var ferr error
			for ctx.Err() == nil {
				timed, err := stage(ctx, rng)
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				if err == nil {
					err = timed(ctx)
				}
				if t0.Before(warmEnd) {
					continue
				}
				if err != nil {
					bad++
					if ferr == nil {
						ferr = err
					}
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			errs += bad
			if firstErr == nil {
				firstErr = ferr
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		p.logf("bench: %s: %d errors, first: %v", name, errs, firstErr)
	}
	r := QueryResult{Name: name, Count: len(latencies), Errors: errs, Elapsed: p.Duration}
	r.P50, r.P99 = percentiles(latencies)
	return r
}

// checkPage fails a page read that failed or was not a full page.
func checkPage(got int, err error) error {
	if err != nil {
		return err
	}
	if got != benchPage {
		return fmt.Errorf("page of %d messages, want %d", got, benchPage)
	}
	return nil
}

// Measure runs every read of the report on the fixture.
func (p *QueryParams) Measure(ctx context.Context) (QueryReport, error) {
	var rep QueryReport
	if err := p.versionHot(ctx); err != nil {
		return rep, err
	}
	prev, prevBase, prevN := p.prev()
	cur, curBase, curN := p.cur()
	me := httpapi.Principal{Tenant: p.Tenant, UserID: benchUser}
	topic := func(rng *rand.Rand) string { return benchTopic(rng.IntN(p.Topics)) }
	// a before cursor whose 50-page stays inside month base+1 … base+n
	within := func(rng *rand.Rand, base, n int64) int64 { return base + 1 + benchPage + rng.Int64N(n-benchPage+1) }
	inOne := func(rng *rand.Rand) int64 { return within(rng, curBase, curN) }
	// one whose page starts in the current month and ends in the previous
	inTwo := func(rng *rand.Rand) int64 { return curBase + 2 + rng.Int64N(benchPage-2) }
	// a random position in the last two months whose page stays in one
	// month, and that month's table
	anywhere := func(rng *rand.Rand) (int64, routing.Table) {
		if rng.IntN(2) == 0 {
			return inOne(rng), cur
		}
		return within(rng, prevBase, prevN), prev
	}
	rep.OneMonth = p.run(ctx, "service page, one month", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		return checkPage(p.Page(ctx, me, topic(rng), inOne(rng), benchPage))
	})
	rep.TwoMonths = p.run(ctx, "service page, two months", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		return checkPage(p.Page(ctx, me, topic(rng), inTwo(rng), benchPage))
	})
	hot := func(ctx context.Context, rng *rand.Rand) error {
		return checkPage(p.Page(ctx, me, benchTopic(rng.IntN(min(benchHotTopics, p.Topics))), 0, benchPage))
	}
	rep.HotCache = p.run(ctx, "service page, hot cache", p.Concurrency, hot)
	rep.HotSolo = p.run(ctx, "service page, hot cache, 1 reader", 1, hot)
	raw := func(legacy bool) func(ctx context.Context, rng *rand.Rand) error {
		return func(ctx context.Context, rng *rand.Rand) error {
			before, t := anywhere(rng)
			table := t.Quoted()
			if legacy {
				table = "`" + routing.LegacyTable + "`"
			}
			// the statement the service runs for this caller, who hid nothing
			ms, err := tablePage(ctx, p.Reader, p.DB, table, topic(rng), before, benchPage)
			return checkPage(len(ms), err)
		}
	}
	rep.RawMonth = p.run(ctx, "raw SQL page, month table", p.Concurrency, raw(false))
	rep.RawLegacy = p.run(ctx, "raw SQL page, single legacy table", p.Concurrency, raw(true))
	// response buffers are reused: the client shares the server's two cores
	bodies := sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 32<<10)) }}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * p.Concurrency, MaxConnsPerHost: 2 * p.Concurrency}}
	defer client.CloseIdleConnections()
	rep.HTTP = p.run(ctx, "HTTP page", p.Concurrency, func(ctx context.Context, rng *rand.Rand) error {
		before, _ := anywhere(rng)
		url := p.BaseURL + "/v1/topics/" + topic(rng) + "/messages?limit=50&before=" + strconv.FormatInt(before, 10)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+p.Token)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		buf := bodies.Get().(*bytes.Buffer)
		defer bodies.Put(buf)
		buf.Reset()
		if _, err := buf.ReadFrom(resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		// counting is enough to check the page; decoding it would bill the
		// client's JSON work to the server under test
		return checkPage(bytes.Count(buf.Bytes(), []byte(`"seq":`)), nil)
	})
	return rep, ctx.Err()
}
