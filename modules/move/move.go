// Package move moves a live tenant's database to another MySQL server:
// plan, copy in primary key chunks, each checksummed over the rows its copy
// read (a CRC-64 this process computes as the rows stream by), each table
// nobody writes (a sealed month) proven whole right after its copy by
// CHECKSUM TABLE on both servers, catch up on the chunks whose checksum
// changed, verify every chunk not proven (a table nobody wrote since the
// marks were cleared whole by CHECKSUM TABLE on both servers; a chunk
// nobody wrote since its source checksum was recorded on the target
// only), then switch behind the fence (the source refuses
// writers of the old epoch): copy and verify only the rows changed since
// the verification (marked by triggers on the source), and write the new
// placement record. Its state lives in the source database (im_tenant_move,
// im_tenant_move_chunks, im_tenant_move_marks); every step can be re-run, so a
// mover killed at any point is resumed by running it again. A reverse move
// is the same move from a done move's target back onto the copy its source
// kept: only the chunks that differ are copied.
package move

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/modules/testhook"
	imsql "github.com/imshard/imshard/sql"
)

// Steps of a move, in order; cancelling and cancelled end it before the
// switch, finished after `finish` dropped the source. verify compares
// every chunk on both servers before the switch, with nothing held;
// precheck runs the switch's pre-checks (one more catch-up round) and
// copies the rows marked since, still with nothing held, so a cancel
// there cancels. switch begins as the pre-checks pass and raises the fence.
const (
	StepPlan       = "plan"
	StepCopy       = "copy"
	StepCatchUp    = "catchup"
	StepVerify     = "verify"
	StepPreCheck   = "precheck"
	StepSwitch     = "switch"
	StepDone       = "done"
	StepCancelling = "cancelling"
	StepCancelled  = "cancelled"
	StepFinished   = "finished"
)

// The parts StepHook is called at, beside the steps, in order: the copy
// step's proof of a table it copied begins and ends (once per table of two
// chunks or more: proveTable; beside the copy of the next tables, so
// between the copy step's other parts), the copy step copied every chunk
// (from then on it waits for the proofs still running), the verification
// step compared every chunk, the pre-checks passed (the step not yet
// switch), the switch's source fence is up, and the copy and verification
// behind it are done.
const (
	HookProving    = "proving"
	HookProven     = "proven"
	HookCopied     = "copied"
	HookVerified   = "verified"
	HookPreChecked = "prechecked"
	HookFenced     = "fenced"
	HookSynced     = "synced"
)

// Errors a caller tells apart.
var (
	ErrBusy      = errors.New("move: another mover runs this tenant's move")
	ErrNoMove    = errors.New("move: no move of this tenant")
	ErrCancelled = errors.New("move: cancelled")
	// ErrReverseRefused is a reverse the pre-checks refused: nothing changed.
	ErrReverseRefused = errors.New("move: reverse refused")
	// ErrHalfSwitched refuses cancel, finish, reverse and a new move while
	// a switch is half done: the target's row says the switch, so the
	// placement record may already name the target while the move's end is
	// not recorded. Only resume completes it.
	ErrHalfSwitched = errors.New("move: the switch is half done")
	// ErrLastMoveOpen refuses a new move of a tenant whose last move is
	// neither finished nor cancelled: its other copy still stands, and
	// cancel, finish and reverse know one move only.
	ErrLastMoveOpen = errors.New("move: the tenant's last move is neither finished nor cancelled")
)

// Options tune a move.
type Options struct {
	ChunkRows int         // rows per chunk (default 2000)
	TLS       *tls.Config // as mysql.tls, for both servers
	// CatchUpRounds bounds the catch-up rounds before the switch (default 5);
	// the switch's own final catch-up copies what is left.
	CatchUpRounds int
	// MaxSwitchLag is the most chunks the last catch-up round before the
	// switch may find changed (default DefaultMaxSwitchLag); more refuses
	// the switch (ErrSwitchRefused).
	MaxSwitchLag int
	// StepHook, when set, is called as each step begins and at the parts
	// of the copy, the verification and the switch: HookProving and
	// HookProven (a copied table's proof begins and ends, beside the
	// copy), HookCopied (every chunk copied; the proofs still running
	// waited for until the step ends), HookVerified
	// (every chunk compared), HookFenced (the source fence is up) and
	// HookSynced (the copy and verification behind it are done).
	// Tests stop a mover there; `imshard bench move` times the parts.
	// HookPreChecked (the pre-checks passed, the step is still precheck),
	// HookFenced and HookSynced are the switch's. The mover makes one
	// call at a time.
	StepHook func(step string) error
}

// State is the move's row.
type State struct {
	Role        string    `json:"role"`
	Peer        string    `json:"-"`
	PeerServer  string    `json:"peer"`
	Step        string    `json:"step"`
	FromEpoch   int64     `json:"from_epoch"`
	Reverse     bool      `json:"reverse"`
	Paused      bool      `json:"paused"`
	RowsCopied  int64     `json:"rows_copied"`
	BytesCopied int64     `json:"bytes_copied"`
	SwitchMS    int64     `json:"switch_ms"`
	Note        string    `json:"note,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	Chunks      int64     `json:"chunks"`
	Lag         int64     `json:"lag_chunks"`
	Tables      int64     `json:"tables"`
}

// Server names the peer's host:port/database (never its password).
func (s State) Server() string { return serverOf(s.Peer) }

// HalfSwitched is a target's row written by a switch that has not
// recorded its end: the placement record may name this database or not
// yet, and only resume may act on the move.
func (s State) HalfSwitched() bool { return s.Role == "target" && s.Step == StepSwitch }

// halfSwitched is the error of an action refused on a half-done switch.
func halfSwitched(tenant string, st State) error {
	return fmt.Errorf("%w: tenant %s was switched from %s and the move's end is not recorded; resume the move to complete it, then act on it",
		ErrHalfSwitched, tenant, st.PeerServer)
}

// Mover drives one tenant's move.
type Mover struct {
	tenant   string
	src, dst *sql.DB
	dstCfg   *mysql.Config
	srcDSN   string
	dstDSN   string
	st       State
	store    *placement.Store
	o        Options
	lock     *sql.Conn
	work     SwitchWork
	hookMu   sync.Mutex
}

// OpenDB opens a database handle for the move: strict, UTC, and times kept
// as the server's text so rows are copied byte for byte.
func OpenDB(dsn string, tlsCfg *tls.Config, withDB bool) (*sql.DB, *mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("move: dsn: %w", err)
	}
	if cfg.DBName == "" || strings.ContainsAny(cfg.DBName, "`\x00") {
		return nil, nil, fmt.Errorf("move: dsn of %s names no plain database", cfg.Addr)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	cfg.Params["sql_mode"] = "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"
	cfg.ParseTime, cfg.InterpolateParams = false, false
	cfg.Timeout = 5 * time.Second
	if tlsCfg != nil {
		cfg.TLS = tlsCfg.Clone()
	}
	open := cfg.Clone()
	if !withDB {
		open.DBName = ""
	}
	conn, err := mysql.NewConnector(open)
	if err != nil {
		return nil, nil, err
	}
	db := sql.OpenDB(conn)
	// the mover's lock holds one; the verification reads verifyWorkers
	// chunks at once
	db.SetMaxOpenConns(verifyWorkers + 4)
	return db, cfg, nil
}

// Begin opens the move of tenant from its current placement to the
// database dsn names, creating its state on the source, or returns the
// move already under way to the same target.
func Begin(ctx context.Context, tenant string, from tenantdb.Placement, to string, store *placement.Store, o Options) (*Mover, error) {
	m, err := open(ctx, tenant, from, to, store, o)
	if err != nil {
		return nil, err
	}
	if err := m.claim(ctx, from, to, false); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Reverse opens the move of a tenant whose move is done (its current
// placement the move's target) back onto the copy the move's source kept,
// or returns the reverse already under way. It refuses (ErrReverseRefused)
// when that copy cannot take the tenant back: finished (dropped), not
// reachable, not the copy this move left, or at another schema version.
func Reverse(ctx context.Context, tenant string, at tenantdb.Placement, store *placement.Store, o Options) (*Mover, error) {
	st, err := ReadState(ctx, at.DSN, o.TLS)
	if err != nil {
		return nil, err
	}
	switch {
	case st.HalfSwitched():
		return nil, fmt.Errorf("%w: %w", ErrReverseRefused, halfSwitched(tenant, st))
	case st.Role == "source" && st.Reverse && st.Step != StepCancelled:
		return Begin(ctx, tenant, at, st.Peer, store, o)
	case st.Role != "target":
		return nil, fmt.Errorf("%w: the move of %s is at %s on this database; reverse only follows a switch", ErrReverseRefused, tenant, st.Step)
	case st.Step == StepFinished:
		return nil, fmt.Errorf("%w: the move of %s was finished: its source copy on %s is dropped", ErrReverseRefused, tenant, st.PeerServer)
	}
	m, err := open(ctx, tenant, at, st.Peer, store, o)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReverseRefused, err)
	}
	if err := m.reverseReady(ctx); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.claim(ctx, at, st.Peer, true); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// open connects a mover of tenant from its placement to the database to
// names (never the source itself).
func open(ctx context.Context, tenant string, from tenantdb.Placement, to string, store *placement.Store, o Options) (*Mover, error) {
	if o.ChunkRows <= 0 {
		o.ChunkRows = 2000
	}
	if o.CatchUpRounds <= 0 {
		o.CatchUpRounds = 5
	}
	if o.MaxSwitchLag <= 0 {
		o.MaxSwitchLag = DefaultMaxSwitchLag
	}
	src, _, err := OpenDB(from.DSN, o.TLS, true)
	if err != nil {
		return nil, err
	}
	dst, dstCfg, err := OpenDB(to, o.TLS, true)
	if err != nil {
		src.Close()
		return nil, err
	}
	if err := notItself(ctx, src, to, o.TLS); err != nil {
		src.Close()
		dst.Close()
		return nil, err
	}
	return &Mover{tenant: tenant, src: src, dst: dst, dstCfg: dstCfg, srcDSN: from.DSN, dstDSN: to, store: store, o: o}, nil
}

// Resume opens the move recorded on the tenant's current placement. A
// half-done switch (the placement already names the target) is the move
// recorded on its source: the mover opens there and completes it.
func Resume(ctx context.Context, tenant string, at tenantdb.Placement, store *placement.Store, o Options) (*Mover, error) {
	st, err := ReadState(ctx, at.DSN, o.TLS)
	if err != nil {
		return nil, err
	}
	if st.HalfSwitched() {
		return Begin(ctx, tenant, tenantdb.Placement{DSN: st.Peer, Epoch: st.FromEpoch}, at.DSN, store, o)
	}
	if st.Role != "source" {
		return nil, fmt.Errorf("move: the move of %s is %s (on its target)", tenant, st.Step)
	}
	return Begin(ctx, tenant, at, st.Peer, store, o)
}

// Close releases the handles (and the mover's lock: released before its
// connection goes, so a mover opened right after finds it free, not held
// until the server notices the connection closed).
func (m *Mover) Close() {
	if m.lock != nil {
		_, _ = m.lock.ExecContext(context.Background(), "DO RELEASE_LOCK(CONCAT('imshard_move:', DATABASE()))")
		_ = m.lock.Close()
	}
	_ = m.src.Close()
	_ = m.dst.Close()
}

func serverOf(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "?"
	}
	return cfg.Addr + "/" + cfg.DBName
}

// claim takes the mover's lock on the source and records the move there
// (a reverse one when reverse is set).
func (m *Mover) claim(ctx context.Context, from tenantdb.Placement, to string, reverse bool) error {
	c, err := m.src.Conn(ctx)
	if err != nil {
		return fmt.Errorf("move: source: %w", err)
	}
	var got sql.NullInt64
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('imshard_move:', DATABASE()), 0)").Scan(&got); err != nil {
		c.Close()
		return fmt.Errorf("move: source: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		c.Close()
		return ErrBusy
	}
	m.lock = c
	st, err := readState(ctx, m.src)
	switch {
	case errors.Is(err, ErrNoMove):
	case err != nil:
		return err
	case st.HalfSwitched():
		return halfSwitched(m.tenant, st)
	case st.Role == "target" && st.Step != StepFinished && !reverse:
		// a reverse follows the move; a new move waits for its end
		return fmt.Errorf("%w: tenant %s's move from %s is %s: finish it (drops that copy) or reverse it first",
			ErrLastMoveOpen, m.tenant, st.PeerServer, st.Step)
	case st.Role == "source" && st.Step != StepCancelled:
		if serverOf(st.Peer) != serverOf(to) {
			return fmt.Errorf("%w: tenant %s is already moving to %s (%s); cancel it first", ErrLastMoveOpen, m.tenant, serverOf(st.Peer), st.Step)
		}
		m.st = st
		return nil
	}
	// noted first: the shard manager exports the moves of noted tenants only
	if err := m.store.NoteMove(ctx, m.tenant); err != nil {
		return fmt.Errorf("move: note the move on the placement servers: %w", err)
	}
	if _, err := m.src.ExecContext(ctx, "DELETE FROM im_tenant_move_chunks"); err != nil {
		return err
	}
	if _, err := m.src.ExecContext(ctx, `REPLACE INTO im_tenant_move (id, role, peer_dsn, step, from_epoch, reverse, started_at)
		VALUES (1, 'source', ?, ?, ?, ?, CURRENT_TIMESTAMP(3))`, to, StepPlan, from.Epoch, reverse); err != nil {
		return fmt.Errorf("move: record: %w", err)
	}
	m.st, err = readState(ctx, m.src)
	return err
}

// ReadState reads the move recorded on the database dsn names.
func ReadState(ctx context.Context, dsn string, tlsCfg *tls.Config) (State, error) {
	db, _, err := OpenDB(dsn, tlsCfg, true)
	if err != nil {
		return State{}, err
	}
	defer db.Close()
	return readState(ctx, db)
}

// Moving reports whether the tenant database db is in a move between its
// plan and its switch (either direction): its month tables are being
// copied and caught up, so nothing may remove or replace one meanwhile
// (the shard manager's retention and archive wait for the move).
func Moving(ctx context.Context, db *sql.DB) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move WHERE id = 1 AND step IN (?, ?, ?, ?, ?, ?)",
		StepPlan, StepCopy, StepCatchUp, StepVerify, StepPreCheck, StepSwitch).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("move: read step: %w", err)
	}
	return n > 0, nil
}

func readState(ctx context.Context, db *sql.DB) (State, error) {
	var st State
	var started, updated string
	err := db.QueryRowContext(ctx, `SELECT role, peer_dsn, step, from_epoch, reverse, paused, rows_copied, bytes_copied, switch_ms, note,
		DATE_FORMAT(started_at, '%Y-%m-%dT%H:%i:%s.%fZ'), DATE_FORMAT(updated_at, '%Y-%m-%dT%H:%i:%s.%fZ') FROM im_tenant_move WHERE id = 1`).
		Scan(&st.Role, &st.Peer, &st.Step, &st.FromEpoch, &st.Reverse, &st.Paused, &st.RowsCopied, &st.BytesCopied, &st.SwitchMS, &st.Note, &started, &updated)
	if err == sql.ErrNoRows {
		return st, ErrNoMove
	}
	if err != nil {
		return st, fmt.Errorf("move: read state: %w", err)
	}
	st.StartedAt, _ = time.Parse("2006-01-02T15:04:05.000000Z", started)
	st.UpdatedAt, _ = time.Parse("2006-01-02T15:04:05.000000Z", updated)
	st.PeerServer = serverOf(st.Peer)
	if st.Role == "source" {
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(copied = 0), 0), COUNT(DISTINCT table_name) FROM im_tenant_move_chunks`).
			Scan(&st.Chunks, &st.Lag, &st.Tables); err != nil {
			return st, fmt.Errorf("move: read chunks: %w", err)
		}
	}
	return st, nil
}

// SetPaused sets the flag the mover checks between chunks.
func SetPaused(ctx context.Context, dsn string, tlsCfg *tls.Config, paused bool) error {
	db, _, err := OpenDB(dsn, tlsCfg, true)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := db.ExecContext(ctx, "UPDATE im_tenant_move SET paused = ? WHERE id = 1 AND role = 'source'", paused)
	if err != nil {
		return fmt.Errorf("move: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := readState(ctx, db); err != nil {
			return err
		}
	}
	return nil
}

// setStep moves the recorded step from the mover's to step, only if it is
// still the mover's: a cancel that set cancelling meanwhile wins
// (ErrCancelled), never overwritten — the two are one conditional UPDATE
// each on the same row, so exactly one of them takes effect.
func (m *Mover) setStep(ctx context.Context, step string) error {
	res, err := m.src.ExecContext(ctx, "UPDATE im_tenant_move SET step = ? WHERE id = 1 AND step = ?", step, m.st.Step)
	if err != nil {
		return fmt.Errorf("move: record step %s: %w", step, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		var cur string
		if err := m.src.QueryRowContext(ctx, "SELECT step FROM im_tenant_move WHERE id = 1").Scan(&cur); err != nil {
			return fmt.Errorf("move: record step %s: %w", step, err)
		}
		switch cur {
		case step:
		case StepCancelling, StepCancelled:
			return ErrCancelled
		default:
			return fmt.Errorf("move: record step %s: the move is at %s, not %s", step, cur, m.st.Step)
		}
	}
	m.st.Step = step
	return nil
}

// hook calls Options.StepHook, when set, at step: one call at a time
// (the copy step's proofs run beside its copy).
func (m *Mover) hook(step string) error {
	if m.o.StepHook == nil {
		return nil
	}
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	return m.o.StepHook(step)
}

// State is the move's state as last read or written.
func (m *Mover) State() State { return m.st }

// Work is what this mover's switch copied and verified behind the fence.
func (m *Mover) Work() SwitchWork { return m.work }

// Run drives the move from its recorded step to done; a paused move waits
// between chunks, a cancelled one returns ErrCancelled.
func (m *Mover) Run(ctx context.Context) error {
	for {
		if err := m.hook(m.st.Step); err != nil {
			return err
		}
		var err error
		switch m.st.Step {
		case StepPlan:
			if err = m.plan(ctx); err == nil {
				err = m.setStep(ctx, StepCopy)
			}
		case StepCopy:
			if err = m.copyAll(ctx); err == nil {
				err = m.setStep(ctx, StepCatchUp)
			}
		case StepCatchUp:
			for i := 0; i < m.o.CatchUpRounds && err == nil; i++ {
				var n int
				n, err = m.catchUp(ctx, false)
				if n == 0 {
					break
				}
			}
			if err == nil {
				err = m.setStep(ctx, StepVerify)
			}
		case StepVerify:
			if err = m.verifyAll(ctx); err == nil {
				err = m.setStep(ctx, StepPreCheck)
			}
		case StepPreCheck:
			if err = m.preCheck(ctx); errors.Is(err, ErrSwitchRefused) {
				// nothing is held: back to catch-up, for a run that retries
				return errors.Join(err, m.setStep(ctx, StepCatchUp))
			}
			if err == nil {
				err = m.setStep(ctx, StepSwitch)
			}
		case StepSwitch:
			err = m.switchOver(ctx)
		case StepDone:
			// last of the bookkeeping, after the source's: a mover killed
			// between the two is completed by a run that finds it done
			if err := dropMarks(ctx, m.src); err != nil {
				return err
			}
			return m.targetDone(ctx)
		case StepCancelling, StepCancelled:
			return ErrCancelled
		default:
			return fmt.Errorf("move: unknown step %q", m.st.Step)
		}
		if err != nil {
			return err
		}
	}
}

// plan checks the target: reachable, same schema version, and empty (or
// absent: created and migrated here); a reverse's target is the copy its
// move left (reverseReady).
func (m *Mover) plan(ctx context.Context) error {
	if m.st.Reverse {
		if err := m.reverseReady(ctx); err != nil {
			return err
		}
		return m.dropGone(ctx)
	}
	server, _, err := OpenDB(m.dstDSN, m.o.TLS, false)
	if err != nil {
		return err
	}
	defer server.Close()
	if err := server.PingContext(ctx); err != nil {
		return fmt.Errorf("move: target %s not reachable: %w", serverOf(m.dstDSN), err)
	}

	create := strings.Replace(imsql.CreateDatabase(), imsql.DatabasePlaceholder, quote(m.dstCfg.DBName), 1)
	if _, err := server.ExecContext(ctx, create); err != nil {
		return fmt.Errorf("move: create the target database: %w", err)
	}
	if err := tenantdb.Migrate(ctx, m.dst); err != nil {
		return fmt.Errorf("move: target: %w", err)
	}
	if err := m.sameSchema(ctx); err != nil {
		return err
	}
	tables, err := listTables(ctx, m.dst)
	if err != nil {
		return err
	}
	for _, t := range tables {
		var one int
		err := m.dst.QueryRowContext(ctx, "SELECT 1 FROM "+quote(t.name)+" LIMIT 1").Scan(&one)
		if err == nil {
			return fmt.Errorf("move: the target database is not empty (table %s has rows)", t.name)
		}
		if err != sql.ErrNoRows {
			return err
		}
	}
	return nil
}

// planTables records the chunks of every source table not yet planned,
// creating its table on the target from the source's own definition, and
// its mark triggers on the source first; it splits a planned table's last
// chunk once it outgrew a chunk.
func (m *Mover) planTables(ctx context.Context) ([]table, error) {
	tables, err := listTables(ctx, m.src)
	if err != nil {
		return nil, err
	}
	// before a table's first chunk is recorded: every change after it is marked
	if err := m.markTriggers(ctx, tables); err != nil {
		return nil, err
	}
	for _, t := range tables {
		// a planned table's last chunk is open-ended: the rows inserted
		// past its start since (the active month's new messages) all land
		// in it, so it is split again once it holds more than a chunk, and
		// no chunk's copy or verification grows with the move's length
		var tail chunk
		var lo sql.NullString
		err := m.src.QueryRowContext(ctx, "SELECT chunk_no, lo_key FROM im_tenant_move_chunks WHERE table_name = ? ORDER BY chunk_no DESC LIMIT 1", t.name).
			Scan(&tail.no, &lo)
		planned := err == nil
		switch {
		case planned && lo.Valid:
			if tail.lo, err = decodeKey(lo.String); err != nil {
				return nil, err
			}
		case planned:
		case err != sql.ErrNoRows:
			return nil, err
		default:
			var name, ddl string
			if err := m.src.QueryRowContext(ctx, "SHOW CREATE TABLE "+quote(t.name)).Scan(&name, &ddl); err != nil {
				return nil, fmt.Errorf("move: definition of %s: %w", t.name, err)
			}
			ddl = strings.Replace(ddl, "CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
			if _, err := m.dst.ExecContext(ctx, ddl); err != nil {
				return nil, fmt.Errorf("move: create %s on the target: %w", t.name, err)
			}
		}
		chunks, err := t.boundaries(ctx, m.src, m.o.ChunkRows, tail)
		if err != nil {
			return nil, err
		}
		if planned && len(chunks) == 1 {
			continue
		}
		tx, err := m.src.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		for _, c := range chunks {
			var lo, hi sql.NullString
			if c.lo != nil {
				lo.String, lo.Valid = mustKey(c.lo)
			}
			if c.hi != nil {
				hi.String, hi.Valid = mustKey(c.hi)
			}
			// a split tail is replaced: its checksum was of the longer
			// range, so it is copied and verified again
			if _, err := tx.ExecContext(ctx, "REPLACE INTO im_tenant_move_chunks (table_name, chunk_no, lo_key, hi_key) VALUES (?, ?, ?, ?)",
				t.name, c.no, lo, hi); err != nil {
				_ = tx.Rollback()
				return nil, err
			}
		}
		if err := tx.Commit(); err != nil {
			return nil, err
		}
	}
	return tables, nil
}

func mustKey(vals []any) (string, bool) {
	s, err := encodeKey(vals)
	if err != nil {
		panic(err) // a key scanned from the server: types encodeKey knows
	}
	return s, true
}

type storedChunk struct {
	chunk
	table    string
	checksum string
	copied   bool
}

// chunks reads the recorded chunks the condition where selects (all
// when it is empty).
func (m *Mover) chunks(ctx context.Context, where string) ([]storedChunk, error) {
	q := "SELECT table_name, chunk_no, lo_key, hi_key, checksum, copied FROM im_tenant_move_chunks"
	if where != "" {
		q += " WHERE " + where
	}
	rows, err := m.src.QueryContext(ctx, q+" ORDER BY table_name, chunk_no")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storedChunk
	for rows.Next() {
		var c storedChunk
		var lo, hi sql.NullString
		if err := rows.Scan(&c.table, &c.no, &lo, &hi, &c.checksum, &c.copied); err != nil {
			return nil, err
		}
		if lo.Valid {
			if c.lo, err = decodeKey(lo.String); err != nil {
				return nil, err
			}
		}
		if hi.Valid {
			if c.hi, err = decodeKey(hi.String); err != nil {
				return nil, err
			}
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// between is the mover's check between chunks: a cancel stops it, a pause
// holds it until resumed.
func (m *Mover) between(ctx context.Context) error {
	for {
		var step string
		var paused bool
		if err := m.src.QueryRowContext(ctx, "SELECT step, paused FROM im_tenant_move WHERE id = 1").Scan(&step, &paused); err != nil {
			return fmt.Errorf("move: read state: %w", err)
		}
		if step == StepCancelling || step == StepCancelled {
			return ErrCancelled
		}
		if !paused || m.st.Step == StepSwitch {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// copyChunks copies the chunks and records with each the checksum of the
// rows its copy read (what the target then holds; a row changed on the
// source after that read is marked, and makes the next comparison on both
// servers differ). A reverse move first compares the chunk on both
// servers and copies it only when it differs.
func (m *Mover) copyChunks(ctx context.Context, tables []table, chunks []storedChunk) error {
	byName := tablesByName(tables)
	for _, c := range chunks {
		if err := m.between(ctx); err != nil {
			return err
		}
		t, ok := byName[c.table]
		if !ok {
			return fmt.Errorf("move: table %s left the source during the move", c.table)
		}
		var rowsN, bytesN int64
		var sum string
		same := false
		if m.st.Reverse {
			// the target holds the move's old copy: what did not change
			// since the switch is there already
			var dsum string
			var err error
			sum, dsum, err = onBoth(m.src, m.dst, func(db *sql.DB) (string, error) { return t.checksum(ctx, db, c.chunk) })
			if err != nil {
				return err
			}
			same = dsum == sum
		}
		if !same {
			var err error
			if rowsN, bytesN, sum, err = t.copyChunk(ctx, m.src, m.dst, c.chunk); err != nil {
				return err
			}
		}
		// a chunk written on the target is proven again: by the
		// verification's comparison against this checksum, or behind the
		// fence when the pre-checks' catch-up copied it
		if _, err := m.src.ExecContext(ctx, `UPDATE im_tenant_move_chunks SET checksum = ?, copied = 1, verified = 0, proven = 0 WHERE table_name = ? AND chunk_no = ?`,
			sum, c.table, c.no); err != nil {
			return err
		}
		if _, err := m.src.ExecContext(ctx, `UPDATE im_tenant_move SET rows_copied = rows_copied + ?, bytes_copied = bytes_copied + ? WHERE id = 1`,
			rowsN, bytesN); err != nil {
			return err
		}
	}
	return nil
}

// copyAll is the copy step: it copies the chunks not copied yet table by
// table, and proves each table of two chunks or more right after its copy
// (proveTable; a table of one chunk, mostly empty, costs the verification
// step one read on the target, less than a proof's round trips). A proof
// runs beside the copy of the next tables, proofWorkers at once (the copy
// waits for a free one), so the move waits only for the proofs still
// running when the last chunk is copied (HookCopied to the step's end). A
// mover killed meanwhile leaves those tables unproven: the verification
// step compares them.
func (m *Mover) copyAll(ctx context.Context) error {
	tables, err := m.planTables(ctx)
	if err != nil {
		return err
	}
	pending, err := m.chunks(ctx, "copied = 0")
	if err != nil {
		return err
	}
	byName := tablesByName(tables)
	// a proof that fails cancels the copy; a copy that fails waits for the
	// proofs running (each one CHECKSUM TABLE per server)
	proofs, pctx := errgroup.WithContext(ctx)
	proofs.SetLimit(proofWorkers)
	for len(pending) > 0 {
		n := 1
		for n < len(pending) && pending[n].table == pending[0].table {
			n++
		}
		if err := m.copyChunks(pctx, tables, pending[:n]); err != nil {
			return errors.Join(err, proofs.Wait())
		}
		if pending[n-1].no > 0 {
			t := byName[pending[0].table]
			proofs.Go(func() error { return m.proveTable(pctx, t) })
		}
		pending = pending[n:]
	}
	if err := m.hook(HookCopied); err != nil {
		return errors.Join(err, proofs.Wait())
	}
	return proofs.Wait()
}

// catchUp compares every chunk's source checksum (with the target's too
// when both is set) with what was copied, marks the differing ones to copy
// (the lag) and copies them; it returns how many it copied.
func (m *Mover) catchUp(ctx context.Context, both bool) (int, error) {
	tables, err := m.planTables(ctx)
	if err != nil {
		return 0, err
	}
	byName := tablesByName(tables)
	all, err := m.chunks(ctx, "")
	if err != nil {
		return 0, err
	}
	var stale []storedChunk
	for _, c := range all {
		// a cancel or a pause is seen at every chunk compared, not only
		// at the copies: the pass reads every chunk of the tenant
		if err := m.between(ctx); err != nil {
			return 0, err
		}
		t, ok := byName[c.table]
		if !ok {
			return 0, fmt.Errorf("move: table %s left the source during the move", c.table)
		}
		sum, err := t.checksum(ctx, m.src, c.chunk)
		if err != nil {
			return 0, err
		}
		differs := !c.copied || sum != c.checksum
		if !differs && both {
			dsum, err := t.checksum(ctx, m.dst, c.chunk)
			if err != nil {
				return 0, err
			}
			differs = dsum != sum
		}
		if differs {
			stale = append(stale, c)
			if _, err := m.src.ExecContext(ctx, `UPDATE im_tenant_move_chunks SET copied = 0 WHERE table_name = ? AND chunk_no = ?`, c.table, c.no); err != nil {
				return 0, err
			}
		}
	}
	if err := m.copyChunks(ctx, tables, stale); err != nil {
		return 0, err
	}
	return len(stale), nil
}

// switchOver raises the source fence (its UPDATE
// waits for the writers in flight; from its commit no writer of the old
// epoch changes the source), copies and verifies what changed since the
// verification (fenceAndVerify), raises the target's fence, records the switch on the target, writes the
// placement record everywhere and records the step done on the source.
// The target's row is written before the placement record: from the
// record on, the target takes the tenant's writes, and a switch resumed
// then must not copy a chunk again (that would replace them with the
// source's rows) — it finds the row and only writes what is left of the
// bookkeeping. Every part can run again after a crash.
func (m *Mover) switchOver(ctx context.Context) error {
	next := m.st.FromEpoch + 1
	switched, err := m.targetSwitched(ctx)
	if err != nil {
		return err
	}
	if !switched {
		began := time.Now()
		if err := m.fenceAndVerify(ctx, next); err != nil {
			return err
		}
		cur, err := readState(ctx, m.src)
		if err != nil {
			return err
		}
		m.st.RowsCopied, m.st.BytesCopied = cur.RowsCopied, cur.BytesCopied
		m.st.SwitchMS = time.Since(began).Milliseconds()
		if _, err := m.dst.ExecContext(ctx, `REPLACE INTO im_tenant_move (id, role, peer_dsn, step, from_epoch, rows_copied, bytes_copied, switch_ms, started_at)
			VALUES (1, 'target', ?, ?, ?, ?, ?, ?, ?)`, m.srcDSN, StepSwitch, m.st.FromEpoch, m.st.RowsCopied, m.st.BytesCopied, m.st.SwitchMS,
			m.st.StartedAt.Format("2006-01-02 15:04:05.000")); err != nil {
			return fmt.Errorf("move: record the switch on the target: %w", err)
		}
	}
	if err := m.store.Write(ctx, placement.Record{Tenant: m.tenant, DSN: m.dstDSN, Epoch: next}); err != nil {
		return fmt.Errorf("move: write the placement record: %w", err)
	}
	testhook.CrashMove(testhook.MovePlaced)
	if _, err := m.src.ExecContext(ctx, "UPDATE im_tenant_move SET step = ?, switch_ms = ? WHERE id = 1", StepDone, m.st.SwitchMS); err != nil {
		return fmt.Errorf("move: record step %s: %w", StepDone, err)
	}
	m.st.Step = StepDone
	return nil
}

// targetSwitched reports whether the target's row records this move's
// switch (half done or done), and takes the switch's duration from it.
func (m *Mover) targetSwitched(ctx context.Context) (bool, error) {
	var role, peer, step string
	var from, ms int64
	err := m.dst.QueryRowContext(ctx, "SELECT role, peer_dsn, step, from_epoch, switch_ms FROM im_tenant_move WHERE id = 1").
		Scan(&role, &peer, &step, &from, &ms)
	if err == sql.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("move: read the target's move: %w", err)
	}
	if role != "target" || (step != StepSwitch && step != StepDone) || from != m.st.FromEpoch || serverOf(peer) != serverOf(m.srcDSN) {
		return false, nil
	}
	m.st.SwitchMS = ms
	return true, nil
}

// preCheck is the precheck step: the pre-checks (preSwitch) and the copy
// of the rows marked since the verification step (drainMarks), with
// nothing held — its catch-up round reads every chunk, so it can take
// as long as the catch-up step, and until the step is switch a cancel
// cancels the move.
func (m *Mover) preCheck(ctx context.Context) error {
	if err := m.preSwitch(ctx); err != nil {
		return err
	}
	if err := m.drainMarks(ctx); err != nil {
		return err
	}
	return m.hook(HookPreChecked)
}

// fenceAndVerify is the switch's fenced part. Unless the fence is up
// already: the copy of the rows marked since the precheck step's
// (drainMarks), before the fence. Then the source
// fence, the copy and verification of what was marked since and of the
// chunks not verified (fencedSync), and the target's fence. A switch
// resumed with the fence up finds the marks and the verified flags as the
// killed one left them.
func (m *Mover) fenceAndVerify(ctx context.Context, next int64) error {
	var fence int64
	if err := m.src.QueryRowContext(ctx, "SELECT epoch FROM im_tenant_fence WHERE id = 1").Scan(&fence); err != nil {
		return fmt.Errorf("move: source fence: %w", err)
	}
	// the pre-checks passed in the precheck step; a switch resumed after
	// its fence was raised goes on: refusing then would hold the tenant's
	// writes
	if fence < next {
		if err := m.drainMarks(ctx); err != nil {
			return err
		}
	}
	// on the mover's own connection, which holds its lock: RaiseFence
	// takes the fence's DDL lock there too
	if err := routing.RaiseFence(ctx, m.lock, next); err != nil {
		return fmt.Errorf("move: source: %w", err)
	}
	if err := m.hook(HookFenced); err != nil {
		return err
	}
	if err := m.fencedSync(ctx); err != nil {
		return err
	}
	if err := m.hook(HookSynced); err != nil {
		return err
	}
	if _, err := m.dst.ExecContext(ctx, "UPDATE im_tenant_fence SET epoch = GREATEST(epoch, ?) WHERE id = 1", next); err != nil {
		return fmt.Errorf("move: raise the target fence: %w", err)
	}
	return nil
}

// targetDone records the end of the switch on the target's row; a row
// already done, or no longer this move's target, is left.
func (m *Mover) targetDone(ctx context.Context) error {
	if _, err := m.dst.ExecContext(ctx, "UPDATE im_tenant_move SET step = ?, switch_ms = ? WHERE id = 1 AND role = 'target' AND step = ?",
		StepDone, m.st.SwitchMS, StepSwitch); err != nil {
		return fmt.Errorf("move: record the move done on the target: %w", err)
	}
	return nil
}

// notItself refuses a target that is the source database itself.
func notItself(ctx context.Context, src *sql.DB, to string, tlsCfg *tls.Config) error {
	server, cfg, err := OpenDB(to, tlsCfg, false)
	if err != nil {
		return err
	}
	defer server.Close()
	same, err := sameDatabase(ctx, src, server, cfg.DBName)
	if err != nil {
		return err
	}
	if same {
		return fmt.Errorf("move: the target %s is the tenant's current database", serverOf(to))
	}
	return nil
}

// sameDatabase tells whether the database name on server b is the database
// of a (the same server by host name and port, the same name): a move
// must never copy onto, nor cancel by dropping, its own source.
func sameDatabase(ctx context.Context, a, b *sql.DB, name string) (bool, error) {
	var ha, hb string
	if err := a.QueryRowContext(ctx, "SELECT CONCAT(@@hostname, ':', @@port, '/', DATABASE())").Scan(&ha); err != nil {
		return false, fmt.Errorf("move: source identity: %w", err)
	}
	if err := b.QueryRowContext(ctx, "SELECT CONCAT(@@hostname, ':', @@port, '/', ?)", name).Scan(&hb); err != nil {
		return false, fmt.Errorf("move: target identity: %w", err)
	}
	return ha == hb, nil
}
