package retention

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
)

// jobsTable holds the tenant's jobs (sql/migrations/0021_jobs.sql); only
// this package reads or writes it.
const jobsTable = "im_jobs"

// Job kinds and states.
const (
	KindPurge = "purge"
	KindErase = "erase"

	StateQueued  = "queued"
	StateRunning = "running"
	StatePaused  = "paused"
	StateDone    = "done"
	StateFailed  = "failed"
)

// ActionPurge is the change-feed action of a group purge: every message of
// the topic up to the event's seq_id is gone.
const ActionPurge = "purge"

// JobReport is what a job removed, per month, and what it left.
type JobReport struct {
	// Months: message rows removed per month (YYYYMM).
	Months map[string]int64 `json:"months"`
	// PendingArchive: archived months whose rows of the topic are removed
	// through the archive, not here.
	PendingArchive []string `json:"pending_archive"`
	// Side: rows removed beside the messages (revisions, hidden ranges,
	// mentions, routes, cursors), by kind; for an erase, revisions whose
	// content was cleared.
	Side map[string]int64 `json:"side"`
	// HeldTopics: an erase's topics a hold keeps, whose messages of the
	// user it left as they are.
	HeldTopics []string `json:"held_topics"`
}

// Job is a background job of the tenant as GET /v1/admin/jobs/{id} shows it.
type Job struct {
	ID          message.ID   `json:"id"`
	Kind        string       `json:"kind"`
	Topic       string       `json:"topic,omitempty"`
	UserID      message.ID   `json:"user_id,omitempty"`
	State       string       `json:"state"`
	RowsRemoved int64        `json:"rows_removed"`
	Report      JobReport    `json:"report"`
	Error       string       `json:"error"`
	CreatedAt   message.Time `json:"created_at"`
	UpdatedAt   message.Time `json:"updated_at"`
}

// ErrNoJob: no job of the tenant has the id.
var ErrNoJob = httpapi.Errorf(httpapi.CodeNotFound, "no such job")

func emptyReport() JobReport {
	return JobReport{Months: map[string]int64{}, PendingArchive: []string{}, Side: map[string]int64{}, HeldTopics: []string{}}
}

// topicHeld refuses a purge of a held topic, or of one a held user wrote
// in (409 conflict, details.reason "legal_hold").
func topicHeld(ctx context.Context, db *sql.DB, topic string) error {
	users, err := heldUsers(ctx, db)
	if err != nil {
		return err
	}
	why, err := heldTopics(ctx, db, []string{topic})
	if err != nil {
		return err
	}
	if len(why) == 0 && len(users) > 0 {
		shards, err := routing.ListShards(ctx, db)
		if err != nil {
			return err
		}
		for _, s := range shards {
			if s.Status == routing.StatusArchived {
				continue
			}
			if why, err = heldIn(ctx, db, s.Month, []string{topic}, users); err != nil || len(why) > 0 {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	if w, ok := why[topic]; ok {
		return heldConflict("topic", w)
	}
	return nil
}

// StartPurge queues a purge of topic's history; the shard managers' job
// loop runs it. Refused while a hold keeps the topic.
func (r *Retention) StartPurge(ctx context.Context, tenant, topic string) (Job, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Job{}, err
	}
	if err := topicHeld(ctx, db, topic); err != nil {
		return Job{}, err
	}
	return r.queue(ctx, tenant, db, KindPurge, topic)
}

// queue adds a job of kind on target (a topic, or a user id).
func (r *Retention) queue(ctx context.Context, tenant string, db *sql.DB, kind, target string) (Job, error) {
	rep, _ := json.Marshal(emptyReport())
	id, err := routing.FencedValue(ctx, db, func(tx *sql.Tx) (int64, error) {
		res, err := sq.Insert(jobsTable).Columns("kind", "target", "state", "report").
			Values(kind, target, StateQueued, string(rep)).RunWith(tx).ExecContext(ctx)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	})
	if err != nil {
		return Job{}, fmt.Errorf("jobs: queue %s of %s: %w", kind, target, err)
	}
	r.p.Log.Info().Str("tenant", tenant).Str("kind", kind).Str("target", target).Int64("job", id).Msg("job queued")
	r.woken()
	return r.Job(ctx, tenant, id)
}

// Job reads job id of tenant.
func (r *Retention) Job(ctx context.Context, tenant string, id int64) (Job, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Job{}, err
	}
	var j Job
	var rep string
	var created, updated time.Time
	err = sq.Select("job_id", "kind", "target", "state", "rows_removed", "report", "last_error", "created_at", "updated_at").
		From(jobsTable).Where(sq.Eq{"job_id": id}).RunWith(db).QueryRowContext(ctx).
		Scan(&j.ID, &j.Kind, &j.Topic, &j.State, &j.RowsRemoved, &rep, &j.Error, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return Job{}, ErrNoJob
	}
	if err != nil {
		return Job{}, fmt.Errorf("jobs: read %d: %w", id, err)
	}
	j.Report = emptyReport()
	if err := json.Unmarshal([]byte(rep), &j.Report); err != nil {
		return Job{}, fmt.Errorf("jobs: report of %d: %w", id, err)
	}
	j.CreatedAt, j.UpdatedAt = message.NewTime(created), message.NewTime(updated)
	if j.Kind == KindErase {
		u, err := strconv.ParseInt(j.Topic, 10, 64)
		if err != nil {
			return Job{}, fmt.Errorf("jobs: %d erases user %q: %w", id, j.Topic, err)
		}
		j.Topic, j.UserID = "", message.ID(u)
	}
	return j, nil
}

// SetPaused pauses a queued or running job (its runner stops after the
// batch under way) or resumes a paused one; any other state is a conflict.
func (r *Retention) SetPaused(ctx context.Context, tenant string, id int64, pause bool) (Job, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Job{}, err
	}
	q := sq.Update(jobsTable).Set("state", StatePaused).Where(sq.Eq{"job_id": id, "state": []string{StateQueued, StateRunning}})
	if !pause {
		q = sq.Update(jobsTable).Set("state", StateQueued).Where(sq.Eq{"job_id": id, "state": StatePaused})
	}
	n, err := routing.FencedRows(ctx, db, q)
	if err != nil {
		return Job{}, fmt.Errorf("jobs: pause %d: %w", id, err)
	}
	if n > 0 && !pause {
		r.woken()
	}
	j, err := r.Job(ctx, tenant, id)
	if err != nil || n > 0 {
		return j, err
	}
	return j, httpapi.Errorf(httpapi.CodeConflict, "job is "+j.State).WithDetails(map[string]any{"state": j.State})
}

// jobPoll is how often the job loop looks for a job to run when no job
// queued in its own process woke it.
const jobPoll = 5 * time.Second

// woken wakes this process's job loop, if it runs one, at once: a job
// queued or resumed through this process starts without waiting for the
// poll. A wake while the loop is busy is kept for the pass after it.
func (r *Retention) woken() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// RunJobLoop runs the tenants' jobs until ctx ends (the shard manager
// role): every jobPoll, and whenever a job is queued or resumed in this
// process (woken), each tenant's next runnable job (queued, or running
// with an expired lease) is taken under a lease of lease and run.
func (r *Retention) RunJobLoop(ctx context.Context, tenants func() []string, lease time.Duration) error {
	host, _ := os.Hostname()
	owner := host + "/" + strconv.Itoa(os.Getpid()) + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		}
		for _, tenant := range tenants() {
			if err := r.countStalled(ctx, tenant); err != nil && ctx.Err() == nil {
				r.p.Log.Warn().Err(err).Str("tenant", tenant).Msg("stalled jobs not counted")
			}
			if _, err := r.RunJobs(ctx, tenant, owner, lease); err != nil && ctx.Err() == nil {
				r.p.Log.Error().Err(err).Str("tenant", tenant).Msg("job run failed; retrying at the next poll")
			}
		}
		t.Reset(r.poll)
	}
}

// stallAfter is how long a queued or running job may go without progress
// before it counts as stalled (imshard_jobs_stalled).
const stallAfter = 15 * time.Minute

// countStalled sets the tenant's stalled-jobs gauge.
func (r *Retention) countStalled(ctx context.Context, tenant string) error {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	var n int
	if err := sq.Select("COUNT(*)").From(jobsTable).Where(sq.Eq{"state": []string{StateQueued, StateRunning}}).
		Where(sq.Expr("updated_at < NOW(3) - INTERVAL ? SECOND", int(stallAfter.Seconds()))).
		RunWith(db).QueryRowContext(ctx).Scan(&n); err != nil {
		return fmt.Errorf("jobs: stalled: %w", err)
	}
	r.m.jobsStalled.WithLabelValues(tenant).Set(float64(n))
	return nil
}

// RunJobs runs the tenant's runnable jobs one after the other as owner and
// reports how many it ran to their end.
func (r *Retention) RunJobs(ctx context.Context, tenant, owner string, lease time.Duration) (int, error) {
	db, err := r.p.DBs.DB(ctx, tenant)
	if err != nil {
		return 0, err
	}
	ran := 0
	for {
		id, ok, err := claim(ctx, db, owner, lease)
		if err != nil || !ok {
			return ran, err
		}
		if err := r.runJob(ctx, tenant, db, id, owner, lease); err != nil {
			return ran, err
		}
		ran++
	}
}

// claim takes the next runnable job's lease.
func claim(ctx context.Context, db *sql.DB, owner string, lease time.Duration) (int64, bool, error) {
	runnable := sq.Or{sq.Eq{"state": StateQueued},
		sq.And{sq.Eq{"state": StateRunning}, sq.Or{sq.Eq{"lease_until": nil}, sq.Expr("lease_until < NOW(3)")}}}
	ids, err := sq.Select("job_id").From(jobsTable).Where(runnable).OrderBy("job_id").Limit(10).RunWith(db).QueryContext(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("jobs: runnable: %w", err)
	}
	var cand []int64
	for ids.Next() {
		var id int64
		if err := ids.Scan(&id); err != nil {
			ids.Close()
			return 0, false, fmt.Errorf("jobs: runnable: %w", err)
		}
		cand = append(cand, id)
	}
	ids.Close()
	for _, id := range cand {
		n, err := routing.FencedRows(ctx, db, sq.Update(jobsTable).Set("state", StateRunning).Set("lease_owner", owner).
			Set("lease_until", sq.Expr("NOW(3) + INTERVAL ? MICROSECOND", lease.Microseconds())).
			Where(sq.Eq{"job_id": id}).Where(runnable))
		if err != nil {
			return 0, false, fmt.Errorf("jobs: claim %d: %w", id, err)
		}
		if n == 1 {
			return id, true, nil
		}
	}
	return 0, false, nil
}

// errLeaseLost: the job was paused, or another runner took it over.
var errLeaseLost = errors.New("jobs: lease lost or job paused")

// runJob runs job id to its end, or until it is paused or its lease lost.
// Every step can run again: a runner that takes the job over redoes what
// its killed predecessor had not recorded.
func (r *Retention) runJob(ctx context.Context, tenant string, db *sql.DB, id int64, owner string, lease time.Duration) error {
	j, err := r.Job(ctx, tenant, id)
	if err != nil {
		return err
	}
	keys, err := r.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	p := &jobRun{r: r, tenant: tenant, db: db, keys: keys, job: j, owner: owner, lease: lease}
	running := r.m.jobsRunning.WithLabelValues(tenant)
	running.Inc()
	if j.Kind == KindErase {
		err = p.erase(ctx)
	} else {
		err = p.purge(ctx)
	}
	running.Dec()
	switch {
	case errors.Is(err, errLeaseLost):
		r.p.Log.Info().Str("tenant", tenant).Int64("job", id).Msg("job stopped: paused or taken over")
		return nil
	case err != nil && ctx.Err() == nil:
		r.p.Log.Error().Err(err).Str("tenant", tenant).Int64("job", id).Msg("job failed")
		r.m.jobFailures.WithLabelValues(tenant).Inc()
		msg := err.Error()
		if len(msg) > 1024 {
			msg = msg[:1024]
		}
		_, uerr := routing.FencedRows(context.WithoutCancel(ctx), db, sq.Update(jobsTable).Set("state", StateFailed).Set("last_error", msg).
			Set("lease_owner", "").Set("lease_until", nil).Where(sq.Eq{"job_id": id, "lease_owner": owner}))
		return uerr
	}
	return err
}

// jobRun is one runner's run of one job.
type jobRun struct {
	r      *Retention
	tenant string
	db     *sql.DB
	keys   routing.Keys
	job    Job
	owner  string
	lease  time.Duration
}

// purge removes one topic's history: its floor raised past every stored
// seq first (readers see nothing of it from then on), then its rows in
// every month in bounded batches, then what refers to them. The topic's
// hot cache and message version follow each batch that commits (forget).
func (p *jobRun) purge(ctx context.Context) error {
	topic, db := p.job.Topic, p.db
	if err := p.unheld(ctx); err != nil {
		return err
	}
	last, err := routing.LastStoredSeq(ctx, db, topic)
	if err != nil {
		return err
	}
	if err := p.r.floors().Raise(ctx, db, p.keys, []routing.Floor{{Topic: topic, Seq: last + 1}}); err != nil {
		return err
	}
	forget := func() error { return p.r.forget(ctx, p.keys, topic, last) }
	if err := forget(); err != nil {
		return err
	}
	shards, err := routing.ListShards(ctx, db)
	if err != nil {
		return err
	}
	rep := &p.job.Report
	rep.PendingArchive = rep.PendingArchive[:0]
	var months []routing.Month
	for _, s := range shards {
		if s.Status == routing.StatusArchived {
			rep.PendingArchive = append(rep.PendingArchive, s.Month.String())
			continue
		}
		months = append(months, s.Month)
		t, err := routing.TableFor(s.Month)
		if err != nil {
			return err
		}
		if err := batches(ctx, db, func(tx *sql.Tx) (int64, error) {
			n, err := routing.RowsOf(sq.Delete(t.Quoted()).Where(sq.Eq{"topic": topic}).OrderBy("seqid").Limit(batch).RunWith(tx).ExecContext(ctx))
			if err != nil {
				return n, fmt.Errorf("purge: %s of %s: %w", t.Name(), topic, err)
			}
			rep.Months[s.Month.String()] += n
			p.job.RowsRemoved += n
			p.r.m.jobRows.WithLabelValues(p.tenant, KindPurge).Add(float64(n))
			return n, p.progress(ctx, tx)
		}, func() error {
			testhook.CrashAfterJobBatch()
			return forget()
		}); err != nil {
			return err
		}
	}
	side := p.side
	if err := side(ctx, "revisions", func(tx *sql.Tx) (int64, error) { return readpath.DropRevisionsUpTo(ctx, tx, topic, last, batch) }); err != nil {
		return err
	}
	floor := []routing.Floor{{Topic: topic, Seq: last + 1}}
	if err := side(ctx, "hidden_ranges", func(tx *sql.Tx) (int64, error) { return readpath.DropHiddenBelow(ctx, tx, floor, batch) }); err != nil {
		return err
	}
	if err := side(ctx, "mentions", func(tx *sql.Tx) (int64, error) { return routing.DropMentionsBelow(ctx, tx, floor, batch) }); err != nil {
		return err
	}
	if err := side(ctx, "read_cursors", func(tx *sql.Tx) (int64, error) { return acl.DropTopicCursors(ctx, tx, topic, batch) }); err != nil {
		return err
	}
	for _, m := range months {
		if err := p.r.dropRoutes(ctx, p.keys, m, []string{topic}); err != nil {
			return err
		}
		if err := side(ctx, "mirror_rows", func(tx *sql.Tx) (int64, error) { return routing.DropMirrorRows(ctx, tx, m, []string{topic}, batch) }); err != nil {
			return err
		}
	}
	return p.finish(ctx, last)
}

// side removes rows of one kind beside the messages in batches, counted
// in the report under kind, with the job's progress recorded in each
// batch (a job paused, taken over or held meanwhile rolls the batch back).
func (p *jobRun) side(ctx context.Context, kind string, step func(tx *sql.Tx) (int64, error)) error {
	return deleteAll(ctx, p.db, func(tx *sql.Tx) (int64, error) {
		n, err := step(tx)
		p.job.Report.Side[kind] += n
		if err != nil {
			return n, err
		}
		return n, p.progress(ctx, tx)
	})
}

// unheld refuses to go on with a job on what a hold now keeps (a purge's
// topic, an erase's user): checked when the job starts and again before
// each batch commits, so a hold placed while the job runs stops it with
// nothing under the hold removed; the job fails with the hold named.
func (p *jobRun) unheld(ctx context.Context) error {
	if p.job.Kind == KindErase {
		return userHeld(ctx, p.db, int64(p.job.UserID))
	}
	return topicHeld(ctx, p.db, p.job.Topic)
}

// progress checks that no hold keeps what the job removes (unheld), then
// records the report so far and renews the lease in tx, the batch's own
// transaction, so the report counts exactly the batches that committed;
// errLeaseLost when the job was paused or taken over meanwhile. A batch
// calls it before it commits: either error rolls the batch back.
func (p *jobRun) progress(ctx context.Context, tx *sql.Tx) error {
	if err := p.unheld(ctx); err != nil {
		return err
	}
	return p.recordIn(ctx, tx, p.job.State)
}

// record records the job's state and report in a transaction of its own.
func (p *jobRun) record(ctx context.Context, state string) error {
	return routing.Fenced(ctx, p.db, func(tx *sql.Tx) error { return p.recordIn(ctx, tx, state) })
}

// recordIn records the job's state and report in tx, the lease renewed
// (or, done, given up); errLeaseLost when the job is no longer this
// runner's.
func (p *jobRun) recordIn(ctx context.Context, tx *sql.Tx, state string) error {
	rep, err := json.Marshal(p.job.Report)
	if err != nil {
		return err
	}
	q := sq.Update(jobsTable).Set("rows_removed", p.job.RowsRemoved).Set("report", string(rep)).Set("state", state)
	if state == StateDone {
		q = q.Set("lease_owner", "").Set("lease_until", nil)
	} else {
		q = q.Set("lease_until", sq.Expr("NOW(3) + INTERVAL ? MICROSECOND", p.lease.Microseconds()))
	}
	ours := sq.Eq{"job_id": p.job.ID, "lease_owner": p.owner, "state": StateRunning}
	n, err := routing.RowsOf(q.Where(ours).RunWith(tx).ExecContext(ctx))
	if err != nil {
		return fmt.Errorf("jobs: progress of %d: %w", p.job.ID, err)
	}
	if n > 0 {
		return nil
	}
	// MySQL counts changed rows only: an update within the same
	// millisecond as the last one changes nothing and still holds the job
	var held int
	if err := sq.Select("COUNT(*)").From(jobsTable).Where(ours).RunWith(tx).QueryRowContext(ctx).Scan(&held); err != nil {
		return fmt.Errorf("jobs: progress of %d: %w", p.job.ID, err)
	}
	if held == 0 {
		return errLeaseLost
	}
	return nil
}

// finish records the purge in the change feed (one event: every message
// of the topic up to last is gone) and marks the job done.
func (p *jobRun) finish(ctx context.Context, last int64) error {
	if err := routing.Fenced(ctx, p.db, func(tx *sql.Tx) error {
		cs, err := readpath.NextChangeSeq(ctx, tx, p.job.Topic)
		if err != nil {
			return err
		}
		return feed.Record(ctx, tx, feed.Event{Tenant: p.tenant, Topic: p.job.Topic, ChangeSeq: cs, Action: ActionPurge,
			SeqID: last, At: message.NewTime(time.Now())})
	}); err != nil {
		return fmt.Errorf("purge: feed event: %w", err)
	}
	p.r.p.Log.Info().Str("tenant", p.tenant).Str("topic", p.job.Topic).Int64("rows", p.job.RowsRemoved).Msg("group purged")
	return p.record(ctx, StateDone)
}
