package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// RetentionParams drive `imshard bench retention`: (a) a month past the
// tenant's retention, filled with Rows messages, dropped by the retention
// run while an open-loop send load runs, beside the same load without a
// drop; (b) a user's EraseMessages messages over the three months of
// EraseTables, the first of them archived, erased through the erase job,
// beside a raw UPDATE of the same rows (the archived month's in its table
// before the archive): twice, by two users of the same messages, the
// first the tenant's first erase into its overlay (cold), the second
// after a warm-up erase has grown the overlay past its first megabyte
// (the steady state, RetentionReport.EraseRatio).
type RetentionParams struct {
	// Load is the send load's API, tenant and clients (Concurrency: the
	// clients that prepare its groups).
	Load     SendParams
	Rate     float64       // sends per second of the load
	Duration time.Duration // each load run

	DB     *sql.DB
	Routes *routing.Routes

	// Expired is the month past retention (registered, empty); Seal seals
	// it once filled, as the patrol does a month past its grace.
	Expired routing.Table
	Rows    int
	Topics  int
	Seal    func(context.Context) error
	// Drop is the retention run of the tenant.
	Drop func(context.Context) (Dropped, error)

	// EraseTables are three registered months within retention; the
	// first is archived before the erase.
	EraseTables   []routing.Table
	EraseMessages int
	// EraseUser is the cold erase's user; EraseUser+1 the steady one's,
	// EraseUser+2 the warm-up's (EraseRatio): none may be a user of the
	// send load.
	EraseUser int64
	// Erase runs the erase job of user to its end.
	Erase func(ctx context.Context, user int64) (Erased, error)
	// Rotate stops month m being active, as the patrol does once the
	// active month has moved past it (the month starts sealing, its
	// deactivation stamped); Archive then archives it through the archive
	// job once the completeness proof holds.
	Rotate  func(ctx context.Context, m routing.Month) error
	Archive func(ctx context.Context, m routing.Month) error

	Progress io.Writer
}

// Dropped is what the retention run removed.
type Dropped struct {
	Months int
	Rows   int64
}

// Erased is the erase job's end as GET /v1/admin/jobs/{id} shows it.
type Erased struct {
	Done     bool
	State    string
	Messages int64
	Months   map[string]int64
}

// RetentionReport is both parts' figures.
type RetentionReport struct {
	Rows     int64 // rows of the expired month
	Mentions int64 // its mention rows
	Dropped  Dropped
	// the load without a drop, across it, and without one again (how much
	// two runs without a drop differ on this machine)
	Steady, During, After RoundResult
	DropTook              time.Duration

	UserMessages int64 // each erased user's messages in the three months
	// the erase of the tenant's first user (its overlay empty) and the
	// steady erase, of another user after the warm-up (EraseRatio)
	FirstErase, SteadyErase EraseRun
	// the warm-up erase's messages, all in the archived month
	WarmUpMessages int64
	// the archived month, each user's messages in it and the archive's
	// run (its seal, the wait for the proof, export, verify, mark)
	Archived         routing.Month
	ArchivedMessages int64
	ArchiveTook      time.Duration
}

// EraseRun is one user's erase job beside the raw UPDATEs of the same
// rows.
type EraseRun struct {
	User   int64
	Erased Erased
	Took   time.Duration
	Raw    time.Duration // the raw UPDATEs of the same rows
	// the archived month's share of Raw: the UPDATE of its table before
	// the archive
	RawArchived time.Duration
}

// Ratio is the erase job's messages per second over the raw UPDATE's.
func (r EraseRun) Ratio() float64 {
	return r.Raw.Seconds() / max(r.Took.Seconds(), 1e-9)
}

// EraseRatio is the steady erase's ratio, the one the bar judges. A
// tenant's archive overlay (im_archive_overlay) is a table of its own, and
// InnoDB extends a table's file one page at a time until it holds 64
// pages (a megabyte), an extent at a time after; so the first few
// thousand tombstones a tenant ever puts there cost two to four times what
// the same INSERT costs once the file is past that size. The file never
// shrinks (rows removed leave their pages to the table), so a tenant pays
// it once (again on a move's target, which creates the table anew), and
// every erase after that is the steady state. The bench's tenant is new
// each run: its first erase (FirstErase) pays it, and is printed beside;
// then a warm-up erase of twice as many messages of the archived month
// grows the overlay past the megabyte, and the erase of a second user of
// the same messages as the first (SteadyErase) is judged.
func (r RetentionReport) EraseRatio() float64 { return r.SteadyErase.Ratio() }

// DropP99Ratio is the send p99 across the drop over the p99 without it:
// the mean of the runs before and after it, so that a drift of the
// machine's load over the three runs falls on both sides alike.
func (r RetentionReport) DropP99Ratio() float64 {
	return 2 * float64(r.During.P99) / float64(max(r.Steady.P99+r.After.P99, 1))
}

// retentionTopics is the load's topics.
const retentionTopics = 16

// eraseTopics is the topics a month of the user's messages spreads over;
// one message in eraseEvery of them is the user's: the cold user's those
// at seqs divisible by eraseEvery, the steady user's those two after them,
// the warm-up user's the others of the archived month (EraseRatio).
const (
	eraseTopics = 40
	eraseEvery  = 4
)

// Retention builds the fixtures, then measures both parts.
func Retention(ctx context.Context, p RetentionParams) (RetentionReport, error) {
	var rep RetentionReport
	if len(p.EraseTables) != 3 || p.Topics < 1 || p.Rows < p.Topics || p.EraseMessages < 3 || p.Rate <= 0 || p.Duration <= 0 {
		return rep, fmt.Errorf("bench: retention: three erase months, rows >= topics >= 1, erase messages >= 3, a rate and a duration")
	}
	start := time.Now()
	perTopic := int64((p.Rows + p.Topics - 1) / p.Topics)
	if err := p.fill(ctx, p.Expired, p.Topics, 0, perTopic); err != nil {
		return rep, err
	}
	var err error
	if rep.Mentions, err = p.mention(ctx, perTopic); err != nil {
		return rep, err
	}
	if err := p.Seal(ctx); err != nil {
		return rep, fmt.Errorf("bench: seal %s: %w", p.Expired.Name(), err)
	}
	rep.Rows = int64(p.Topics) * perTopic
	p.logf("bench: %s filled with %d rows over %d topics (%d mention rows) and sealed (%s)", p.Expired.Name(), rep.Rows, p.Topics,
		rep.Mentions, time.Since(start).Round(time.Second))
	// each month holds a third of the user's messages, one of eraseEvery
	// rows of its topics (the first of the expired month's, their seqs
	// going on after it)
	perMonth := (p.EraseMessages + 2) / 3
	erasePer := int64(eraseEvery * ((perMonth + eraseTopics - 1) / eraseTopics))
	for i, t := range p.EraseTables {
		if err := p.fill(ctx, t, eraseTopics, perTopic+int64(i)*erasePer, erasePer); err != nil {
			return rep, err
		}
		// a user and the remainders of the seqs (mod eraseEvery) they sent
		type sender struct {
			user int64
			rems []int
		}
		senders := []sender{{p.EraseUser, []int{0}}, {p.EraseUser + 1, []int{2}}}
		if i == 0 {
			senders = append(senders, sender{p.EraseUser + 2, []int{1, 3}})
		}
		var ns []int64
		for _, s := range senders {
			n, err := routing.RowsOf(sq.Update(t.Quoted()).Set("from_user", s.user).Where(sq.Eq{fmt.Sprintf("seqid %% %d", eraseEvery): s.rems}).
				RunWith(p.DB).ExecContext(ctx))
			if err != nil {
				return rep, fmt.Errorf("bench: the messages of user %d in %s: %w", s.user, t.Name(), err)
			}
			ns = append(ns, n)
		}
		if ns[1] != ns[0] {
			return rep, fmt.Errorf("bench: %s: %d messages of user %d, %d of user %d", t.Name(), ns[0], p.EraseUser, ns[1], p.EraseUser+1)
		}
		rep.UserMessages += ns[0]
		if i == 0 {
			rep.Archived, rep.ArchivedMessages, rep.WarmUpMessages = t.Month(), ns[0], ns[2]
		}
	}
	if err := p.Rotate(ctx, rep.Archived); err != nil {
		return rep, fmt.Errorf("bench: %s stops being active: %w", rep.Archived, err)
	}
	p.logf("bench: %d messages of user %d over %s, %s and %s (%s)", rep.UserMessages, p.EraseUser,
		p.EraseTables[0].Name(), p.EraseTables[1].Name(), p.EraseTables[2].Name(), time.Since(start).Round(time.Second))

	if err := p.dropUnderLoad(ctx, &rep); err != nil {
		return rep, err
	}
	return rep, p.erase(ctx, &rep)
}

func (p *RetentionParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// fill writes seqs base+1 … base+n of topics topics into t (fillMonth),
// then the route mirror's rows and the Redis routes of its topics.
func (p *RetentionParams) fill(ctx context.Context, t routing.Table, topics int, base, n int64) error {
	if err := fillMonth(ctx, p.DB, t, topics, base, n); err != nil {
		return err
	}
	if err := routing.Fenced(ctx, p.DB, func(tx *sql.Tx) error { return routing.MirrorFromTable(ctx, tx, t) }); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	settle := make([]routing.Settlement, topics)
	for i := range settle {
		settle[i] = routing.Settlement{Topic: benchTopic(i), Ranges: []routing.MonthRange{{Month: t.Month(), MinSeq: base + 1, MaxSeq: base + n, Count: n}}}
	}
	return p.Routes.Settle(ctx, p.Load.Tenant, settle)
}

// mentionEvery: one message in mentionEvery of the expired month mentions
// a user, so that its drop deletes mention rows as a real month's does.
const mentionEvery = 10

// mention writes the expired month's mention rows, a few thousand per
// statement, and reports how many.
func (p *RetentionParams) mention(ctx context.Context, perTopic int64) (int64, error) {
	var ms []routing.Mention
	var n int64
	flush := func() error {
		err := routing.Fenced(ctx, p.DB, func(tx *sql.Tx) error { return routing.AddMentions(ctx, tx, ms) })
		n += int64(len(ms))
		ms = ms[:0]
		return err
	}
	for i := range p.Topics {
		for seq := int64(mentionEvery); seq <= perTopic; seq += mentionEvery {
			ms = append(ms, routing.Mention{Topic: benchTopic(i), User: benchMembers + 1, Seq: seq})
			if len(ms) == 5000 {
				if err := flush(); err != nil {
					return n, fmt.Errorf("bench: mentions: %w", err)
				}
			}
		}
	}
	if err := flush(); err != nil {
		return n, fmt.Errorf("bench: mentions: %w", err)
	}
	return n, nil
}

// dropUnderLoad runs the load without a drop, across the retention run
// (started a quarter into the run) and without one again.
func (p *RetentionParams) dropUnderLoad(ctx context.Context, rep *RetentionReport) error {
	conns := max(p.Load.Concurrency, openLoopWorkers)
	b := &sendBench{p: p.Load, run: strconv.FormatInt(time.Now().UnixNano(), 36),
		hc: &http.Client{Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}}}
	topics := make([]string, retentionTopics)
	for i := range topics {
		topics[i] = fmt.Sprintf("rs-%s-%d", b.run, i)
	}
	p.logf("bench: preparing %d groups of %d members for the send load", len(topics), benchMembers)
	stopPersist := func() {}
	if p.Load.Persist != nil {
		var err error
		if stopPersist, err = p.Load.Persist(ctx); err != nil {
			return err
		}
	}
	keys, err := p.Load.KeySpace.Tenant(p.Load.Tenant)
	if err == nil {
		err = b.setup(ctx, topics)
	}
	if err == nil {
		err = b.awaitHorizon(ctx, keys, topics[0], p.logf)
	}
	stopPersist()
	if err != nil {
		return err
	}
	tokens := make([]string, benchMembers)
	for u := range tokens {
		if tokens[u], err = httpapi.Sign(p.Load.Secret, p.Load.Tenant, int64(u+1), "", 24*time.Hour); err != nil {
			return err
		}
	}
	send := func(ctx context.Context, w int, n int64) error {
		return b.post(ctx, p.Load.BaseURL, tokens[w%benchMembers], topics[n%int64(len(topics))], b.run+"-"+strconv.FormatInt(n, 10), "retention bench")
	}
	run := func(name string, drop bool) (RoundResult, error) {
		p.logf("bench: %.0f sends/s for %s, %s", p.Rate, p.Duration, name)
		dropped := make(chan error, 1)
		if drop {
			go func() {
				if err := sleepCtx(ctx, p.Duration/4); err != nil {
					dropped <- err
					return
				}
				t0 := time.Now()
				d, err := p.Drop(ctx)
				rep.DropTook, rep.Dropped = time.Since(t0), d
				dropped <- err
			}()
		} else {
			dropped <- nil
		}
		s, err := b.openLoop(ctx, p.Duration, p.Rate, send)
		if derr := <-dropped; err == nil {
			err = derr
		}
		if err != nil {
			return RoundResult{}, err
		}
		return s.result(name)
	}
	if rep.Steady, err = run("without a drop", false); err != nil {
		return err
	}
	if rep.During, err = run("across the retention run", true); err != nil {
		return fmt.Errorf("bench: retention run: %w", err)
	}
	p.logf("bench: retention run dropped %d months, %d rows in %s", rep.Dropped.Months, rep.Dropped.Rows, rep.DropTook.Round(time.Millisecond))
	rep.After, err = run("without a drop, again", false)
	return err
}

// erase times a raw UPDATE of each erased user's rows in the three
// months and puts the rows back as they were, archives the first month,
// then times the erase job of the cold user, runs the warm-up erase and
// times the erase job of the steady user (the steady state: EraseRatio).
// The archived month's raw cost is the UPDATE of its table before the
// archive: the cheapest way its rows could become tombstones (rewriting
// the archive costs more), so the ratio is judged against the strictest
// bound.
func (p *RetentionParams) erase(ctx context.Context, rep *RetentionReport) error {
	update := func(user int64, q sq.UpdateBuilder, took func(i int, d time.Duration)) error {
		for i, t := range p.EraseTables {
			t0 := time.Now()
			if _, err := q.Table(t.Quoted()).Where(sq.Eq{"from_user": user}).RunWith(p.DB).ExecContext(ctx); err != nil {
				return fmt.Errorf("bench: update %s: %w", t.Name(), err)
			}
			took(i, time.Since(t0))
		}
		return nil
	}
	rep.FirstErase.User, rep.SteadyErase.User = p.EraseUser, p.EraseUser+1
	for _, run := range []*EraseRun{&rep.FirstErase, &rep.SteadyErase} {
		p.logf("bench: raw UPDATE of user %d's %d rows", run.User, rep.UserMessages)
		if err := update(run.User, sq.Update("").Set("status", "deleted").Set("content", nil).Set("head", nil).Set("version", sq.Expr("version + 1")),
			func(i int, d time.Duration) {
				run.Raw += d
				if i == 0 {
					run.RawArchived = d
				}
			}); err != nil {
			return err
		}
		// the content fillMonth wrote
		if err := update(run.User, sq.Update("").Set("status", "normal").Set("version", sq.Expr("version - 1")).
			Set("content", sq.Expr("JSON_OBJECT('text', CONCAT('bench message ', seqid))")), func(int, time.Duration) {}); err != nil {
			return err
		}
	}
	p.logf("bench: %s sealed and archived through the archive job", rep.Archived)
	t0 := time.Now()
	if err := p.Archive(ctx, rep.Archived); err != nil {
		return fmt.Errorf("bench: archive %s: %w", rep.Archived, err)
	}
	rep.ArchiveTook = time.Since(t0)
	job := func(user, messages, archived int64) (Erased, time.Duration, error) {
		p.logf("bench: the erase job of user %d", user)
		t0 := time.Now()
		e, err := p.Erase(ctx, user)
		took := time.Since(t0)
		switch {
		case err != nil:
			return e, took, err
		case !e.Done || e.Messages != messages:
			return e, took, fmt.Errorf("bench: the erase job of user %d ended %s with %d of %d messages erased", user, e.State, e.Messages, messages)
		case e.Months[rep.Archived.String()] != archived:
			return e, took, fmt.Errorf("bench: the erase job of user %d erased %d of the archived month %s's %d messages", user,
				e.Months[rep.Archived.String()], rep.Archived, archived)
		}
		return e, took, nil
	}
	var err error
	if rep.FirstErase.Erased, rep.FirstErase.Took, err = job(rep.FirstErase.User, rep.UserMessages, rep.ArchivedMessages); err != nil {
		return err
	}
	if _, _, err = job(p.EraseUser+2, rep.WarmUpMessages, rep.WarmUpMessages); err != nil {
		return err
	}
	rep.SteadyErase.Erased, rep.SteadyErase.Took, err = job(rep.SteadyErase.User, rep.UserMessages, rep.ArchivedMessages)
	return err
}
