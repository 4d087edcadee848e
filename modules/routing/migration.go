package routing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"
)

// The migration of a tenant from the legacy single table (docs/migration.md).
// This file owns its tables — every role reads them (send and the change
// path through the gate, query for the dual read, the migrate module and
// the CLI for the rest) — and the in-process state cache the dual read and
// the write gate's local check consult (the gate itself: gate.go).
const (
	migrationTable       = "im_migration"
	migrationTopicsTable = "im_migration_topics"
	migrationSplitsTable = "im_migration_splits"
	migrationBatchTable  = "im_migration_batches"
	migrationDiffsTable  = "im_migration_diffs"
	migrationMonthsTable = "im_migration_months"
	migrationMirrorTable = "im_migration_mirror"
)

// MigrationState is where a tenant's migration stands.
type MigrationState string

// The states, in order. MigrationNone means no migration row: the tenant
// never migrated, or its plan was aborted.
const (
	MigrationNone        MigrationState = ""
	MigrationPlanned     MigrationState = "planned"
	MigrationCutover     MigrationState = "cutover"
	MigrationBackfilling MigrationState = "backfilling"
	MigrationPaused      MigrationState = "paused"
	MigrationVerifying   MigrationState = "verifying"
	MigrationDone        MigrationState = "done"
	MigrationFinished    MigrationState = "finished"
)

// String names the state ("none" for no migration).
func (s MigrationState) String() string {
	if s == MigrationNone {
		return "none"
	}
	return string(s)
}

// RefusesSends reports whether imshard refuses the tenant's sends: until
// cutover the old system writes the legacy table.
func (s MigrationState) RefusesSends() bool {
	return s == MigrationPlanned || s == MigrationCutover
}

// RefusesChanges reports whether imshard refuses recalls, edits and
// deletes: until cutover the old system owns the legacy rows. From then on
// a change of a legacy seq copies the row into its month table first and
// writes both in one transaction (CopyLegacyRow), so the dual read, the
// backfill and the verification all see the changed row.
func (s MigrationState) RefusesChanges() bool {
	return s.RefusesSends()
}

// DualRead reports whether reads include the legacy table.
func (s MigrationState) DualRead() bool {
	return s != MigrationNone && s != MigrationFinished
}

// AfterCutover reports whether every topic's cutover_seq is recorded.
func (s MigrationState) AfterCutover() bool {
	switch s {
	case MigrationBackfilling, MigrationPaused, MigrationVerifying, MigrationDone, MigrationFinished:
		return true
	}
	return false
}

// MigrationStep is one transition of the state machine.
type MigrationStep string

// The transitions (docs/migration.md has the table).
const (
	StepPlan       MigrationStep = "plan"       // none → planned (CLI plan)
	StepAbort      MigrationStep = "abort"      // planned → none (CLI abort)
	StepCutover    MigrationStep = "cutover"    // planned → cutover (CLI start)
	StepOpen       MigrationStep = "open"       // cutover → backfilling (CLI start, once cutover is recorded)
	StepPause      MigrationStep = "pause"      // backfilling → paused (CLI pause)
	StepResume     MigrationStep = "resume"     // paused → backfilling (CLI resume)
	StepBackfilled MigrationStep = "backfilled" // backfilling → verifying (module: copy, mirror and routes done)
	StepVerify     MigrationStep = "verify"     // verifying|done → verifying (CLI verify: run it again)
	StepVerified   MigrationStep = "verified"   // verifying → done (module: no difference)
	StepRedo       MigrationStep = "redo"       // verifying → backfilling (module: differences; copy their ranges again)
	StepFinish     MigrationStep = "finish"     // done → finished (CLI finish)
)

// MigrationTransitions is the state machine: the states each step leaves
// from, and the one it reaches.
var MigrationTransitions = []struct {
	Step MigrationStep
	From []MigrationState
	To   MigrationState
}{
	{StepPlan, []MigrationState{MigrationNone}, MigrationPlanned},
	{StepAbort, []MigrationState{MigrationPlanned}, MigrationNone},
	{StepCutover, []MigrationState{MigrationPlanned}, MigrationCutover},
	{StepOpen, []MigrationState{MigrationCutover}, MigrationBackfilling},
	{StepPause, []MigrationState{MigrationBackfilling}, MigrationPaused},
	{StepResume, []MigrationState{MigrationPaused}, MigrationBackfilling},
	{StepBackfilled, []MigrationState{MigrationBackfilling}, MigrationVerifying},
	{StepVerify, []MigrationState{MigrationVerifying, MigrationDone}, MigrationVerifying},
	{StepVerified, []MigrationState{MigrationVerifying}, MigrationDone},
	{StepRedo, []MigrationState{MigrationVerifying}, MigrationBackfilling},
	{StepFinish, []MigrationState{MigrationDone}, MigrationFinished},
}

// ErrMigrationState refuses a step the current state does not allow.
var ErrMigrationState = errors.New("migration state does not allow this")

// Migration is a tenant's migration row.
type Migration struct {
	State                              MigrationState
	Version                            int64
	LegacyRows, LegacyMinID, LegacyMax int64
	MinMonth, MaxMonth                 Month
	CursorID                           int64
	RowsRead, RowsInserted             int64
	RowsPresent, RowsSkewed            int64
	Batches, BatchFailures             int64
	LastError                          string
	RoutesDone, VerifyPending          bool
	VerifyRuns, RedoRounds             int
	VerifyDiffs                        int
	PlannedAt                          time.Time
	CutoverAt, OpenedAt                sql.NullTime
	BackfilledAt, VerifiedAt           sql.NullTime
	FinishedAt                         sql.NullTime
	UpdatedAt                          time.Time
	// the pace the copying process recorded with its last batch (rows/s):
	// its limit (0: unthrottled), the rate it achieved over the last
	// seconds with throttle waits, and its last batch's rate alone
	RateLimit, RateAchieved, RateBatch int
}

var migrationColumns = []string{"state", "version", "legacy_rows", "legacy_min_id", "legacy_max_id", "min_month",
	"max_month", "cursor_id", "rows_read", "rows_inserted", "rows_present", "rows_skewed", "batches", "batch_failures",
	"last_error", "routes_done", "verify_pending", "verify_runs", "redo_rounds", "verify_diffs", "planned_at",
	"cutover_at", "opened_at", "backfilled_at", "verified_at", "finished_at", "updated_at",
	"rate_limit", "rate_achieved", "rate_batch"}

// LoadMigration reads the tenant's migration (State MigrationNone if none).
func LoadMigration(ctx context.Context, db sq.BaseRunner) (Migration, error) {
	var m Migration
	var state string
	var minM, maxM, lastErr sql.NullString
	err := sq.Select(migrationColumns...).From(migrationTable).Where(sq.Eq{"id": 1}).RunWith(db).QueryRowContext(ctx).
		Scan(&state, &m.Version, &m.LegacyRows, &m.LegacyMinID, &m.LegacyMax, &minM, &maxM, &m.CursorID, &m.RowsRead,
			&m.RowsInserted, &m.RowsPresent, &m.RowsSkewed, &m.Batches, &m.BatchFailures, &lastErr, &m.RoutesDone,
			&m.VerifyPending, &m.VerifyRuns, &m.RedoRounds, &m.VerifyDiffs, &m.PlannedAt, &m.CutoverAt, &m.OpenedAt,
			&m.BackfilledAt, &m.VerifiedAt, &m.FinishedAt, &m.UpdatedAt, &m.RateLimit, &m.RateAchieved, &m.RateBatch)
	if errors.Is(err, sql.ErrNoRows) || IsNoSuchTable(err) {
		// no row, or a database whose schema predates the migration
		// tables: the tenant never migrated
		return Migration{}, nil
	}
	if err != nil {
		return Migration{}, fmt.Errorf("migration: load: %w", err)
	}
	m.State, m.LastError = MigrationState(state), lastErr.String
	if minM.Valid {
		m.MinMonth, _ = ParseMonth(minM.String)
	}
	if maxM.Valid {
		m.MaxMonth, _ = ParseMonth(maxM.String)
	}
	return m, nil
}

// MigrationPlan is what `plan` records.
type MigrationPlan struct {
	LegacyRows, LegacyMinID, LegacyMaxID int64
	MinMonth, MaxMonth                   Month
}

// PlanMigration records a plan: a new row in state planned, or the report
// of an existing plan refreshed (still planned). Any other state refuses.
func PlanMigration(ctx context.Context, db TxBeginner, p MigrationPlan) error {
	return Fenced(ctx, db, func(tx *sql.Tx) error { return planMigration(ctx, tx, p) })
}

func planMigration(ctx context.Context, tx *sql.Tx, p MigrationPlan) error {
	res, err := sq.Insert(migrationTable).Columns("id", "state", "legacy_rows", "legacy_min_id", "legacy_max_id",
		"min_month", "max_month", "planned_at").
		Values(1, string(MigrationPlanned), p.LegacyRows, p.LegacyMinID, p.LegacyMaxID, p.MinMonth.String(), p.MaxMonth.String(), sq.Expr("NOW(3)")).
		Suffix(`ON DUPLICATE KEY UPDATE
  legacy_rows = IF(state = 'planned', VALUES(legacy_rows), legacy_rows),
  legacy_min_id = IF(state = 'planned', VALUES(legacy_min_id), legacy_min_id),
  legacy_max_id = IF(state = 'planned', VALUES(legacy_max_id), legacy_max_id),
  min_month = IF(state = 'planned', VALUES(min_month), min_month),
  max_month = IF(state = 'planned', VALUES(max_month), max_month)`).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return fmt.Errorf("migration: plan: %w", err)
	}
	if _, err := res.RowsAffected(); err != nil {
		return err
	}
	m, err := LoadMigration(ctx, tx)
	if err != nil {
		return err
	}
	if m.State != MigrationPlanned {
		return fmt.Errorf("%w: plan needs no migration or a planned one, the tenant's is %s", ErrMigrationState, m.State)
	}
	return nil
}

// MigrationChange is what a step or an update records besides the state:
// each field that is set changes its columns, a zero field leaves them.
type MigrationChange struct {
	// Legacy records the legacy table's highest message_id and row count,
	// read when writes open: the bound of the backfill.
	Legacy *LegacyBounds
	// CursorID moves the backfill's cursor (the last copied message_id).
	CursorID *int64
	// Inserted adds rows copied outside a batch (a recopied difference).
	Inserted int64
	// Failure records a failed batch: one more batch failure, and its error.
	Failure string
	// Verified records a finished verification with the number of
	// differences it found.
	Verified *int
}

// LegacyBounds is the legacy table's highest message_id and row count.
type LegacyBounds struct{ MaxID, Rows int64 }

// migrationStamps are the columns a step sets by itself, whoever takes it.
var migrationStamps = map[MigrationStep][]migrationSet{
	StepCutover:    {{"cutover_at", sq.Expr("NOW(3)")}},
	StepOpen:       {{"opened_at", sq.Expr("NOW(3)")}},
	StepBackfilled: {{"routes_done", 1}, {"verify_pending", 1}, {"backfilled_at", sq.Expr("COALESCE(backfilled_at, NOW(3))")}},
	StepVerify:     {{"verify_pending", 1}},
	StepVerified:   {{"verified_at", sq.Expr("NOW(3)")}},
	StepRedo:       {{"redo_rounds", sq.Expr("redo_rounds + 1")}},
	StepFinish:     {{"finished_at", sq.Expr("NOW(3)")}},
}

type migrationSet struct {
	column string
	value  any
}

// sets lists the columns c changes.
func (c MigrationChange) sets() []migrationSet {
	var s []migrationSet
	if c.Legacy != nil {
		s = append(s, migrationSet{"legacy_max_id", c.Legacy.MaxID}, migrationSet{"legacy_rows", c.Legacy.Rows})
	}
	if c.CursorID != nil {
		s = append(s, migrationSet{"cursor_id", *c.CursorID})
	}
	if c.Inserted != 0 {
		s = append(s, migrationSet{"rows_inserted", sq.Expr("rows_inserted + ?", c.Inserted)})
	}
	if c.Failure != "" {
		s = append(s, migrationSet{"batch_failures", sq.Expr("batch_failures + 1")}, migrationSet{"last_error", c.Failure})
	}
	if c.Verified != nil {
		s = append(s, migrationSet{"verify_pending", 0}, migrationSet{"verify_runs", sq.Expr("verify_runs + 1")},
			migrationSet{"verify_diffs", *c.Verified})
	}
	return s
}

func setAll(u sq.UpdateBuilder, sets ...[]migrationSet) sq.UpdateBuilder {
	for _, ss := range sets {
		for _, s := range ss {
			u = u.Set(s.column, s.value)
		}
	}
	return u
}

// StepMigration applies step to the tenant's migration if its state allows
// it, with the step's own stamps and change applied in the same UPDATE;
// abort deletes the row and what the plan recorded.
func StepMigration(ctx context.Context, db *sql.DB, step MigrationStep, change MigrationChange) (Migration, error) {
	var from []MigrationState
	to := MigrationState("?")
	for _, t := range MigrationTransitions {
		if t.Step == step {
			from, to = t.From, t.To
		}
	}
	if to == "?" {
		return Migration{}, fmt.Errorf("migration: unknown step %q", step)
	}
	names := make([]string, len(from))
	for i, s := range from {
		names[i] = string(s)
	}
	var m Migration
	err := Fenced(ctx, db, func(tx *sql.Tx) error {
		var err error
		m, err = stepMigration(ctx, tx, step, names, to, change)
		return err
	})
	return m, err
}

func stepMigration(ctx context.Context, tx *sql.Tx, step MigrationStep, names []string, to MigrationState, change MigrationChange) (Migration, error) {
	var n int64
	if step == StepAbort {
		res, err := sq.Delete(migrationTable).Where(sq.Eq{"id": 1, "state": names}).RunWith(tx).ExecContext(ctx)
		if err != nil {
			return Migration{}, fmt.Errorf("migration: %s: %w", step, err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return Migration{}, err
		}
		if n == 1 {
			for _, t := range []string{migrationTopicsTable, migrationSplitsTable, migrationBatchTable, migrationDiffsTable, migrationMonthsTable, migrationMirrorTable} {
				if _, err := sq.Delete(t).RunWith(tx).ExecContext(ctx); err != nil {
					return Migration{}, fmt.Errorf("migration: abort: %w", err)
				}
			}
		}
	} else {
		u := setAll(sq.Update(migrationTable).Set("state", string(to)).Set("version", sq.Expr("version + 1")).
			Where(sq.Eq{"id": 1, "state": names}), migrationStamps[step], change.sets())
		res, err := u.RunWith(tx).ExecContext(ctx)
		if err != nil {
			return Migration{}, fmt.Errorf("migration: %s: %w", step, err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return Migration{}, err
		}
	}
	m, err := LoadMigration(ctx, tx)
	if err != nil {
		return Migration{}, err
	}
	if n == 0 {
		return m, fmt.Errorf("%w: %s needs state %s, the tenant's is %s", ErrMigrationState, step, strings.Join(names, " or "), m.State)
	}
	return m, nil
}

// SetMigration records change in the migration row without a state change,
// only while it is in one of states (none: any).
func SetMigration(ctx context.Context, tx *sql.Tx, change MigrationChange, states ...MigrationState) (bool, error) {
	u := sq.Update(migrationTable).Where(sq.Eq{"id": 1})
	if len(states) > 0 {
		names := make([]string, len(states))
		for i, s := range states {
			names[i] = string(s)
		}
		u = u.Where(sq.Eq{"state": names})
	}
	sets := change.sets()
	if len(sets) == 0 {
		return false, errors.New("migration: update: nothing to change")
	}
	res, err := setAll(u, sets).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return false, fmt.Errorf("migration: update: %w", err)
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// RestartBackfill puts a migration back to the start of its backfill, every
// counter zeroed (a benchmark's reset between rounds).
func RestartBackfill(ctx context.Context, tx *sql.Tx) error {
	u := sq.Update(migrationTable).Where(sq.Eq{"id": 1}).Set("state", string(MigrationBackfilling)).
		Set("version", sq.Expr("version + 1"))
	for _, c := range []string{"cursor_id", "rows_read", "rows_inserted", "rows_present", "rows_skewed", "batches",
		"routes_done", "verify_pending", "verify_runs", "redo_rounds", "verify_diffs"} {
		u = u.Set(c, 0)
	}
	if _, err := u.RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("migration: restart the backfill: %w", err)
	}
	return nil
}

// MigrationTopic is one topic of the legacy table at cutover.
type MigrationTopic struct {
	Topic      string
	CutoverSeq int64
	LegacyRows int64
}

// RecordCutoverTopics records every topic of the legacy table with its
// highest seq (its cutover_seq) and row count, straight from the legacy
// table; running it again gives the same rows (the legacy writers are
// stopped by then).
func RecordCutoverTopics(ctx context.Context, db TxBeginner) error {
	if err := Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := sq.Insert(migrationTopicsTable).Columns("topic", "cutover_seq", "legacy_rows").
			Select(sq.Select("topic COLLATE utf8mb4_bin", "MAX(seqid)", "COUNT(*)").From(LegacyQuoted()).
				GroupBy("topic COLLATE utf8mb4_bin")).
			Suffix("ON DUPLICATE KEY UPDATE cutover_seq = VALUES(cutover_seq), legacy_rows = VALUES(legacy_rows)").
			RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("migration: record cutover seqs: %w", err)
	}
	return nil
}

// MigrationTopics lists the recorded topics, sorted.
func MigrationTopics(ctx context.Context, db sq.BaseRunner) ([]MigrationTopic, error) {
	rows, err := sq.Select("topic", "cutover_seq", "legacy_rows").From(migrationTopicsTable).OrderBy("topic").
		RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration: topics: %w", err)
	}
	defer rows.Close()
	var out []MigrationTopic
	for rows.Next() {
		var t MigrationTopic
		if err := rows.Scan(&t.Topic, &t.CutoverSeq, &t.LegacyRows); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// CutoverSeq is topic's recorded cutover_seq (0: the topic has no legacy rows).
func CutoverSeq(ctx context.Context, db sq.BaseRunner, topic string) (int64, error) {
	var seq int64
	err := sq.Select("cutover_seq").From(migrationTopicsTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("migration: cutover seq of %s: %w", topic, err)
	}
	return seq, nil
}

// Split is where a topic's month starts: every legacy seq from FirstSeq up
// to the next month's FirstSeq - 1 goes to Month.
type Split struct {
	Month    Month
	FirstSeq int64
}

// SplitsOf assigns seqs to months: first is, per month of a topic's rows'
// created_at, the lowest seq created in it. A month starts at the first
// seq created in it or in any later month, so ranges stay contiguous under
// clock skew (a row created "back in" an earlier month after a later one
// began stays in the later month); a month all of whose rows follow a
// later month's first row gets no range.
func SplitsOf(first map[Month]int64) []Split {
	months := make([]Month, 0, len(first))
	for m := range first {
		months = append(months, m)
	}
	sortMonths(months)
	var out []Split
	lowest := int64(math.MaxInt64)
	for i := len(months) - 1; i >= 0; i-- {
		m := months[i]
		if first[m] < lowest {
			lowest = first[m]
			out = append(out, Split{Month: m, FirstSeq: lowest})
		}
	}
	// newest first → oldest first
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func sortMonths(ms []Month) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].Before(ms[j-1]); j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

// MonthOfSeq is the month splits (oldest first) assign seq to.
func MonthOfSeq(splits []Split, seq int64) Month {
	var m Month
	for _, s := range splits {
		if s.FirstSeq > seq {
			break
		}
		m = s.Month
	}
	if m.IsZero() && len(splits) > 0 {
		m = splits[0].Month
	}
	return m
}

// RecordSplits computes and records every topic's splits from the legacy
// table (one pass grouping it by topic and created_at month).
func RecordSplits(ctx context.Context, db *sql.DB) (int, error) {
	rows, err := sq.Select("topic COLLATE utf8mb4_bin", "DATE_FORMAT(created_at, '%Y%m')", "MIN(seqid)").
		From(LegacyQuoted()).GroupBy("1", "2").OrderBy("1", "2").RunWith(db).QueryContext(ctx)
	if err != nil {
		return 0, fmt.Errorf("migration: splits: %w", err)
	}
	all := map[string]map[Month]int64{}
	var order []string
	for rows.Next() {
		var topic, ms string
		var seq int64
		if err := rows.Scan(&topic, &ms, &seq); err != nil {
			_ = rows.Close()
			return 0, err
		}
		m, err := ParseMonth(ms)
		if err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("migration: splits of %s: %w", topic, err)
		}
		if all[topic] == nil {
			all[topic] = map[Month]int64{}
			order = append(order, topic)
		}
		all[topic][m] = seq
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, fmt.Errorf("migration: splits: %w", err)
	}
	const chunk = 1000
	cols := []string{"topic", "shard_month", "first_seq", "next_seq"}
	ins := sq.Insert(migrationSplitsTable).Columns(cols...)
	n, pending := 0, 0
	flush := func() error {
		if pending == 0 {
			return nil
		}
		err := Fenced(ctx, db, func(tx *sql.Tx) error {
			_, err := ins.Suffix("ON DUPLICATE KEY UPDATE first_seq = VALUES(first_seq), next_seq = VALUES(next_seq)").RunWith(tx).ExecContext(ctx)
			return err
		})
		ins, pending = sq.Insert(migrationSplitsTable).Columns(cols...), 0
		return err
	}
	for _, topic := range order {
		splits := SplitsOf(all[topic])
		for i, s := range splits {
			var next any
			if i+1 < len(splits) {
				next = splits[i+1].FirstSeq
			}
			ins = ins.Values(topic, s.Month.String(), s.FirstSeq, next)
			n++
			if pending++; pending == chunk {
				if err := flush(); err != nil {
					return n, fmt.Errorf("migration: record splits: %w", err)
				}
			}
		}
	}
	if err := flush(); err != nil {
		return n, fmt.Errorf("migration: record splits: %w", err)
	}
	return n, nil
}

// SplitsJoin joins the legacy table (as l) to the splits (as s) of the
// month each row's seq goes to: a batch copies with it on the server.
const SplitsJoin = migrationSplitsTable + " AS s ON s.topic = l.topic COLLATE utf8mb4_bin AND l.seqid >= s.first_seq AND (s.next_seq IS NULL OR l.seqid < s.next_seq)"

// LoadSplits reads the splits of topics (all topics when none are given),
// oldest month first per topic.
func LoadSplits(ctx context.Context, db sq.BaseRunner, topics []string) (map[string][]Split, error) {
	b := sq.Select("topic", "shard_month", "first_seq").From(migrationSplitsTable).OrderBy("topic", "shard_month")
	if len(topics) > 0 {
		b = b.Where(sq.Eq{"topic": topics})
	}
	rows, err := b.RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration: load splits: %w", err)
	}
	defer rows.Close()
	out := map[string][]Split{}
	for rows.Next() {
		var topic, ms string
		var s Split
		if err := rows.Scan(&topic, &ms, &s.FirstSeq); err != nil {
			return nil, err
		}
		if s.Month, err = ParseMonth(ms); err != nil {
			return nil, err
		}
		out[topic] = append(out[topic], s)
	}
	return out, rows.Err()
}

// MigrationBatch is one backfill batch's log row.
type MigrationBatch struct {
	FromID, ToID                  int64
	Read, Inserted, Present, Skew int
	Err                           string
	Started, Finished             time.Time
}

// MigrationRate is the pace a copying process records with a batch
// (rows/s): its limit (0: unthrottled), the rate it achieved over the last
// seconds with throttle waits, and the batch's rate alone.
type MigrationRate struct{ Limit, Achieved, Batch int }

// RecordMigrationBatch moves the backfill's cursor from b.FromID to b.ToID,
// adds b's counts, records the pace and logs b, in the batch's
// transaction, fenced by the cursor the batch started from and the
// backfilling state: false, with nothing written, when the migration was
// paused meanwhile or moved on by someone else.
func RecordMigrationBatch(ctx context.Context, tx *sql.Tx, b MigrationBatch, rate MigrationRate) (bool, error) {
	out, err := sq.Update(migrationTable).
		Set("rate_limit", rate.Limit).
		Set("rate_achieved", rate.Achieved).
		Set("rate_batch", rate.Batch).
		Set("cursor_id", b.ToID).
		Set("rows_read", sq.Expr("rows_read + ?", b.Read)).
		Set("rows_inserted", sq.Expr("rows_inserted + ?", b.Inserted)).
		Set("rows_present", sq.Expr("rows_present + ?", b.Present)).
		Set("rows_skewed", sq.Expr("rows_skewed + ?", b.Skew)).
		Set("batches", sq.Expr("batches + 1")).
		Where(sq.Eq{"id": 1, "cursor_id": b.FromID, "state": string(MigrationBackfilling)}).
		RunWith(tx).ExecContext(ctx)
	if err != nil {
		return false, fmt.Errorf("migration: record batch: %w", err)
	}
	if n, err := out.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	return true, LogMigrationBatch(ctx, tx, b)
}

// LogMigrationBatch records a batch (in the batch's transaction when it
// committed, on its own when it failed).
func LogMigrationBatch(ctx context.Context, tx *sql.Tx, b MigrationBatch) error {
	var e any
	if b.Err != "" {
		e = truncate(b.Err, 500)
	}
	_, err := sq.Insert(migrationBatchTable).Columns("from_id", "to_id", "rows_read", "rows_inserted", "rows_present",
		"rows_skewed", "error", "started_at", "finished_at").
		Values(b.FromID, b.ToID, b.Read, b.Inserted, b.Present, b.Skew, e, b.Started, b.Finished).RunWith(tx).ExecContext(ctx)
	if err != nil {
		return fmt.Errorf("migration: log batch: %w", err)
	}
	return nil
}

// LastMigrationBatchID is the id of the newest logged batch (0: none).
func LastMigrationBatchID(ctx context.Context, db sq.BaseRunner) (int64, error) {
	var id int64
	if err := sq.Select("COALESCE(MAX(id), 0)").From(migrationBatchTable).RunWith(db).QueryRowContext(ctx).Scan(&id); err != nil {
		return 0, fmt.Errorf("migration: last batch: %w", err)
	}
	return id, nil
}

// CommittedMigrationBatches lists the committed (not failed) batches logged
// after the batch with id after, oldest first: their rows read and times.
func CommittedMigrationBatches(ctx context.Context, db sq.BaseRunner, after int64) ([]MigrationBatch, error) {
	rows, err := sq.Select("from_id", "to_id", "rows_read", "started_at", "finished_at").From(migrationBatchTable).
		Where(sq.Gt{"id": after}).Where("error IS NULL").OrderBy("id").RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration: batches: %w", err)
	}
	defer rows.Close()
	var out []MigrationBatch
	for rows.Next() {
		var b MigrationBatch
		if err := rows.Scan(&b.FromID, &b.ToID, &b.Read, &b.Started, &b.Finished); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// MigrationDiff is one topic month where the verification found the month
// table to differ from the legacy table.
type MigrationDiff struct {
	Topic                 string
	Month                 Month
	MinSeq, MaxSeq        int64
	LegacyRows, MonthRows int64
	LegacyHash, MonthHash string
}

// ReplaceMigrationDiffs makes the recorded differences exactly diffs.
func ReplaceMigrationDiffs(ctx context.Context, db *sql.DB, diffs []MigrationDiff) error {
	return Fenced(ctx, db, func(tx *sql.Tx) error { return replaceMigrationDiffs(ctx, tx, diffs) })
}

func replaceMigrationDiffs(ctx context.Context, tx *sql.Tx, diffs []MigrationDiff) error {
	if _, err := sq.Delete(migrationDiffsTable).RunWith(tx).ExecContext(ctx); err != nil {
		return fmt.Errorf("migration: clear diffs: %w", err)
	}
	for lo := 0; lo < len(diffs); lo += 500 {
		ins := sq.Insert(migrationDiffsTable).Columns("topic", "shard_month", "min_seq", "max_seq", "legacy_rows",
			"month_rows", "legacy_hash", "month_hash")
		for _, d := range diffs[lo:min(lo+500, len(diffs))] {
			ins = ins.Values(d.Topic, d.Month.String(), d.MinSeq, d.MaxSeq, d.LegacyRows, d.MonthRows, d.LegacyHash, d.MonthHash)
		}
		if _, err := ins.RunWith(tx).ExecContext(ctx); err != nil {
			return fmt.Errorf("migration: record diffs: %w", err)
		}
	}
	return nil
}

// LoadMigrationDiffs lists the recorded differences (at most limit; 0: all).
func LoadMigrationDiffs(ctx context.Context, db sq.BaseRunner, limit uint64) ([]MigrationDiff, error) {
	b := sq.Select("topic", "shard_month", "min_seq", "max_seq", "legacy_rows", "month_rows", "legacy_hash", "month_hash").
		From(migrationDiffsTable).OrderBy("topic", "shard_month")
	if limit > 0 {
		b = b.Limit(limit)
	}
	rows, err := b.RunWith(db).QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration: diffs: %w", err)
	}
	defer rows.Close()
	var out []MigrationDiff
	for rows.Next() {
		var d MigrationDiff
		var ms string
		if err := rows.Scan(&d.Topic, &ms, &d.MinSeq, &d.MaxSeq, &d.LegacyRows, &d.MonthRows, &d.LegacyHash, &d.MonthHash); err != nil {
			return nil, err
		}
		d.Month, _ = ParseMonth(ms)
		out = append(out, d)
	}
	return out, rows.Err()
}

// LegacyQuoted is the legacy table's name as a backquoted identifier.
func LegacyQuoted() string { return "`" + LegacyTable + "`" }

// LegacyExists reports whether the tenant database still has the legacy
// table under its original name.
func LegacyExists(ctx context.Context, db sq.BaseRunner) (bool, error) {
	var n int
	if err := sq.Select("COUNT(*)").From("information_schema.TABLES").
		Where(sq.Expr("TABLE_SCHEMA = DATABASE()")).Where(sq.Eq{"TABLE_NAME": LegacyTable}).
		RunWith(db).QueryRowContext(ctx).Scan(&n); err != nil {
		return false, fmt.Errorf("migration: legacy table: %w", err)
	}
	return n > 0, nil
}

// RenameLegacy renames the legacy table to its read-only name (finish).
func RenameLegacy(ctx context.Context, db *sql.DB) error {
	if err := FencedDDL(ctx, db, "RENAME TABLE "+LegacyQuoted()+" TO `"+LegacyRenamedTable+"`"); err != nil {
		return fmt.Errorf("migration: rename %s: %w", LegacyTable, err)
	}
	return nil
}

// MigrationRefresh is how often a process re-reads a tenant's migration
// state. The copy serves the dual read and narrows the write gate (a state
// that refuses writes is refused without a Redis call); what lets a write
// through is the gate in Redis (ConvergeMigrationGate), never the copy's
// age.
const MigrationRefresh = time.Second

// MigrationStaleAfter is how old a process's copy of a tenant's migration
// state may grow (its refreshes failing) before the process refuses the
// tenant's sends and changes rather than decide on it.
const MigrationStaleAfter = 3 * MigrationRefresh

// MigrationPinnedEnv is a hook for the tests, honoured only by a binary
// built with the build tag imshard_testhooks (migration_hook.go): with
// IMSHARD_TEST_MIGRATION_PINNED=1 the process keeps the first migration
// state it read of each tenant while its refreshes go on succeeding — a
// process lagging behind a state change, held there for as long as a test
// needs. A shipped binary never reads it.
const MigrationPinnedEnv = "IMSHARD_TEST_MIGRATION_PINNED"

// TenantDBs are the tenants' pools that also say which tenants the
// configuration names now (a reload may remove one).
type TenantDBs interface {
	DBs
	Has(tenant string) bool
}

// Migrations is the in-process cache of every tenant's migration state:
// the dual read and the write gate's first, local check consult it without
// a round trip. Run refreshes the tenants asked about from MySQL every
// MigrationRefresh, and forgets a tenant the configuration no longer names;
// a tenant's first question reads MySQL once.
type Migrations struct {
	dbs    TenantDBs
	rdb    rueidis.Client
	space  KeySpace
	lib    *FencedLib
	log    zerolog.Logger
	every  time.Duration
	stale  time.Duration
	now    func() time.Time
	pinned bool // MigrationPinnedEnv

	mu     sync.RWMutex
	states map[string]migrationCopy
	loads  singleflight.Group

	// cutover seqs never change once recorded: kept per tenant and topic
	seqs *lru.Cache[[2]string, int64]
}

// migrationCopy is a tenant's state as read from MySQL at readAt (the
// moment the read began).
type migrationCopy struct {
	state  MigrationState
	readAt time.Time
}

// NewMigrations builds the cache; rdb, space and scripts reach the gate in
// Redis (GateChange).
func NewMigrations(dbs TenantDBs, rdb rueidis.Client, space KeySpace, scripts *Scripts, log zerolog.Logger) *Migrations {
	c, err := lru.New[[2]string, int64](100_000)
	if err != nil {
		panic(err)
	}
	return &Migrations{dbs: dbs, rdb: rdb, space: space, lib: scripts.Fenced, log: log, every: MigrationRefresh,
		stale: MigrationStaleAfter, now: time.Now, pinned: migrationPinnedFromEnv(),
		states: map[string]migrationCopy{}, seqs: c}
}

// State is the tenant's migration state as this process last read it,
// however long ago: reads may use an old copy (the dual read is bounded
// either way), writes go through fresh (see fresh).
func (g *Migrations) State(ctx context.Context, tenant string) (MigrationState, error) {
	g.mu.RLock()
	c, ok := g.states[tenant]
	g.mu.RUnlock()
	if ok {
		return c.state, nil
	}
	return g.reload(ctx, tenant)
}

// fresh is the tenant's state for a write: the copy while it is younger
// than the stale bound, else read again now; a state that cannot be read
// refuses the write (ErrMigrationStateUnknown), it never lets it through
// on an old copy.
func (g *Migrations) fresh(ctx context.Context, tenant string) (MigrationState, error) {
	g.mu.RLock()
	c, ok := g.states[tenant]
	g.mu.RUnlock()
	if ok && g.now().Sub(c.readAt) <= g.stale {
		return c.state, nil
	}
	s, err := g.reload(ctx, tenant)
	if err != nil {
		return MigrationNone, &ErrMigrationStateUnknown{Err: err}
	}
	return s, nil
}

// reload reads the tenant's state from MySQL, once for concurrent callers.
func (g *Migrations) reload(ctx context.Context, tenant string) (MigrationState, error) {
	v, err, _ := g.loads.Do(tenant, func() (any, error) { return g.load(ctx, tenant) })
	if err != nil {
		return MigrationNone, err
	}
	return v.(MigrationState), nil
}

func (g *Migrations) load(ctx context.Context, tenant string) (MigrationState, error) {
	at := g.now()
	db, err := g.dbs.DB(ctx, tenant)
	if err != nil {
		return MigrationNone, err
	}
	m, err := LoadMigration(ctx, db)
	if err != nil {
		return MigrationNone, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, ok := g.states[tenant]; ok && g.pinned {
		m.State = old.state
	}
	g.states[tenant] = migrationCopy{state: m.State, readAt: at}
	return m.State, nil
}

// Run refreshes the known tenants until ctx ends.
func (g *Migrations) Run(ctx context.Context) {
	t := time.NewTicker(g.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.refresh(ctx)
	}
}

// refresh reads every known tenant's state again. A tenant the
// configuration no longer names is forgotten instead: its pool is gone, so
// a read could only fail, once a refresh period, for as long as the process
// runs; a question about it afterwards fails as for any unknown tenant.
func (g *Migrations) refresh(ctx context.Context) {
	g.mu.RLock()
	tenants := make([]string, 0, len(g.states))
	for k := range g.states {
		tenants = append(tenants, k)
	}
	g.mu.RUnlock()
	for _, tenant := range tenants {
		if !g.dbs.Has(tenant) {
			g.mu.Lock()
			delete(g.states, tenant)
			g.mu.Unlock()
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, g.every)
		if _, err := g.load(rctx, tenant); err != nil && ctx.Err() == nil {
			g.log.Warn().Err(err).Str("tenant", tenant).Dur("stale_after", g.stale).
				Msg("migration state refresh failed; the tenant's sends and changes are refused once the last state read is older than stale_after")
		}
		cancel()
	}
}

// ErrMigrationPending refuses a write while the tenant's migration does
// not allow it; its Details name the state.
type ErrMigrationPending struct{ State MigrationState }

func (e *ErrMigrationPending) Error() string {
	return "the tenant is being migrated from its legacy table (state " + e.State.String() + "): try again once the migration allows it"
}

// ErrMigrationStateUnknown refuses a write because the process could not
// read the tenant's migration state (its copy is older than
// MigrationStaleAfter and MySQL did not answer): retry.
type ErrMigrationStateUnknown struct{ Err error }

func (e *ErrMigrationStateUnknown) Error() string {
	return "the tenant's migration state cannot be read right now: try again"
}

func (e *ErrMigrationStateUnknown) Unwrap() error { return e.Err }

// GateSend refuses a send while this process's copy of the tenant's
// migration refuses them, or is too old to tell. It only narrows: the send
// call itself reads the gate in Redis (lua/fenced.lua), which refuses a
// send the copy, lagging behind a command, would let through.
func (g *Migrations) GateSend(ctx context.Context, tenant string) error {
	if g == nil {
		return nil
	}
	s, err := g.fresh(ctx, tenant)
	if err != nil {
		return err
	}
	if s.RefusesSends() {
		return &ErrMigrationPending{State: s}
	}
	return nil
}

// GateChange refuses a recall, edit or delete while the tenant's migration
// refuses them: this process's copy first (too old to tell refuses too),
// then the gate in Redis, as a send's call reads it — a gate that is
// missing, stale or refusing is converged with MySQL, whose state decides.
// A gate that cannot be read or converged refuses too.
func (g *Migrations) GateChange(ctx context.Context, tenant string) error {
	if g == nil {
		return nil
	}
	s, err := g.fresh(ctx, tenant)
	if err != nil {
		return err
	}
	if s.RefusesChanges() {
		return &ErrMigrationPending{State: s}
	}
	if s, err = g.gateForChange(ctx, tenant); err != nil {
		return &ErrMigrationStateUnknown{Err: err}
	}
	if s.RefusesChanges() {
		return &ErrMigrationPending{State: s}
	}
	return nil
}

// gateForChange is the state the gate in Redis lets a change through on:
// MigrationNone for an open gate (its state name is not needed), else the
// state MySQL holds once the gate is converged with it.
func (g *Migrations) gateForChange(ctx context.Context, tenant string) (MigrationState, error) {
	keys, err := g.space.Tenant(tenant)
	if err != nil {
		return MigrationNone, err
	}
	n, have, err := readGate(ctx, g.rdb, g.lib, []string{keys.MigrationGate()})
	if err != nil {
		return MigrationNone, fmt.Errorf("migration gate of %s: %w", tenant, err)
	}
	if gateAllows(n, have) {
		return MigrationNone, nil
	}
	db, err := g.dbs.DB(ctx, tenant)
	if err != nil {
		return MigrationNone, err
	}
	return ConvergeMigrationGate(ctx, g.rdb, g.lib, g.space, db, tenant)
}

// DualRead reports whether the tenant's reads include the legacy table
// now (reads that know no topic: a message found by its id).
func (g *Migrations) DualRead(ctx context.Context, tenant string) (bool, error) {
	if g == nil {
		return false, nil
	}
	s, err := g.State(ctx, tenant)
	return s.DualRead(), err
}

// LegacySource is the legacy table as one more bounded source of a topic's
// reads: it holds the seqs up to Hi; with Split the month tables are read
// only above Hi (after cutover), without it (before cutover, Hi unbounded)
// both are read and merged. Hi 0: no legacy source.
type LegacySource struct {
	Hi    int64
	Split bool
}

// Legacy is topic's legacy source for a read now.
func (g *Migrations) Legacy(ctx context.Context, tenant, topic string) (LegacySource, error) {
	if g == nil {
		return LegacySource{}, nil
	}
	s, err := g.State(ctx, tenant)
	if err != nil || !s.DualRead() {
		return LegacySource{}, err
	}
	if !s.AfterCutover() {
		return LegacySource{Hi: math.MaxInt64}, nil
	}
	k := [2]string{tenant, topic}
	if seq, ok := g.seqs.Get(k); ok {
		return LegacySource{Hi: seq, Split: true}, nil
	}
	db, err := g.dbs.DB(ctx, tenant)
	if err != nil {
		return LegacySource{}, err
	}
	seq, err := CutoverSeq(ctx, db, topic)
	if err != nil {
		return LegacySource{}, err
	}
	g.seqs.Add(k, seq)
	return LegacySource{Hi: seq, Split: true}, nil
}
