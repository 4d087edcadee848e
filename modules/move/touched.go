package move

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
)

// The verification step compares most chunks on the target only, against
// the source checksum recorded with the chunk (by its copy, a catch-up
// round or a comparison on both servers): a chunk whose rows nobody wrote
// since that checksum was taken holds it still on the source. Every write
// since is marked, and the marks are cleared only by clearMarks (which
// first blanks the recorded checksum of every chunk a mark falls in: the
// chunk is compared on both servers again) or after their rows were copied
// onto the target (drainMarks, the switch), so the target no longer holds
// what the old checksum says unless the source does too.

// execQuerier is a *sql.DB or a *sql.Tx.
type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// chunkIndex finds the chunks a marked key falls in, per table.
type chunkIndex map[string][]storedChunk

func newChunkIndex(all []storedChunk) chunkIndex {
	idx := chunkIndex{}
	for _, c := range all {
		idx[c.table] = append(idx[c.table], c)
	}
	for _, cs := range idx {
		sort.Slice(cs, func(i, j int) bool { return cs[i].no < cs[j].no })
	}
	return idx
}

// of adds to into the chunk numbers of table name that key can fall in:
// the one chunk holding it when the key is one integer column, every
// chunk of the table otherwise (a string's order is the column's
// collation's, which this process does not know).
func (idx chunkIndex) of(name string, key []any, into map[int]bool) {
	cs := idx[name]
	i := sort.Search(len(cs), func(i int) bool {
		below, ok := atMost(key, cs[i].hi)
		return !ok || below
	})
	if i < len(cs) {
		if _, ok := atMost(key, cs[i].hi); ok {
			into[cs[i].no] = true
			return
		}
	}
	for _, c := range cs {
		into[c.no] = true
	}
}

// atMost says whether key <= hi (hi nil: the open end), when both are one
// integer of the same kind; ok is false otherwise.
func atMost(key, hi []any) (below, ok bool) {
	if len(key) != 1 {
		return false, false
	}
	if hi == nil {
		switch key[0].(type) {
		case int64, uint64:
			return true, true
		}
		return false, false
	}
	if len(hi) != 1 {
		return false, false
	}
	switch k := key[0].(type) {
	case int64:
		h, ok := hi[0].(int64)
		return ok && k <= h, ok
	case uint64:
		h, ok := hi[0].(uint64)
		return ok && k <= h, ok
	}
	return false, false
}

// markBatch is how many marks clearMarks removes at a time before its
// last transaction.
const markBatch = 10000

// clearMarks removes every mark and clears the chunks' verified flags but
// for the chunks the copy step proved (proveTable), blanking first the
// recorded checksum and the proof of each chunk a mark falls in. The
// marks go in batches (each batch's chunks blanked before its marks are
// removed, by id), then the last ones in a transaction that locks them
// (under REPEATABLE READ holding the writers' new marks back until it
// commits: it must find few), removes those by id and clears the flags. A mover killed between a blank and the
// removal finds the marks again; a blank stays until the chunk's next
// comparison on both servers or copy, a proof taken back for good.
func (m *Mover) clearMarks(ctx context.Context) error {
	all, err := m.chunks(ctx, "")
	if err != nil {
		return err
	}
	idx := newChunkIndex(all)
	for {
		ids, err := m.blankMarked(ctx, m.src, idx, " ORDER BY id LIMIT "+fmt.Sprint(markBatch))
		if err != nil {
			return err
		}
		if err := m.unmark(ctx, ids); err != nil {
			return err
		}
		if len(ids) < markBatch {
			break
		}
	}
	tx, err := m.src.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	ids, err := m.blankMarked(ctx, tx, idx, " FOR UPDATE")
	if err != nil {
		return err
	}
	// by id: a mark this transaction's read did not lock (under READ
	// COMMITTED, with no gap locks) stays, its chunk not blanked
	if err := deleteMarks(ctx, tx, ids); err != nil {
		return err
	}
	// a chunk the copy step proved, and no mark removed here or before fell
	// in since, holds what the proof saw on both servers but for the rows
	// still marked (the switch copies those)
	if _, err := tx.ExecContext(ctx, "UPDATE im_tenant_move_chunks SET verified = proven"); err != nil {
		return err
	}
	return tx.Commit()
}

// blankMarked reads the marks (the clause tail after the query: an order
// and a limit, or a lock) and blanks the recorded checksum and the proof
// of the chunks they fall in; it returns the marks' ids.
func (m *Mover) blankMarked(ctx context.Context, q execQuerier, idx chunkIndex, tail string) ([]int64, error) {
	rows, err := q.QueryContext(ctx, "SELECT id, table_name, key_text FROM im_tenant_move_marks"+tail)
	if err != nil {
		return nil, fmt.Errorf("move: read the marks: %w", err)
	}
	var ids []int64
	touched := map[string]map[int]bool{}
	for rows.Next() {
		var id int64
		var name, text string
		if err := rows.Scan(&id, &name, &text); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
		key, err := decodeKey(text)
		if err != nil {
			rows.Close()
			return nil, err
		}
		if touched[name] == nil {
			touched[name] = map[int]bool{}
		}
		idx.of(name, key, touched[name])
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for name, nos := range touched {
		list := make([]any, 0, len(nos))
		for no := range nos {
			list = append(list, no)
		}
		for i := 0; i < len(list); i += 1000 {
			part := list[i:min(i+1000, len(list))]
			if _, err := q.ExecContext(ctx, "UPDATE im_tenant_move_chunks SET checksum = '', proven = 0 WHERE table_name = ? AND chunk_no IN ("+
				strings.TrimSuffix(strings.Repeat("?, ", len(part)), ", ")+")", append([]any{name}, part...)...); err != nil {
				return nil, fmt.Errorf("move: blank the checksums of the marked chunks: %w", err)
			}
		}
	}
	return ids, nil
}
