// Package retention removes history past retention: a month whose every
// topic is past it goes whole (its table dropped, with its mirror rows,
// route fields, revisions, hidden ranges and mention rows), a topic whose
// own retention is shorter loses its rows of a month that stays, in short
// batches. Before anything is removed each topic's retention floor is
// raised, so readers stop at it (modules/readpath).
package retention

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Params wires a Retention.
type Params struct {
	DBs      routing.DBs
	Redis    rueidis.Client
	KeySpace routing.KeySpace
	Scripts  *routing.Scripts
	Catalog  *routing.Catalog
	// Months is a tenant's retention_months (0: keep forever).
	Months  func(tenant string) int
	LockTTL time.Duration
	// Erase deletes a batch of messages for everyone (a user erase).
	Erase Eraser
	// DropArchive removes month m's archive, if it has one: its objects,
	// its overlay and its record (a month dropped whole).
	DropArchive func(ctx context.Context, tenant string, m routing.Month) error
	// ArchivedSentBy lists what a user sent in an archived month, in
	// (topic, seq) order, as its archive holds them (a user erase).
	ArchivedSentBy func(ctx context.Context, tenant string, m routing.Month, user int64) ([]routing.ArchivedRow, error)
	Log            zerolog.Logger
	Registerer     prometheus.Registerer
}

// Retention plans and runs the removal of what is past retention.
type Retention struct {
	p     Params
	m     *metrics
	clock routing.Clock
	// wake tells this process's job loop that a job was queued or resumed
	// here (woken); poll is how often it looks for jobs all the same: for
	// those queued by another process, or taken over from a runner that died
	wake chan struct{}
	poll time.Duration
}

// New builds a Retention.
func New(p Params) *Retention {
	if p.LockTTL <= 0 {
		p.LockTTL = 30 * time.Second
	}
	return &Retention{p: p, m: newMetrics(p.Registerer), clock: routing.NewClock(p.Redis), wake: make(chan struct{}, 1), poll: jobPoll}
}

// batch bounds the rows of one delete statement: each is its own short
// transaction, so no lock is held long enough to delay a send.
const batch = 1000

// Plan is what a run would remove from tenant now; it removes nothing.
func (r *Retention) Plan(ctx context.Context, tenant string) (Plan, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Plan{}, err
	}
	return r.plan(ctx, tenant, db)
}

func (r *Retention) plan(ctx context.Context, tenant string, db *sql.DB) (Plan, error) {
	now, err := r.clock.Month(ctx)
	if err != nil {
		return Plan{}, err
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return Plan{}, err
	}
	override, err := acl.GroupRetentions(ctx, db)
	if err != nil {
		return Plan{}, err
	}
	tenantMonths := r.p.Months(tenant)
	// the shortest retention that applies anywhere: only a month it
	// expires is read (none at all when everything is kept forever)
	shortest := tenantMonths
	for _, n := range override {
		if n > 0 && (shortest == 0 || n < shortest) {
			shortest = n
		}
	}
	users, err := heldUsers(ctx, db)
	if err != nil {
		return Plan{}, err
	}
	var months []MonthState
	for _, s := range shards {
		if s.Status != routing.StatusExpiring && !Expired(s.Month, now, shortest) {
			continue
		}
		rows, err := routing.MirrorMonthRows(ctx, db, s.Month)
		if err != nil {
			return Plan{}, err
		}
		ms := MonthState{Shard: s, Topics: rows}
		// only a sealed or archived month is removed: its held users'
		// messages are read from its table or its archive
		if s.Status == routing.StatusSealed || s.Status == routing.StatusArchived {
			if ms.Held, err = r.heldInMonth(ctx, db, tenant, s.Month, s.Status == routing.StatusArchived, topicsOf(rows), users); err != nil {
				return Plan{}, err
			}
		}
		months = append(months, ms)
	}
	return Decide(tenant, now, tenantMonths, override, months), nil
}

// Report is what a run removed: its plan, then what each step did.
type Report struct {
	Plan        Plan  `json:"plan"`
	RowsDropped int64 `json:"rows_dropped"` // in the months dropped whole
	RowsTrimmed int64 `json:"rows_trimmed"` // deleted from months that stay
	Months      int   `json:"months_dropped"`
	// HeldSincePlan: what a hold stored after the plan was made kept.
	HeldSincePlan []Held `json:"held_since_plan"`
	Error         string `json:"error,omitempty"`
}

// Apply runs retention for tenant (the shard manager's patrol).
func (r *Retention) Apply(ctx context.Context, tenant string) error {
	_, err := r.Run(ctx, tenant)
	return err
}

// Run plans and removes, under the tenant's shard lock (no month changes
// status meanwhile): first every drop, oldest month first, then every
// trim. A run that stops half-way is finished by the next one (a month
// being dropped is marked expiring before anything of it goes).
func (r *Retention) Run(ctx context.Context, tenant string) (rep Report, err error) {
	defer func() {
		if err != nil {
			rep.Error = err.Error()
			r.m.runs.WithLabelValues(tenant, "failed").Inc()
			return
		}
		r.m.runs.WithLabelValues(tenant, "ok").Inc()
		r.m.lastSuccess.WithLabelValues(tenant).SetToCurrentTime()
	}()
	keys, err := r.p.KeySpace.Tenant(tenant)
	if err != nil {
		return rep, err
	}
	lock, err := routing.AcquireLock(ctx, r.p.Redis, r.p.Scripts, keys.ShardLock(), r.p.LockTTL, 2*r.p.LockTTL)
	if err != nil {
		return rep, err
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	defer r.p.Catalog.Invalidate(tenant)
	held, stop := lock.Keep(ctx)
	defer stop()
	defer func() {
		if cause := context.Cause(held); errors.Is(cause, routing.ErrLockLost) {
			err = errors.Join(cause, err)
		}
	}()
	ctx = held
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return rep, err
	}
	if rep.Plan, err = r.plan(ctx, tenant, db); err != nil {
		return rep, err
	}
	behind := len(rep.Plan.Skipped)
	defer func() { r.m.behind.WithLabelValues(tenant).Set(float64(behind)) }()
	rep.HeldSincePlan = []Held{}
	for _, d := range rep.Plan.Drops {
		if !d.Resumed {
			held, err := r.heldSincePlan(ctx, db, tenant, d.month, d.Archived, nil)
			if err != nil {
				return rep, err
			}
			if len(held) > 0 {
				rep.HeldSincePlan = append(rep.HeldSincePlan, held...)
				behind++
				continue
			}
		}
		start := time.Now()
		if err := r.dropMonth(ctx, tenant, db, keys, d.month); err != nil {
			behind += len(rep.Plan.Drops) - rep.Months
			return rep, err
		}
		r.m.dropDuration.Observe(time.Since(start).Seconds())
		r.m.monthsDropped.WithLabelValues(tenant).Inc()
		r.m.rowsRemoved.WithLabelValues(tenant, "drop").Add(float64(d.Rows))
		rep.Months++
		rep.RowsDropped += d.Rows
		r.p.Log.Info().Str("tenant", tenant).Str("month", d.Month).Int64("rows", d.Rows).Dur("took", time.Since(start)).Msg("month past retention dropped")
	}
	trimmed := map[routing.Month]bool{}
	heldNow := map[routing.Month]map[string]bool{}
	for _, t := range rep.Plan.Trims {
		held, ok := heldNow[t.month]
		if !ok {
			var topics []string
			for _, o := range rep.Plan.Trims {
				if o.month == t.month {
					topics = append(topics, o.Topic)
				}
			}
			late, err := r.heldSincePlan(ctx, db, tenant, t.month, false, topics)
			if err != nil {
				return rep, err
			}
			rep.HeldSincePlan = append(rep.HeldSincePlan, late...)
			held = map[string]bool{}
			for _, h := range late {
				held[h.Topic] = true
			}
			heldNow[t.month] = held
		}
		if held[t.Topic] {
			behind++
			continue
		}
		n, err := r.trimTopic(ctx, db, keys, t)
		rep.RowsTrimmed += n
		r.m.rowsRemoved.WithLabelValues(tenant, "trim").Add(float64(n))
		if err != nil {
			behind++
			return rep, err
		}
		trimmed[t.month] = true
	}
	// a sealed month's catalog counts follow what left it
	for m := range trimmed {
		t, err := routing.TableFor(m)
		if err != nil {
			return rep, err
		}
		if err := routing.RecordShardStats(ctx, db, t); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// heldSincePlan is what of month m a hold keeps now: the topics of the
// month (nil: every topic in it) that a hold stored since the plan names,
// or that a held user wrote in.
func (r *Retention) heldSincePlan(ctx context.Context, db *sql.DB, tenant string, m routing.Month, archived bool, topics []string) ([]Held, error) {
	rows, err := routing.MirrorMonthRows(ctx, db, m)
	if err != nil {
		return nil, err
	}
	if topics != nil {
		rows = slices.DeleteFunc(rows, func(r routing.MirrorRow) bool { return !slices.Contains(topics, r.Topic) })
	}
	users, err := heldUsers(ctx, db)
	if err != nil {
		return nil, err
	}
	why, err := r.heldInMonth(ctx, db, tenant, m, archived, topicsOf(rows), users)
	if err != nil {
		return nil, err
	}
	var out []Held
	for _, row := range rows {
		if w, ok := why[row.Topic]; ok {
			out = append(out, Held{Month: m.String(), Topic: row.Topic, Rows: row.Count, Reason: w})
		}
	}
	return out, nil
}

func topicsOf(rows []routing.MirrorRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Topic
	}
	return out
}

// dropMonth removes month m whole. It is the one place a month leaves
// because of retention: every topic's floor raised past it (so no reader
// reaches it any more, whichever tier it is read from), marked expiring
// (so a stopped run resumes it), then its side rows, route fields and
// mirror rows, then the table itself, its archive (objects, overlay,
// record: an archived month's) and its catalog row. Each step can run
// again.
func (r *Retention) dropMonth(ctx context.Context, tenant string, db *sql.DB, keys routing.Keys, m routing.Month) error {
	t, err := routing.TableFor(m)
	if err != nil {
		return err
	}
	rows, err := routing.MirrorMonthRows(ctx, db, m)
	if err != nil {
		return err
	}
	floors := make([]routing.Floor, len(rows))
	topics := topicsOf(rows)
	for i, row := range rows {
		floors[i] = routing.Floor{Topic: row.Topic, Seq: row.MaxSeq + 1}
	}
	if err := r.floors().Raise(ctx, db, keys, floors); err != nil {
		return err
	}
	if _, err := routing.SetStatus(ctx, db, m, routing.StatusExpiring, routing.StatusSealed, routing.StatusArchived); err != nil {
		return err
	}
	r.p.Catalog.Invalidate(tenant)
	if err := clearSide(ctx, db, floors); err != nil {
		return err
	}
	if err := deleteAll(ctx, db, func(tx *sql.Tx) (int64, error) {
		return readpath.DropMonthRevisions(ctx, tx, m.String(), batch)
	}); err != nil {
		return fmt.Errorf("retention: revisions of %s: %w", m, err)
	}
	// the mirror rows go last: they name the topics a resumed drop still
	// has to clear
	if err := r.dropRoutes(ctx, keys, m, topics); err != nil {
		return err
	}
	if err := deleteAll(ctx, db, func(tx *sql.Tx) (int64, error) { return routing.DropMirrorRows(ctx, tx, m, nil, batch) }); err != nil {
		return err
	}
	// DDL on its own statement; disk goes back at once (file per table)
	if err := routing.FencedDDL(ctx, db, t.DropDDL()); err != nil {
		return fmt.Errorf("retention: drop %s: %w", t.Name(), err)
	}
	if err := r.p.DropArchive(ctx, tenant, m); err != nil {
		return fmt.Errorf("retention: archive of %s: %w", m, err)
	}
	if err := routing.UnregisterShard(ctx, db, m); err != nil {
		return err
	}
	r.p.Catalog.Invalidate(tenant)
	return nil
}

// trimTopic removes one topic's rows of a month that stays, in batches,
// after raising its floor; it reports the message rows deleted.
func (r *Retention) trimTopic(ctx context.Context, db *sql.DB, keys routing.Keys, tr Trim) (int64, error) {
	t, err := routing.TableFor(tr.month)
	if err != nil {
		return 0, err
	}
	if err := r.floors().Raise(ctx, db, keys, []routing.Floor{{Topic: tr.Topic, Seq: tr.MaxSeq + 1}}); err != nil {
		return 0, err
	}
	var removed int64
	err = batches(ctx, db, func(tx *sql.Tx) (int64, error) {
		n, err := routing.RowsOf(sq.Delete(t.Quoted()).Where(sq.Eq{"topic": tr.Topic}).Where(sq.LtOrEq{"seqid": tr.MaxSeq}).
			OrderBy("seqid").Limit(batch).RunWith(tx).ExecContext(ctx))
		removed += n
		return n, err
	}, func() error { return r.forget(ctx, keys, tr.Topic, tr.MaxSeq) })
	if err != nil {
		return removed, fmt.Errorf("retention: trim %s in %s: %w", tr.Topic, t.Name(), err)
	}
	if err := clearSide(ctx, db, []routing.Floor{{Topic: tr.Topic, Seq: tr.MaxSeq + 1}}); err != nil {
		return removed, err
	}
	if err := deleteAll(ctx, db, func(tx *sql.Tx) (int64, error) {
		return readpath.DropRevisionsUpTo(ctx, tx, tr.Topic, tr.MaxSeq, batch)
	}); err != nil {
		return removed, fmt.Errorf("retention: revisions of %s: %w", tr.Topic, err)
	}
	if err := r.dropRoutes(ctx, keys, tr.month, []string{tr.Topic}); err != nil {
		return removed, err
	}
	if err := deleteAll(ctx, db, func(tx *sql.Tx) (int64, error) {
		return routing.DropMirrorRows(ctx, tx, tr.month, []string{tr.Topic}, batch)
	}); err != nil {
		return removed, err
	}
	return removed, nil
}

// sideTopics bounds the topics of one statement clearing side rows: a
// month of thousands of topics is cleared in a few statements, not three
// transactions a topic.
const sideTopics = 100

// clearSide removes what refers to the floors' topics' seqs below their
// floors beside the message rows: mention rows, and hidden ranges (a range
// reaching past a floor is cut at it), sideTopics topics at a time.
func clearSide(ctx context.Context, db *sql.DB, floors []routing.Floor) error {
	for part := range slices.Chunk(floors, sideTopics) {
		if err := deleteAll(ctx, db, func(tx *sql.Tx) (int64, error) { return routing.DropMentionsBelow(ctx, tx, part, batch) }); err != nil {
			return err
		}
		if err := deleteAll(ctx, db, func(tx *sql.Tx) (int64, error) { return readpath.DropHiddenBelow(ctx, tx, part, batch) }); err != nil {
			return fmt.Errorf("retention: hidden ranges: %w", err)
		}
		if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error { return readpath.CutHiddenAt(ctx, tx, part) }); err != nil {
			return err
		}
	}
	return nil
}

// forget takes topic's seqs up to last out of its hot cache and moves its
// message version forward, as a change does (lua/msg_change.lua): no
// process's copy of the newest messages, and no badge remembered from
// them, outlives the removal of the rows.
func (r *Retention) forget(ctx context.Context, keys routing.Keys, topic string, last int64) error {
	if err := r.p.Scripts.MsgChange.Exec(ctx, r.p.Redis, []string{keys.HotMessages(topic), keys.MessagesVersion(topic)},
		[]string{strconv.FormatInt(routing.MessagesVersionTTL.Milliseconds(), 10), "-inf", strconv.FormatInt(last, 10)}).Error(); err != nil {
		return fmt.Errorf("retention: caches of %s: %w", topic, err)
	}
	return nil
}

// floors raises topics' retention floors: the record, then readers' copy.
func (r *Retention) floors() routing.Floors {
	return routing.Floors{Redis: r.p.Redis, Scripts: r.p.Scripts}
}

// routeBatch bounds the topics of one Redis round trip.
const routeBatch = 200

// dropRoutes removes month m from the Redis routes of topics.
func (r *Retention) dropRoutes(ctx context.Context, keys routing.Keys, m routing.Month, topics []string) error {
	rdb := r.p.Redis
	for len(topics) > 0 {
		part := topics[:min(len(topics), routeBatch)]
		topics = topics[len(part):]
		cmds := make(rueidis.Commands, 0, 2*len(part))
		for _, t := range part {
			cmds = append(cmds, rdb.B().Zrem().Key(keys.Route(t)).Member(m.String()).Build(),
				rdb.B().Hdel().Key(keys.RouteMeta(t)).Field(m.String()).Build())
		}
		for _, res := range rdb.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				return fmt.Errorf("retention: routes of %s: %w", m, err)
			}
		}
	}
	return nil
}

// deleteAll repeats one bounded delete, each in a fenced transaction of
// its own, until it removes less than a batch.
func deleteAll(ctx context.Context, db *sql.DB, step func(tx *sql.Tx) (int64, error)) error {
	return batches(ctx, db, step, nil)
}

// batches is deleteAll with committed, when not nil, run after each batch
// that removed something commits.
func batches(ctx context.Context, db *sql.DB, step func(tx *sql.Tx) (int64, error), committed func() error) error {
	for {
		n, err := routing.FencedValue(ctx, db, step)
		if err != nil {
			return err
		}
		if n > 0 && committed != nil {
			if err := committed(); err != nil {
				return err
			}
		}
		if n < batch {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
