package move

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Change marks. Each table the move plans gets three triggers on the
// source (AFTER INSERT, UPDATE, DELETE) that add the primary key of every
// row a write changes to im_tenant_move_marks, in the writer's own
// transaction: a committed change always has its mark. The target's
// tables are created from SHOW CREATE TABLE, which carries no trigger.
//
// The copy step proves each table no write marked whole right after its
// copy (proveTable: its chunks flagged proven). The verification step
// clears the marks and the chunks' verified flags but the proven ones
// (clearMarks, which takes the proof back from every chunk a mark falls
// in), then proves every other chunk equal — on the target alone
// against the source checksum recorded with the chunk when no write
// marked it since, else on both servers — recopying those that differ,
// with nothing held. From then on a row
// that is not marked is as the verification saw it on both servers, so
// the switch copies and compares the marked rows before its fence
// (drainMarks) and, behind it, copies and verifies only the rows marked
// since and the chunks not proven (verified = 0: a table planned later, a
// chunk that kept differing, a chunk copied again since: copyChunks takes
// its proof back). A mark is removed only after its row was copied and
// compared equal on both servers (or its chunk's proof taken back, by
// clearMarks), and only by its id: a change after the copy adds a mark of
// its own.

// markTrigger names a table's trigger of one event (fixed length, whatever
// the table's name).
func markTrigger(tableName, event string) string {
	return fmt.Sprintf("im_move_mark_%s_%08x", strings.ToLower(event[:3]), crc32.ChecksumIEEE([]byte(tableName)))
}

var markEvents = []string{"INSERT", "UPDATE", "DELETE"}

// markTriggers creates the mark triggers the tables lack on the source.
func (m *Mover) markTriggers(ctx context.Context, tables []table) error {
	have, err := column(ctx, m.src, `SELECT trigger_name FROM information_schema.triggers
		WHERE trigger_schema = DATABASE() AND trigger_name LIKE 'im\_move\_mark\_%'`)
	if err != nil {
		return fmt.Errorf("move: list the mark triggers: %w", err)
	}
	exists := map[string]bool{}
	for _, n := range have {
		exists[n] = true
	}
	for _, t := range tables {
		var ddls []string
		var ints []string
		for _, ev := range markEvents {
			name := markTrigger(t.name, ev)
			if exists[name] {
				continue
			}
			if ints == nil {
				// the kind of each key column, as encodeKey writes it
				if ints, err = column(ctx, m.src, `SELECT CASE WHEN data_type NOT IN ('tinyint', 'smallint', 'mediumint', 'int', 'bigint') THEN 's'
					WHEN column_type LIKE '%unsigned%' THEN 'u' ELSE 'i' END FROM information_schema.columns c
					JOIN information_schema.statistics s USING (table_schema, table_name, column_name)
					WHERE c.table_schema = DATABASE() AND c.table_name = ? AND s.index_name = 'PRIMARY' ORDER BY s.seq_in_index`, t.name); err != nil {
					return fmt.Errorf("move: key types of %s: %w", t.name, err)
				}
				if len(ints) != len(t.pk) {
					return fmt.Errorf("move: key types of %s: %d columns, want %d", t.name, len(ints), len(t.pk))
				}
			}
			key := func(row string) string {
				parts := make([]string, len(t.pk))
				for i, c := range t.pk {
					v := row + "." + quote(c)
					if ints[i] == "s" {
						v = "TO_BASE64(" + v + ")"
					}
					parts[i] = "CONCAT('" + ints[i] + ":', " + v + ")"
				}
				return "JSON_ARRAY(" + strings.Join(parts, ", ") + ")"
			}
			keys := "SELECT " + key("NEW") + " AS k"
			switch ev {
			case "DELETE":
				keys = "SELECT " + key("OLD") + " AS k"
			case "UPDATE":
				// both when the key changed, one when not
				keys = "SELECT " + key("OLD") + " AS k UNION SELECT " + key("NEW")
			}
			ddls = append(ddls, "CREATE TRIGGER IF NOT EXISTS "+quote(name)+" AFTER "+ev+" ON "+quote(t.name)+
				" FOR EACH ROW INSERT INTO im_tenant_move_marks (table_name, key_text) SELECT '"+
				strings.ReplaceAll(t.name, "'", "''")+"', k FROM ("+keys+") AS ks")
		}
		if err := underLock(ctx, m.src, t.name, ddls); err != nil {
			return fmt.Errorf("move: mark trigger on %s (the move's user needs the TRIGGER and LOCK TABLES privileges): %w", t.name, err)
		}
	}
	return nil
}

// underLock runs a table's trigger statements (their creation, their
// drop) under LOCK TABLES of the table and the marks. Without it MariaDB
// fails a write that opened the table while its triggers were being
// created or dropped with "Table im_tenant_move_marks doesn't exist": its
// tables were gathered with another set of triggers than it found.
func underLock(ctx context.Context, db *sql.DB, name string, stmts []string) error {
	if len(stmts) == 0 {
		return nil
	}
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "LOCK TABLES "+quote(name)+" WRITE, im_tenant_move_marks WRITE"); err != nil {
		return err
	}
	defer func() { _, _ = c.ExecContext(context.WithoutCancel(ctx), "UNLOCK TABLES") }()
	for _, q := range stmts {
		if _, err := c.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// dropMarks drops the mark triggers and the marks from the database db
// (the move's source, once the move ended either way).
func dropMarks(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT event_object_table, trigger_name FROM information_schema.triggers
		WHERE trigger_schema = DATABASE() AND trigger_name LIKE 'im\_move\_mark\_%' ORDER BY event_object_table`)
	if err != nil {
		return fmt.Errorf("move: list the mark triggers: %w", err)
	}
	var order []string
	drops := map[string][]string{}
	for rows.Next() {
		var tbl, n string
		if err := rows.Scan(&tbl, &n); err != nil {
			rows.Close()
			return fmt.Errorf("move: list the mark triggers: %w", err)
		}
		if drops[tbl] == nil {
			order = append(order, tbl)
		}
		drops[tbl] = append(drops[tbl], "DROP TRIGGER IF EXISTS "+quote(n))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("move: list the mark triggers: %w", err)
	}
	// under the table's lock, as they were created: the tenant writes on
	for _, tbl := range order {
		if err := underLock(ctx, db, tbl, drops[tbl]); err != nil {
			return fmt.Errorf("move: drop the mark triggers of %s: %w", tbl, err)
		}
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM im_tenant_move_marks"); err != nil {
		return fmt.Errorf("move: clear the marks: %w", err)
	}
	return nil
}

// marked is the marks read at once: the distinct keys per table, each
// with the ids of the marks that name it.
type marked struct {
	keys map[string][]markedKey
	n    int
}

// markedKey is a row's key and the marks that name it.
type markedKey struct {
	vals []any
	ids  []int64
}

func (m *Mover) readMarks(ctx context.Context) (marked, error) {
	out := marked{keys: map[string][]markedKey{}}
	rows, err := m.src.QueryContext(ctx, "SELECT id, table_name, key_text FROM im_tenant_move_marks ORDER BY id")
	if err != nil {
		return out, fmt.Errorf("move: read the marks: %w", err)
	}
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var id int64
		var tbl, key string
		if err := rows.Scan(&id, &tbl, &key); err != nil {
			return out, err
		}
		if i, ok := seen[tbl+"\x00"+key]; ok {
			out.keys[tbl][i].ids = append(out.keys[tbl][i].ids, id)
			continue
		}
		vals, err := decodeKey(key)
		if err != nil {
			return out, err
		}
		seen[tbl+"\x00"+key] = len(out.keys[tbl])
		out.keys[tbl] = append(out.keys[tbl], markedKey{vals: vals, ids: []int64{id}})
		out.n++
	}
	return out, rows.Err()
}

// keyBatch is how many keys one statement of copyMarked names.
const keyBatch = 200

// copyMarked copies the marked rows onto the target (every row the
// source no longer holds is deleted there) a batch of keys at a time, and
// compares each batch on both servers right after its copy. It returns
// the ids of the marks whose rows compared equal, and the first batch
// that differed ("" when none did): before the fence a row written again
// between its copy and the comparison differs, and its marks stay for
// the next round or the switch; behind it nothing writes, so a
// difference is an error of the copy.
func (m *Mover) copyMarked(ctx context.Context, tables []table, mk marked) (proven []int64, differ string, err error) {
	byName := tablesByName(tables)
	for name, keys := range mk.keys {
		t, ok := byName[name]
		if !ok {
			return nil, "", fmt.Errorf("move: table %s left the source during the move", name)
		}
		for i := 0; i < len(keys); i += keyBatch {
			batch := keys[i:min(i+keyBatch, len(keys))]
			vals := make([][]any, len(batch))
			for j, k := range batch {
				vals[j] = k.vals
			}
			cond, args := t.keysWhere(vals)
			rowsN, bytesN, _, err := t.copyWhere(ctx, m.src, m.dst, cond, args)
			if err != nil {
				return nil, "", err
			}
			if _, err := m.src.ExecContext(ctx, `UPDATE im_tenant_move SET rows_copied = rows_copied + ?, bytes_copied = bytes_copied + ? WHERE id = 1`,
				rowsN, bytesN); err != nil {
				return nil, "", err
			}
			a, b, err := onBoth(m.src, m.dst, func(db *sql.DB) (string, error) { return t.checksumWhere(ctx, db, cond, args) })
			if err != nil {
				return nil, "", err
			}
			if a != b {
				if differ == "" {
					differ = fmt.Sprintf("%s: source %s, target %s", t.name, a, b)
				}
				continue
			}
			for _, k := range batch {
				proven = append(proven, k.ids...)
			}
		}
	}
	return proven, differ, nil
}

// unverified counts the chunks not proven equal.
func (m *Mover) unverified(ctx context.Context) (int, error) {
	var n int
	err := m.src.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move_chunks WHERE verified = 0").Scan(&n)
	return n, err
}

// unmark removes the marks read (by id: a mark added since stays).
func (m *Mover) unmark(ctx context.Context, ids []int64) error {
	return deleteMarks(ctx, m.src, ids)
}

// deleteMarks removes the marks of the ids, on db or in a transaction.
func deleteMarks(ctx context.Context, q execQuerier, ids []int64) error {
	const batch = 1000
	for i := 0; i < len(ids); i += batch {
		part := ids[i:min(i+batch, len(ids))]
		args := make([]any, len(part))
		for j, id := range part {
			args[j] = id
		}
		if _, err := q.ExecContext(ctx, "DELETE FROM im_tenant_move_marks WHERE id IN ("+
			strings.TrimSuffix(strings.Repeat("?, ", len(part)), ", ")+")", args...); err != nil {
			return fmt.Errorf("move: remove the marks copied: %w", err)
		}
	}
	return nil
}

// verifyAll is the verification step, before the switch: it clears the
// marks and the chunks' verified flags but those of the chunks the copy
// step proved and no mark fell in since (clearMarks), proves the tables
// nobody wrote since whole (verifyTables), then compares every chunk left
// (on the target only against its recorded source checksum, or on both
// servers: sameChunk), recopies the chunks that differ and compares them again, for
// up to CatchUpRounds rounds; a chunk still differing is left unverified
// for the switch. Chunks partition each table's key space (the first and
// the last are open-ended), and a checksum holds the chunk's row count, so
// the tables' row counts are compared too.
func (m *Mover) verifyAll(ctx context.Context) error {
	tables, err := m.planTables(ctx)
	if err != nil {
		return err
	}
	if err := m.clearMarks(ctx); err != nil {
		return err
	}
	if err := m.verifyTables(ctx, tables); err != nil {
		return err
	}
	for round := 0; round < m.o.CatchUpRounds; round++ {
		differ, err := m.verifyChunks(ctx, tables, true)
		if err != nil {
			return err
		}
		if len(differ) == 0 {
			break
		}
		if err := m.copyChunks(ctx, tables, differ); err != nil {
			return err
		}
	}
	return m.hook(HookVerified)
}

// verifyTables is the verification's first pass, over whole tables: a
// table of two chunks or more, none of them verified already (by the copy
// step's proof) or with its recorded checksum blanked (the per-chunk pass
// records it again), and none of its
// rows marked since the marks were cleared (a sealed month, a reference
// table: what nobody writes), is compared by its CHECKSUM TABLE on both servers
// at once, and when the two agree all its chunks are flagged verified in
// one statement. The server computes that sum in C over the rows' stored
// bytes as it reads them, with nothing sent; a table that differs (written meanwhile, or a row wrong on
// the target) is left to the per-chunk comparison, which finds the
// chunks to copy. verifyWorkers tables are compared at once. A mover
// killed here has flagged the tables compared before; the step runs again
// from its start anyway (it clears the flags).
func (m *Mover) verifyTables(ctx context.Context, tables []table) error {
	rows, err := m.src.QueryContext(ctx, "SELECT table_name, COUNT(*), SUM(verified) + SUM(checksum = '') FROM im_tenant_move_chunks GROUP BY table_name")
	if err != nil {
		return err
	}
	whole := map[string]bool{}
	for rows.Next() {
		var name string
		var n, verifiedOrBlank int64
		if err := rows.Scan(&name, &n, &verifiedOrBlank); err != nil {
			rows.Close()
			return err
		}
		whole[name] = n >= 2 && verifiedOrBlank == 0
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	written, err := column(ctx, m.src, "SELECT DISTINCT table_name FROM im_tenant_move_marks")
	if err != nil {
		return err
	}
	for _, name := range written {
		whole[name] = false
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(verifyWorkers)
	for _, t := range tables {
		if !whole[t.name] {
			continue
		}
		if err := m.between(gctx); err != nil {
			return errors.Join(err, g.Wait())
		}
		g.Go(func() error {
			same, err := t.sameTable(gctx, m.src, m.dst)
			if err != nil || !same {
				return err
			}
			return m.flagTable(gctx, t.name, verifiedFlag)
		})
	}
	return g.Wait()
}

// proveTable is the copy step's proof of a table it just copied, taken
// while the table's pages are still in both servers' buffer pools: when no
// write marked the table (a sealed month, an archived month's references:
// what nobody writes), its CHECKSUM TABLE is compared on both servers at
// once (sameTable) and, when the two agree, its chunks are flagged proven,
// which the verification step takes as verified without reading them. The
// mark triggers exist before a table's first chunk is recorded, so a write
// after the copy either is in the source's sum (the two differ: nothing
// proven) or has a mark: clearMarks takes the proof back from the chunks
// a mark falls in before it removes that mark, and the verification step
// compares those chunks again. HookProving and HookProven bracket the
// proof, the look for a mark included. It runs beside the copy of the
// next tables (copyAll).
func (m *Mover) proveTable(ctx context.Context, t table) error {
	if err := m.hook(HookProving); err != nil {
		return err
	}
	var one int
	err := m.src.QueryRowContext(ctx, "SELECT 1 FROM im_tenant_move_marks WHERE table_name = ? LIMIT 1", t.name).Scan(&one)
	switch {
	case err == nil:
		// written since its triggers: left to the verification step
	case err != sql.ErrNoRows:
		return fmt.Errorf("move: marks of %s: %w", t.name, err)
	default:
		same, err := t.sameTable(ctx, m.src, m.dst)
		if err != nil {
			return err
		}
		if same {
			if err := m.flagTable(ctx, t.name, provenFlag); err != nil {
				return err
			}
		}
	}
	return m.hook(HookProven)
}

// proofWorkers is how many tables the copy step proves at once beside its
// copy (each proof one CHECKSUM TABLE per server, read at once).
const proofWorkers = 2

// The flags of a chunk flagTable sets: compared equal in the verification
// step (cleared at its start), or by the copy step's proof (cleared by a
// mark falling in the chunk).
const (
	verifiedFlag = "verified"
	provenFlag   = "proven"
)

// flagTable sets the flag (verifiedFlag, provenFlag) of every chunk of the
// table, with the move's record's time (see flagVerified).
func (m *Mover) flagTable(ctx context.Context, name, flag string) error {
	tx, err := m.src.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_move_chunks SET "+flag+" = 1 WHERE table_name = ?", name); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_move SET updated_at = CURRENT_TIMESTAMP(3) WHERE id = 1"); err != nil {
		return err
	}
	return tx.Commit()
}

// verifyWorkers is how many chunks (or runs of chunks: targetRun) the
// verification compares at once, each on both servers at once;
// verifyFlagBatch how many equal chunks it flags verified in one
// statement; runChunks the most chunks one target-only read covers.
const (
	verifyWorkers   = 4
	verifyFlagBatch = 64
	runChunks       = 16
)

// verifyChunks compares the unverified chunks on both servers (with
// stored set, a chunk holding a recorded source checksum on the target
// only: see sameChunk), flags the
// equal ones verified and returns the others. verifyWorkers chunks are
// compared at once, each chunk's two checksums read at once; the flags
// are written verifyFlagBatch at a time (a flag lost with a killed mover
// only costs that chunk's comparison behind the fence: a row changed
// after its comparison is marked either way).
func (m *Mover) verifyChunks(ctx context.Context, tables []table, stored bool) ([]storedChunk, error) {
	byName := tablesByName(tables)
	pending, err := m.chunks(ctx, "verified = 0")
	if err != nil {
		return nil, err
	}
	for _, c := range pending {
		if _, ok := byName[c.table]; !ok {
			return nil, fmt.Errorf("move: table %s left the source during the move", c.table)
		}
	}
	type compared struct {
		c    storedChunk
		same bool
	}
	g, gctx := errgroup.WithContext(ctx)
	todo := make(chan []storedChunk)
	done := make(chan compared)
	g.Go(func() error {
		defer close(todo)
		fed := 0
		for len(pending) > 0 {
			n := 1
			if stored {
				n = max(1, targetRun(pending))
			}
			if fed/verifyFlagBatch != (fed+n)/verifyFlagBatch || fed == 0 {
				if err := m.between(gctx); err != nil {
					return err
				}
			}
			select {
			case todo <- pending[:n]:
			case <-gctx.Done():
				return gctx.Err()
			}
			fed += n
			pending = pending[n:]
		}
		return nil
	})
	var workers sync.WaitGroup
	for range verifyWorkers {
		workers.Add(1)
		g.Go(func() error {
			defer workers.Done()
			for run := range todo {
				t := byName[run[0].table]
				var out []compared
				if len(run) > 1 {
					same, err := t.sameRun(gctx, m.dst, run)
					if err != nil {
						return err
					}
					if same {
						for _, c := range run {
							c.checksum = ""
							out = append(out, compared{c, true})
						}
					}
				}
				if out == nil {
					// one chunk, or a run that differs somewhere: each
					// chunk of it on its own
					for _, c := range run {
						same, fresh, err := m.sameChunk(gctx, t, c, stored)
						if err != nil {
							return err
						}
						c.checksum = fresh
						out = append(out, compared{c, same})
					}
				}
				for _, r := range out {
					select {
					case done <- r:
					case <-gctx.Done():
						return gctx.Err()
					}
				}
			}
			return nil
		})
	}
	go func() { workers.Wait(); close(done) }()
	var differ, equal []storedChunk
	var flagErr error
	for r := range done {
		if !r.same {
			differ = append(differ, r.c)
			continue
		}
		if equal = append(equal, r.c); len(equal) >= verifyFlagBatch && flagErr == nil {
			flagErr = m.flagVerified(gctx, equal)
			equal = equal[:0]
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if flagErr != nil {
		return nil, flagErr
	}
	return differ, m.flagVerified(ctx, equal)
}

// sameChunk compares the chunk on both servers, its two checksums read
// at once, and returns the source's (fresh); with stored set a chunk
// holding a recorded source checksum is compared on the target only,
// against it (see clearMarks), and fresh is empty.
func (m *Mover) sameChunk(ctx context.Context, t table, c storedChunk, stored bool) (same bool, fresh string, err error) {
	if stored && c.copied && c.checksum != "" {
		dsum, err := t.checksum(ctx, m.dst, c.chunk)
		return err == nil && dsum == c.checksum, "", err
	}
	sum, dsum, err := onBoth(m.src, m.dst, func(db *sql.DB) (string, error) { return t.checksum(ctx, db, c.chunk) })
	return err == nil && sum == dsum, sum, err
}

// targetRun is how many chunks from the first of pending (in table and
// chunk order) make one run for sameRun, at most runChunks: the next ones
// of the same table, each copied with a recorded checksum of this kind
// (compared on the target only), none blank, and not the whole table.
// 0 or 1: no run.
func targetRun(pending []storedChunk) int {
	n := 0
	for n < len(pending) && n < runChunks {
		c := pending[n]
		if _, ok := c.storedRows(); !ok || c.table != pending[0].table || c.no != pending[0].no+n {
			break
		}
		n++
	}
	if n > 1 && pending[0].lo == nil && pending[n-1].hi == nil {
		// a read of the whole table takes no argument, so the text
		// protocol, and the chunks' checksums were recorded over the
		// binary one's values (a float's text differs between the two)
		n--
	}
	return n
}

// storedRows is the row count the chunk's recorded checksum holds, when it
// is compared on the target only against it (copied, a checksum of this
// kind).
func (c storedChunk) storedRows() (int64, bool) {
	if !c.copied {
		return 0, false
	}
	rest, ok := strings.CutPrefix(c.checksum, sumVersion+":")
	if !ok {
		return 0, false
	}
	count, _, ok := strings.Cut(rest, ":")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(count, 10, 64)
	return n, err == nil && n >= 0
}

// sameRun compares a run of consecutive chunks (targetRun) on db, the
// target, against their recorded checksums in one read of the rows from
// the first chunk's start to the last one's end: the rows in key order
// are cut into pieces of each chunk's recorded row count and each piece
// hashed (chunkSum). When every piece equals its chunk's checksum and no
// row is left over, the target's rows of the range are, in order, the
// source's rows of the chunks as recorded, each therefore in its own
// chunk's range: every chunk is equal. Otherwise it says nothing of which
// chunk differs (a missing row shifts every piece after it; an extra row
// in a chunk's range can make the next piece differ instead of its own)
// and the caller compares each chunk on its own.
func (t table) sameRun(ctx context.Context, db *sql.DB, run []storedChunk) (bool, error) {
	counts := make([]int64, len(run))
	for i, c := range run {
		counts[i], _ = c.storedRows()
	}
	cond, args := t.where(chunk{lo: run[0].lo, hi: run[len(run)-1].hi})
	i, same := 0, true
	var s chunkSum
	err := t.scanRaw(ctx, db, cond, args, func(raw []sql.RawBytes) bool {
		for i < len(run) && s.n == counts[i] {
			if s.String() != run[i].checksum {
				same = false
				return false
			}
			i, s = i+1, chunkSum{buf: s.buf}
		}
		if i == len(run) {
			same = false // a row past the last piece
			return false
		}
		s.row(raw)
		return true
	})
	if err != nil || !same {
		return false, err
	}
	for ; i < len(run); i++ {
		if s.n != counts[i] || s.String() != run[i].checksum {
			return false, nil
		}
		s = chunkSum{buf: s.buf}
	}
	return true, nil
}

// flagVerified flags the chunks verified, in one statement that also
// says the move progresses (its record's time, ImshardMoveStalled), and
// records the source checksum of those compared on both servers.
func (m *Mover) flagVerified(ctx context.Context, chunks []storedChunk) error {
	if len(chunks) == 0 {
		return nil
	}
	conds := make([]string, len(chunks))
	args := make([]any, 0, 2*len(chunks))
	for i, c := range chunks {
		conds[i] = "(table_name = ? AND chunk_no = ?)"
		args = append(args, c.table, c.no)
	}
	tx, err := m.src.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_move_chunks SET verified = 1 WHERE "+strings.Join(conds, " OR "), args...); err != nil {
		_ = tx.Rollback()
		return err
	}
	for _, c := range chunks {
		if c.checksum == "" {
			continue
		}
		if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_move_chunks SET checksum = ? WHERE table_name = ? AND chunk_no = ?", c.checksum, c.table, c.no); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_move SET updated_at = CURRENT_TIMESTAMP(3) WHERE id = 1"); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// drainMarks copies the rows marked since the verification, before the
// fence, for up to CatchUpRounds rounds or until none is left, so that
// the switch finds only what changed during the last round. A mark goes
// only once its row compared equal on both servers after its copy (a row
// that is not marked stays as the verification, or this comparison, saw
// it on both); a row written again meanwhile keeps its marks for the next
// round, or for the switch, which copies and verifies it behind the fence.
func (m *Mover) drainMarks(ctx context.Context) error {
	tables, err := m.planTables(ctx)
	if err != nil {
		return err
	}
	for round := 0; round < m.o.CatchUpRounds; round++ {
		mk, err := m.readMarks(ctx)
		if err != nil || mk.n == 0 {
			return err
		}
		proven, _, err := m.copyMarked(ctx, tables, mk)
		if err != nil {
			return err
		}
		if err := m.unmark(ctx, proven); err != nil {
			return err
		}
	}
	return nil
}

// SwitchWork is what the switch did behind the fence: the rows marked
// since the verification step it copied and verified (Keys), the chunks
// that step had not proven it compared on both servers (Compared), and
// those of them it copied and verified because they differed (Chunks).
type SwitchWork struct {
	Keys, Compared, Chunks int
}

// fencedSync is the switch's work behind the source fence: it plans the
// tables created since (their chunks unverified), copies and verifies the
// marked rows, then compares the unverified chunks and copies and
// verifies those that differ.
func (m *Mover) fencedSync(ctx context.Context) error {
	tables, err := m.planTables(ctx)
	if err != nil {
		return err
	}
	mk, err := m.readMarks(ctx)
	if err != nil {
		return err
	}
	if _, differ, err := m.copyMarked(ctx, tables, mk); err != nil {
		return err
	} else if differ != "" {
		return fmt.Errorf("move: verify %s: differs on the target after its copy behind the fence", differ)
	}
	m.work.Keys = mk.n
	if m.work.Compared, err = m.unverified(ctx); err != nil {
		return err
	}
	differ, err := m.verifyChunks(ctx, tables, false)
	if err != nil {
		return err
	}
	m.work.Chunks = len(differ)
	if err := m.copyChunks(ctx, tables, differ); err != nil {
		return err
	}
	if differ, err = m.verifyChunks(ctx, tables, false); err != nil {
		return err
	}
	if len(differ) > 0 {
		c := differ[0]
		return fmt.Errorf("move: verify %s chunk %d: differs on the target after its copy behind the fence", c.table, c.no)
	}
	return nil
}
