package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// MoveTenant is one tenant of the move bench's load: its token (a member
// of every topic), the topics it sends to and those it reads (pages below
// a random seq up to Last + 1).
type MoveTenant struct {
	Tenant     string
	Token      string
	SendTopics []string
	ReadTopics []string
	Last       int64
}

// MoveParams drive `imshard bench move`: a live move of the Moving
// tenant to another server under a steady send and read load, with the
// Other tenant's sends beside it, and a raw copy of the same tables
// between the same servers.
type MoveParams struct {
	BaseURL       string // the API of the send and query roles in this process
	Moving, Other MoveTenant
	// SendRate and ReadRate are each tenant's arrivals per second (the
	// Other tenant only sends); ReadRate 0 reads nothing.
	SendRate, ReadRate float64
	// Warmup runs the load unmeasured; Baseline measures the Other
	// tenant's sends without a move; Tail keeps the load on after this
	// process follows the new placement.
	Warmup, Baseline, Tail time.Duration
	// Source is the Moving tenant's database where it is now; Tables names
	// the tables a move of it copies (move.CopiedTables).
	Source *sql.DB
	Tables func(ctx context.Context, db *sql.DB) ([]string, error)
	// RawTarget is an empty database on the target server: the raw copy
	// streams each table from Source into it, ChunkRows rows a
	// transaction, 200 a statement.
	RawTarget *sql.DB
	ChunkRows int
	// Move runs the move to done, calling mark as each step and each part
	// of the switch begins; it returns the switch as the move recorded it.
	Move func(ctx context.Context, mark func(step string)) (MoveSwitch, error)
	// Epoch is the placement epoch this process's roles follow for the
	// Moving tenant; DB its pool there.
	Epoch func() (int64, error)
	DB    func(ctx context.Context) (*sql.DB, error)
	// Current is the month table the sends land in.
	Current  routing.Table
	Progress io.Writer
}

// Move's step names as Move marks them (the move module's steps and the
// parts of its copy, verification and switch: move.StepCopy, move.HookProving
// and the others, which this package does not import; a test of test/
// holds them equal: MoveMarks).
const (
	markCopy     = "copy"
	markProving  = "proving"
	markProven   = "proven"
	markCopied   = "copied"
	markCatchUp  = "catchup"
	markVerify   = "verify"
	markVerified = "verified"
	markFenced   = "fenced"
	markSynced   = "synced"
)

// MoveMarks are the names above in the mover's order of steps and parts;
// the tests hold them equal to the move module's.
var MoveMarks = []string{markCopy, markProving, markProven, markCopied, markCatchUp, markVerify, markVerified, markFenced, markSynced}

// MoveSwitch is the switch as the move recorded it: its duration, and
// behind the fence the marked rows it copied and verified, the unverified
// chunks it compared and those of them it copied.
type MoveSwitch struct {
	MS                           int64
	FencedKeys, Compared, Chunks int
}

// OpLog is what a steady load did: operations, failures (the first one's
// error), and the latency percentiles of a window.
type OpLog struct {
	Ops, Failed int64
	FirstErr    string
	P50, P99    time.Duration
}

// MoveReport holds the move bench's figures.
type MoveReport struct {
	// the Moving tenant's sends and reads over the whole run (warmup to
	// tail, the move within)
	Sends, Reads OpLog
	// the Other tenant's sends in the baseline window and during the move
	OtherIdle, OtherMoving OpLog
	// Rows is what the copied tables held as the move began; the copy
	// step took Copy for them. RawRows took Raw in the raw copy.
	Rows, RawRows int64
	Copy, Raw     time.Duration
	// the verification of VerifyRows rows: the copy step's wait for its
	// proofs of the tables nobody wrote (Proofs: from its copied part to
	// its end; the proofs run beside the copy, from the first proving to
	// the last proven part: ProofSpan) and the verify step (Verify, before
	// the fence); then the switch: the
	// work behind the fence (fence to synced: the marked rows and
	// unverified chunks copied and verified), the switch as the move
	// recorded it, and the pause: from the source fence until this
	// process's roles follow the target (persistence parks and changes
	// are refused meanwhile)
	Proofs, ProofSpan time.Duration
	Verify, Fenced    time.Duration
	VerifyRows        int64
	Switch            MoveSwitch
	Pause             time.Duration
	Move              time.Duration // the whole move
	// the Moving tenant's accepted sends (201) and their messages on the
	// target: rows and distinct client ids
	Accepted, Stored, Distinct int64
}

// CopyRate, RawRate and VerifyRate are rows per second.
func (r MoveReport) CopyRate() float64 { return Rate(r.Rows, r.Copy) }

// RawRate: see CopyRate.
func (r MoveReport) RawRate() float64 { return Rate(r.RawRows, r.Raw) }

// VerifyRate is the verification's rate over all the time the move spent
// on it, the copy step's wait for its proofs and the verify step;
// StepVerifyRate the verify step's alone. See CopyRate.
func (r MoveReport) VerifyRate() float64 { return Rate(r.VerifyRows, r.Proofs+r.Verify) }

// StepVerifyRate: see VerifyRate.
func (r MoveReport) StepVerifyRate() float64 { return Rate(r.VerifyRows, r.Verify) }

func (p *MoveParams) logf(format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", args...)
	}
}

// op is one operation of a steady load: when it was due, how long it took
// from then, and its error.
type op struct {
	due time.Time
	lat time.Duration
	err error
}

// steady is an open-loop load: one operation every 1/rate, each on its own
// goroutine, its latency counted from when it was due.
type steady struct {
	mu   sync.Mutex
	ops  []op
	wg   sync.WaitGroup
	stop context.CancelFunc
}

func startSteady(ctx context.Context, rate float64, do func(ctx context.Context, n int64) error) *steady {
	s := &steady{}
	if rate <= 0 {
		s.stop = func() {}
		return s
	}
	lctx, cancel := context.WithCancel(ctx)
	s.stop = cancel
	every := time.Duration(float64(time.Second) / rate)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		start := time.Now()
		for n := int64(0); ; n++ {
			due := start.Add(time.Duration(n) * every)
			if !sleepUntil(lctx, due) {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				// an operation begun runs to its end: a cut one is no failure
				err := do(context.WithoutCancel(lctx), n)
				s.mu.Lock()
				s.ops = append(s.ops, op{due: due, lat: time.Since(due), err: err})
				s.mu.Unlock()
			}()
		}
	}()
	return s
}

// end stops the load and waits for its operations.
func (s *steady) end() {
	s.stop()
	s.wg.Wait()
}

// window sums the operations due in [from, to) (zero to: no end).
func (s *steady) window(from, to time.Time) OpLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	var l OpLog
	var lats []time.Duration
	for _, o := range s.ops {
		if o.due.Before(from) || !to.IsZero() && !o.due.Before(to) {
			continue
		}
		l.Ops++
		if o.err != nil {
			if l.Failed++; l.FirstErr == "" {
				l.FirstErr = o.err.Error()
			}
			continue
		}
		lats = append(lats, o.lat)
	}
	l.P50, l.P99 = percentiles(lats)
	return l
}

// Move runs the measurements.
func Move(ctx context.Context, p MoveParams) (MoveReport, error) {
	var rep MoveReport
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	sendOf := func(t MoveTenant) func(context.Context, int64) error {
		return func(ctx context.Context, n int64) error {
			body := `{"client_msg_id":"mvb-` + run + `-` + strconv.FormatInt(n, 10) + `","msg_type":"text","content":{"text":"move bench"}}`
			return call(ctx, client, "POST", p.BaseURL+"/v1/topics/"+t.SendTopics[n%int64(len(t.SendTopics))]+"/messages", t.Token, body, http.StatusCreated)
		}
	}
	read := func(ctx context.Context, _ int64) error {
		t := p.Moving
		url := fmt.Sprintf("%s/v1/topics/%s/messages?before=%d&limit=50", p.BaseURL, t.ReadTopics[rand.IntN(len(t.ReadTopics))], rand.Int64N(t.Last)+2)
		return call(ctx, client, "GET", url, t.Token, "", http.StatusOK)
	}
	begin := time.Now()
	sends := startSteady(ctx, p.SendRate, sendOf(p.Moving))
	reads := startSteady(ctx, p.ReadRate, read)
	other := startSteady(ctx, p.SendRate, sendOf(p.Other))
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			sends.end()
			reads.end()
			other.end()
		}
	}
	defer stop()
	p.logf("load: %.0f sends/s and %.0f reads/s of %s, %.0f sends/s of %s; warmup %v, then %v without a move …",
		p.SendRate, p.ReadRate, p.Moving.Tenant, p.SendRate, p.Other.Tenant, p.Warmup, p.Baseline)
	if err := sleepCtx(ctx, p.Warmup); err != nil {
		return rep, err
	}
	idleFrom := time.Now()
	if err := sleepCtx(ctx, p.Baseline); err != nil {
		return rep, err
	}
	rep.OtherIdle = other.window(idleFrom, time.Now())

	tables, err := p.Tables(ctx, p.Source)
	if err != nil {
		return rep, err
	}
	p.logf("raw copy of %d tables into the target server …", len(tables))
	if rep.RawRows, rep.Raw, err = rawCopy(ctx, p.Source, p.RawTarget, tables, p.ChunkRows); err != nil {
		return rep, fmt.Errorf("bench: raw copy: %w", err)
	}
	p.logf("raw copy: %d rows in %v", rep.RawRows, rep.Raw.Round(time.Millisecond))
	if rep.Rows, err = countRows(ctx, p.Source, tables); err != nil {
		return rep, err
	}

	before, err := p.Epoch()
	if err != nil {
		return rep, err
	}
	marks := map[string]time.Time{}
	var firstProving, lastProven time.Time
	var mu sync.Mutex
	var followed time.Time
	var watch sync.WaitGroup
	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	mark := func(step string) {
		mu.Lock()
		now := time.Now()
		switch step {
		case markProving:
			if firstProving.IsZero() {
				firstProving = now
			}
		case markProven:
			lastProven = now
		default:
			marks[step] = now
		}
		mu.Unlock()
		if step == markProving || step == markProven {
			return // once per table
		}
		p.logf("move: %s", step)
		if step != markFenced {
			return
		}
		// the pause ends when this process's roles follow the target
		watch.Add(1)
		go func() {
			defer watch.Done()
			for wctx.Err() == nil {
				if e, err := p.Epoch(); err == nil && e > before {
					mu.Lock()
					followed = time.Now()
					mu.Unlock()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	p.logf("move of %s (%d rows) …", p.Moving.Tenant, rep.Rows)
	moveFrom := time.Now()
	if rep.Switch, err = p.Move(ctx, mark); err != nil {
		return rep, fmt.Errorf("bench: move: %w", err)
	}
	moveDone := time.Now()
	// the roles follow within mysql.placement_poll; past 30 s they never will
	time.AfterFunc(30*time.Second, cancelWatch)
	watch.Wait()
	mu.Lock()
	defer mu.Unlock() // the marks are all in: nothing writes them any more
	if followed.IsZero() {
		return rep, fmt.Errorf("bench: this process never followed the new placement of %s", p.Moving.Tenant)
	}
	end := moveDone
	if followed.After(end) {
		end = followed
	}
	rep.Move = end.Sub(moveFrom)
	// the copy's own time; from the copied mark the step waits for its proofs
	rep.Copy = marks[markCopied].Sub(marks[markCopy])
	rep.Proofs = marks[markCatchUp].Sub(marks[markCopied])
	rep.ProofSpan = lastProven.Sub(firstProving)
	rep.Fenced = marks[markSynced].Sub(marks[markFenced])
	rep.Verify = marks[markVerified].Sub(marks[markVerify])
	rep.Pause = followed.Sub(marks[markFenced])
	rep.OtherMoving = other.window(moveFrom, end)
	p.logf("move done in %v; load for %v more …", rep.Move.Round(time.Millisecond), p.Tail)
	if err := sleepCtx(ctx, p.Tail); err != nil {
		return rep, err
	}
	stop()
	rep.Sends, rep.Reads = sends.window(begin, time.Time{}), reads.window(begin, time.Time{})
	rep.Accepted = rep.Sends.Ops - rep.Sends.Failed
	// the source is fenced: what it holds is what the switch verified
	if rep.VerifyRows, err = countRows(ctx, p.Source, tables); err != nil {
		return rep, err
	}
	return rep, p.stored(ctx, run, &rep)
}

// stored waits (up to 30 s) until persist wrote the Moving tenant's
// accepted sends of this run on the target, and counts them there.
func (p *MoveParams) stored(ctx context.Context, run string, rep *MoveReport) error {
	db, err := p.DB(ctx)
	if err != nil {
		return err
	}
	q := "SELECT COUNT(*), COUNT(DISTINCT client_msg_id) FROM " + p.Current.Quoted() + " WHERE client_msg_id LIKE ?"
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := db.QueryRowContext(ctx, q, "mvb-"+run+"-%").Scan(&rep.Stored, &rep.Distinct); err != nil {
			return fmt.Errorf("bench: count the sends on the target: %w", err)
		}
		if rep.Distinct >= rep.Accepted || time.Now().After(deadline) {
			return nil
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// call runs one request and wants status want.
func call(ctx context.Context, c *http.Client, method, url, token, body string, want int) error {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, req.URL.Path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// countRows sums the tables' rows.
func countRows(ctx context.Context, db *sql.DB, tables []string) (int64, error) {
	var total int64
	for _, t := range tables {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+quoteName(t)).Scan(&n); err != nil {
			return 0, fmt.Errorf("bench: count %s: %w", t, err)
		}
		total += n
	}
	return total, nil
}

func quoteName(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// rawCopy is the raw limit of the move's copy: MySQL has no INSERT …
// SELECT between two servers, so each table is streamed by one SELECT on
// one source connection into multi-row INSERTs of 200 rows on one target
// connection, a transaction every chunk rows — the connections the
// mover uses, none of its chunking, checksums or bookkeeping. The tables
// are created first, outside the time.
func rawCopy(ctx context.Context, src, dst *sql.DB, tables []string, chunk int) (int64, time.Duration, error) {
	for _, t := range tables {
		var name, ddl string
		if err := src.QueryRowContext(ctx, "SHOW CREATE TABLE "+quoteName(t)).Scan(&name, &ddl); err != nil {
			return 0, 0, err
		}
		if _, err := dst.ExecContext(ctx, ddl); err != nil {
			return 0, 0, err
		}
	}
	from := time.Now()
	var total int64
	for _, t := range tables {
		n, err := rawTable(ctx, src, dst, t, chunk)
		if err != nil {
			return 0, 0, err
		}
		total += n
	}
	return total, time.Since(from), nil
}

func rawTable(ctx context.Context, src, dst *sql.DB, table string, chunk int) (int64, error) {
	const batch = 200
	rows, err := src.QueryContext(ctx, "SELECT * FROM "+quoteName(table))
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, err
	}
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	conn, err := dst.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var tx *sql.Tx
	defer func() {
		if tx != nil {
			_ = tx.Rollback()
		}
	}()
	var n, inTx int64
	vals := make([]any, 0, batch*len(cols))
	flush := func(commit bool) error {
		if len(vals) > 0 {
			if tx == nil {
				if tx, err = conn.BeginTx(ctx, nil); err != nil {
					return err
				}
			}
			rowsN := len(vals) / len(cols)
			q := "INSERT INTO " + quoteName(table) + " VALUES " + strings.TrimSuffix(strings.Repeat(one+", ", rowsN), ", ")
			if _, err := tx.ExecContext(ctx, q, vals...); err != nil {
				return err
			}
			vals = vals[:0]
		}
		if commit && tx != nil {
			err := tx.Commit()
			tx, inTx = nil, 0
			return err
		}
		return nil
	}
	for rows.Next() {
		row := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range row {
			ptrs[i] = &row[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return 0, err
		}
		vals = append(vals, row...)
		n++
		inTx++
		if inTx >= int64(chunk) {
			err = flush(true)
		} else if len(vals) >= batch*len(cols) {
			err = flush(false)
		}
		if err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return n, flush(true)
}
