package move

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"strconv"
	"strings"
	"time"
)

// skipped are the tables a move does not copy: the schema versions and the
// fence belong to each database, and the move's own state stays where it is.
var skipped = map[string]bool{
	"im_schema_migrations":  true,
	"im_tenant_fence":       true,
	"im_tenant_move":        true,
	"im_tenant_move_chunks": true,
	"im_tenant_move_marks":  true,
}

// table is one copied table: its columns in order and its primary key.
type table struct {
	name string
	cols []string
	pk   []string
}

// tablesByName indexes tables by name.
func tablesByName(tables []table) map[string]table {
	out := make(map[string]table, len(tables))
	for _, t := range tables {
		out[t.name] = t
	}
	return out
}

func quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = quote(n)
	}
	return strings.Join(q, ", ")
}

// CopiedTables names the tables of the tenant database db that a move
// copies and verifies (every base table but the ones skipped).
func CopiedTables(ctx context.Context, db *sql.DB) ([]string, error) {
	tables, err := listTables(ctx, db)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.name
	}
	return names, nil
}

// listTables reads the tenant database's base tables, their columns and
// primary keys, in three queries whatever the number of tables (the plan
// runs at every step); a table without a primary key cannot be chunked and
// fails.
func listTables(ctx context.Context, db *sql.DB) ([]table, error) {
	names, err := column(ctx, db, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' ORDER BY table_name`)
	if err != nil {
		return nil, fmt.Errorf("move: list tables: %w", err)
	}
	cols, err := columnsByTable(ctx, db, `SELECT table_name, column_name FROM information_schema.columns
		WHERE table_schema = DATABASE() ORDER BY table_name, ordinal_position`)
	if err != nil {
		return nil, fmt.Errorf("move: list columns: %w", err)
	}
	pks, err := columnsByTable(ctx, db, `SELECT table_name, column_name FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND index_name = 'PRIMARY' ORDER BY table_name, seq_in_index`)
	if err != nil {
		return nil, fmt.Errorf("move: list primary keys: %w", err)
	}
	out := make([]table, 0, len(names))
	for _, n := range names {
		if skipped[n] {
			continue
		}
		t := table{name: n, cols: cols[n], pk: pks[n]}
		if len(t.pk) == 0 {
			return nil, fmt.Errorf("move: table %s has no primary key", n)
		}
		out = append(out, t)
	}
	return out, nil
}

// columnsByTable reads query's rows of (table, column) into each table's
// columns, in the order read.
func columnsByTable(ctx context.Context, db *sql.DB, query string) (map[string][]string, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var tbl, col string
		if err := rows.Scan(&tbl, &col); err != nil {
			return nil, err
		}
		out[tbl] = append(out[tbl], col)
	}
	return out, rows.Err()
}

func column(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// chunk is a primary key range: after lo (none: from the start) up to and
// including hi (none: to the end).
type chunk struct {
	no     int
	lo, hi []any
}

// where is the chunk's range condition and its arguments.
func (t table) where(c chunk) (string, []any) {
	var conds []string
	var args []any
	if c.lo != nil {
		cond, a := t.past(">", ">", c.lo)
		conds, args = append(conds, cond), append(args, a...)
	}
	if c.hi != nil {
		cond, a := t.past("<", "<=", c.hi)
		conds, args = append(conds, cond), append(args, a...)
	}
	if len(conds) == 0 {
		return "1 = 1", nil
	}
	return strings.Join(conds, " AND "), args
}

// past is the primary key compared with key in key order: (a op ?) OR
// (a = ? AND b op ?) … with last as the last column's operator. MariaDB
// reads a row constructor comparison ((a, b) > (?, ?)) of a composite key
// by scanning the whole index; this form is a range of the primary key.
func (t table) past(op, last string, key []any) (string, []any) {
	terms := make([]string, len(t.pk))
	var args []any
	for i, c := range t.pk {
		parts := make([]string, 0, i+1)
		for j := 0; j < i; j++ {
			parts = append(parts, quote(t.pk[j])+" = ?")
			args = append(args, key[j])
		}
		o := op
		if i == len(t.pk)-1 {
			o = last
		}
		parts = append(parts, quote(c)+" "+o+" ?")
		args = append(args, key[i])
		terms[i] = "(" + strings.Join(parts, " AND ") + ")"
	}
	return "(" + strings.Join(terms, " OR ") + ")", args
}

// keysWhere is the condition of the rows whose primary keys are keys.
func (t table) keysWhere(keys [][]any) (string, []any) {
	one := make([]string, len(t.pk))
	for i, c := range t.pk {
		one[i] = quote(c) + " = ?"
	}
	row := "(" + strings.Join(one, " AND ") + ")"
	conds := make([]string, len(keys))
	args := make([]any, 0, len(keys)*len(t.pk))
	for i, k := range keys {
		conds[i] = row
		args = append(args, k...)
	}
	return strings.Join(conds, " OR "), args
}

// checksum is the chunk's rows' count and hash (see chunkSum) on db.
func (t table) checksum(ctx context.Context, db *sql.DB, c chunk) (string, error) {
	cond, args := t.where(c)
	return t.checksumWhere(ctx, db, cond, args)
}

// checksumWhere is the count and hash (see chunkSum) of the rows cond selects,
// read once in primary key order and hashed here: the server only reads
// and sends them, with no expression per row.
func (t table) checksumWhere(ctx context.Context, db *sql.DB, cond string, args []any) (string, error) {
	var s chunkSum
	err := t.scanRaw(ctx, db, cond, args, func(raw []sql.RawBytes) bool {
		s.row(raw)
		return true
	})
	return s.String(), err
}

// scanRaw reads the rows cond selects on db (selectWhere) as raw bytes,
// handing each to row until row answers false or the rows end; the bytes
// are valid only during the call.
func (t table) scanRaw(ctx context.Context, db *sql.DB, cond string, args []any, row func([]sql.RawBytes) bool) error {
	rows, err := db.QueryContext(ctx, t.selectWhere(cond), args...)
	if err != nil {
		return fmt.Errorf("move: checksum %s: %w", t.name, err)
	}
	defer rows.Close()
	raw := make([]sql.RawBytes, len(t.cols))
	ptrs := make([]any, len(t.cols))
	for i := range raw {
		ptrs[i] = &raw[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("move: checksum %s: %w", t.name, err)
		}
		if !row(raw) {
			return nil
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("move: checksum %s: %w", t.name, err)
	}
	return nil
}

// selectWhere reads every column of the rows cond selects in primary key
// order: the copy's read and the checksum's, so both see the same values
// of the same types (the same protocol for the same arguments).
func (t table) selectWhere(cond string) string {
	return "SELECT " + quoteAll(t.cols) + " FROM " + quote(t.name) + " WHERE " + cond + " ORDER BY " + quoteAll(t.pk)
}

// sumVersion prefixes every checksum chunkSum writes: a checksum recorded by a
// mover that computed it another way never equals one of this kind, so its
// chunk is compared on both servers (or copied) again, never taken as equal.
const sumVersion = "h1"

var crcTable = crc64.MakeTable(crc64.ECMA)

// chunkSum is a chunk's checksum: its row count and a CRC-64 of its rows in
// primary key order, each row written as every column's NULL mark (0) or
// 1, its length and its bytes as the server sends them. The copy computes
// it over the rows it reads (row values), the verification over the rows
// it reads on either server (rows read as raw bytes); a changed byte in
// any column, NULL for an empty string, a missing, an extra or a moved
// row changes it.
type chunkSum struct {
	n   int64
	crc uint64
	buf []byte
}

// row adds a row read as raw bytes (nil: NULL).
func (s *chunkSum) row(cols []sql.RawBytes) {
	s.buf = s.buf[:0]
	for _, c := range cols {
		s.buf = appendCol(s.buf, c, c == nil)
	}
	s.add()
}

// values adds a row read as the driver's values. Each is turned into the
// bytes database/sql gives a sql.RawBytes for it (numbers in decimal as
// strconv formats them, a time in RFC 3339 with nanoseconds), so the
// copy's checksum of a row equals the verification's.
func (s *chunkSum) values(vals []any) error {
	s.buf = s.buf[:0]
	var scratch [32]byte
	for _, v := range vals {
		var b []byte
		switch x := v.(type) {
		case nil:
		case []byte:
			b = x
		case string:
			b = []byte(x)
		case int64:
			b = strconv.AppendInt(scratch[:0], x, 10)
		case uint64:
			b = strconv.AppendUint(scratch[:0], x, 10)
		case float64:
			b = strconv.AppendFloat(scratch[:0], x, 'g', -1, 64)
		case float32:
			b = strconv.AppendFloat(scratch[:0], float64(x), 'g', -1, 32)
		case bool:
			b = strconv.AppendBool(scratch[:0], x)
		case time.Time:
			b = x.AppendFormat(scratch[:0], time.RFC3339Nano)
		default:
			return fmt.Errorf("move: checksum: a value of type %T", v)
		}
		s.buf = appendCol(s.buf, b, v == nil)
	}
	s.add()
	return nil
}

func appendCol(buf, b []byte, null bool) []byte {
	if null {
		return append(buf, 0)
	}
	buf = append(buf, 1)
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	return append(buf, b...)
}

func (s *chunkSum) add() {
	s.n++
	s.crc = crc64.Update(s.crc, crcTable, s.buf)
}

// String is the checksum as recorded: version, row count, CRC-64.
func (s *chunkSum) String() string {
	return fmt.Sprintf("%s:%d:%016x", sumVersion, s.n, s.crc)
}

// boundaries splits the table from the chunk from on (its number and
// start) into chunks of size rows by primary key, the last open-ended.
func (t table) boundaries(ctx context.Context, db *sql.DB, size int, from chunk) ([]chunk, error) {
	var out []chunk
	lo := from.lo
	for {
		c := chunk{no: from.no + len(out), lo: lo}
		cond, args := t.where(c)
		q := "SELECT " + quoteAll(t.pk) + " FROM " + quote(t.name) + " WHERE " + cond +
			" ORDER BY " + quoteAll(t.pk) + fmt.Sprintf(" LIMIT 1 OFFSET %d", size-1)
		vals := make([]any, len(t.pk))
		ptrs := make([]any, len(t.pk))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		err := db.QueryRowContext(ctx, q, args...).Scan(ptrs...)
		if err == sql.ErrNoRows {
			out = append(out, c)
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("move: split %s: %w", t.name, err)
		}
		c.hi = vals
		out = append(out, c)
		lo = vals
	}
}

// copyChunk replaces the chunk's rows on the target by the source's, in one
// target transaction (the range deleted, the rows written by REPLACE, which
// also deletes a target row of another range holding one of their unique
// keys), and returns the rows and bytes it wrote and the
// checksum of the rows it read (which the target now holds).
func (t table) copyChunk(ctx context.Context, src, dst *sql.DB, c chunk) (rowsN, bytesN int64, checksum string, err error) {
	cond, args := t.where(c)
	return t.copyWhere(ctx, src, dst, cond, args)
}

// copyWhere is copyChunk for the rows cond selects.
func (t table) copyWhere(ctx context.Context, src, dst *sql.DB, cond string, args []any) (rowsN, bytesN int64, checksum string, err error) {
	rows, err := src.QueryContext(ctx, t.selectWhere(cond), args...)
	if err != nil {
		return 0, 0, "", fmt.Errorf("move: read %s: %w", t.name, err)
	}
	var data [][]any
	var s chunkSum
	for rows.Next() {
		vals := make([]any, len(t.cols))
		ptrs := make([]any, len(t.cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			rows.Close()
			return 0, 0, "", err
		}
		if err := s.values(vals); err != nil {
			rows.Close()
			return 0, 0, "", err
		}
		for _, v := range vals {
			switch x := v.(type) {
			case []byte:
				bytesN += int64(len(x))
			case nil:
			default:
				bytesN += 8
			}
		}
		data = append(data, vals)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, "", fmt.Errorf("move: read %s: %w", t.name, err)
	}
	tx, err := dst.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, "", err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "DELETE FROM "+quote(t.name)+" WHERE "+cond, args...); err != nil {
		return 0, 0, "", fmt.Errorf("move: clear %s on the target: %w", t.name, err)
	}
	const batch = 200
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(t.cols)), ", ") + ")"
	for i := 0; i < len(data); i += batch {
		end := min(i+batch, len(data))
		marks := make([]string, 0, end-i)
		vals := make([]any, 0, (end-i)*len(t.cols))
		for _, r := range data[i:end] {
			marks = append(marks, one)
			vals = append(vals, r...)
		}
		// REPLACE, not INSERT: a stale target row outside the range (a key
		// corrupted into the next chunk, a row the source deleted whose
		// (topic, seqid) a row of this range now holds) that conflicts on
		// a unique key is deleted, not a duplicate key error. The source
		// holds no such pair, so that row is wrong on the target whatever
		// it is; its own chunk then differs and is copied too.
		if _, err := tx.ExecContext(ctx, "REPLACE INTO "+quote(t.name)+" ("+quoteAll(t.cols)+") VALUES "+strings.Join(marks, ", "), vals...); err != nil {
			return 0, 0, "", fmt.Errorf("move: write %s on the target: %w", t.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, "", err
	}
	return int64(len(data)), bytesN, s.String(), nil
}

// tableSum is the table's CHECKSUM TABLE: the sum (modulo 2^32) of a CRC32
// of each row's bytes as the server holds them (every column's value and
// the NULL flags), computed by the server in C as it reads the rows — no
// SQL expression per row. It is NULL when the table is missing. Tables of
// the same definition hold the same sum for the same rows, whatever their
// row format or the order the rows were written in.
func (t table) tableSum(ctx context.Context, db *sql.DB) (sql.NullInt64, error) {
	var name string
	var sum sql.NullInt64
	if err := db.QueryRowContext(ctx, "CHECKSUM TABLE "+quote(t.name)).Scan(&name, &sum); err != nil {
		return sum, fmt.Errorf("move: checksum table %s: %w", t.name, err)
	}
	return sum, nil
}

// sameTable compares the table's CHECKSUM TABLE on both servers, read at
// once. A changed byte changes its row's CRC32, so the sum; a missing or
// an extra row changes it unless that row's own CRC32 is 0.
func (t table) sameTable(ctx context.Context, src, dst *sql.DB) (bool, error) {
	sum, dsum, err := onBoth(src, dst, func(db *sql.DB) (sql.NullInt64, error) { return t.tableSum(ctx, db) })
	if err != nil {
		return false, err
	}
	return sum.Valid && dsum.Valid && sum.Int64 == dsum.Int64, nil
}

// onBoth runs read on the source and the target at once.
func onBoth[T any](src, dst *sql.DB, read func(*sql.DB) (T, error)) (T, T, error) {
	var b T
	var berr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		b, berr = read(dst)
	}()
	a, err := read(src)
	<-done
	return a, b, errors.Join(err, berr)
}
