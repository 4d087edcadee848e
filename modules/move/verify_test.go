package move

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"testing"

	imsql "github.com/imshard/imshard/sql"
	"github.com/imshard/imshard/test/testenv"
)

// verifySetup is a mover between two fresh tenant databases of the shared
// server, its source holding one month table of 300 messages with every
// column set, planned in chunks of 50 rows and copied.
func verifySetup(t *testing.T) (*Mover, string) {
	t.Helper()
	ctx := context.Background()
	src, dst := moverDB(t), moverDB(t)
	const name = "im_group_messages_209001"
	exec := func(db *sql.DB, q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(src, strings.ReplaceAll(imsql.MonthTable(), "{{table}}", name))
	for i := 1; i <= 300; i++ {
		exec(src, "INSERT INTO "+name+` (message_id, topic, group_id, seqid, from_user, client_msg_id, msg_type, status,
			content, head, mentioned_user_ids, mention_all, reply_seqid, root_seqid, file_count, content_size, has_risk,
			audit_status, version, recalled_at, recalled_by, deleted_at, expires_at, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, 'text', 'normal', ?, '{"h":"head"}', '[11,12]', 1, ?, ?, 2, 40, 1, 'pass', 3,
			'2090-01-02 03:04:05.678', 77, '2090-01-03 03:04:05.678', '2090-06-01 00:00:00.123', '2090-01-01 00:00:00.001', '2090-01-01 00:00:00.002')`,
			1000+i, fmt.Sprintf("topic-%d", i%7), 500+i%7, i, 900+i%5, fmt.Sprintf("cmid-%d", i),
			fmt.Sprintf(`{"text":"hello number %d"}`, i), i-1, 1)
	}
	exec(src, "INSERT INTO im_tenant_move (id, role, peer_dsn, step, from_epoch) VALUES (1, 'source', '', ?, 0)", StepVerify)
	m := &Mover{src: src, dst: dst, o: Options{ChunkRows: 50, CatchUpRounds: 2}, st: State{Step: StepVerify}}
	if err := m.copyAll(ctx); err != nil {
		t.Fatal(err)
	}
	return m, name
}

// moverDB is a fresh migrated tenant database of the shared server, opened
// as the mover opens its source and target (OpenDB: no time parsing).
func moverDB(t testing.TB) *sql.DB {
	db, _ := tenantDB(t)
	return db
}

// tenantDB is a fresh migrated tenant database of the shared server,
// opened as the mover opens it and as the tests do (times parsed).
func tenantDB(t testing.TB) (mover, parsed *sql.DB) {
	t.Helper()
	tenant, parsed := testenv.MigratedTenantDB(t)
	mover, _, err := OpenDB(strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mover.Close() })
	return mover, parsed
}

// TestChecksumOfTheCopyIsTheServers: the checksum a copy computes over
// the values it read equals the one the verification computes over the
// raw bytes it reads, on the source and on the target, for every kind of
// column (integers signed and unsigned at their limits, floats, decimals,
// times, strings, binary, bits, JSON, NULL and the empty string), read with arguments
// (a chunk with a bound: prepared, binary protocol) and without (a table's
// only chunk: text protocol); and a change of one value changes it.
func TestChecksumOfTheCopyIsTheServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, srcParsed := tenantDB(t)
	dst, dstParsed := tenantDB(t)
	const ddl = `CREATE TABLE kinds (
		id BIGINT UNSIGNED NOT NULL, i TINYINT, s SMALLINT UNSIGNED, m MEDIUMINT, b BIGINT, u BIGINT UNSIGNED,
		f FLOAT, d DOUBLE, n DECIMAL(20,6), dt DATETIME(3), ts TIMESTAMP(6) NULL, da DATE, ti TIME(2), y YEAR,
		v VARCHAR(20), c CHAR(4), bin VARBINARY(8), bl BLOB, bits BIT(12), e ENUM('a','b'), j JSON,
		PRIMARY KEY (id))`
	for _, db := range []*sql.DB{src, dst} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.ExecContext(ctx, `INSERT INTO kinds VALUES
		(1, -128, 65535, -8388608, -9223372036854775808, 18446744073709551615, 3.4e38, 2.2250738585072014e-308,
		 -12345678901234.123456, '2090-01-02 03:04:05.678', '2038-01-19 03:14:07.999999', '2090-12-31', '-838:59:59.99', 2155,
		 'héllo', 'ab', x'00ff00', x'deadbeef', b'101010101010', 'b', '{"k": [1, 2.5, null]}'),
		(2, 0, 0, 0, 0, 0, 0.1, 0.1, 0, '2090-01-01 00:00:00', '2026-01-01 00:00:00', '1000-01-01', '00:00:00', 1901,
		 '', '', x'', x'', b'0', 'a', '{}'),
		(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
		(4, 1, 2, 3, 4, 5, -1.5e-7, 1e300, 0.000001, '2090-01-01 00:00:00.001', NULL, '2090-01-01', '12:34:56.7', 2000,
		 'x', 'y', x'01', x'02', b'1', 'a', '[]')`); err != nil {
		t.Fatal(err)
	}
	tables, err := listTables(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	tbl := tablesByName(tables)["kinds"]
	for _, pair := range []struct {
		name     string
		src, dst *sql.DB
	}{{"as the mover opens them", src, dst}, {"with times parsed", srcParsed, dstParsed}} {
		for _, c := range []chunk{{}, {lo: []any{int64(0)}, hi: []any{int64(4)}}} {
			_, _, copied, err := tbl.copyChunk(ctx, pair.src, pair.dst, c)
			if err != nil {
				t.Fatalf("%s, chunk %v: %v", pair.name, c, err)
			}
			if !strings.HasPrefix(copied, sumVersion+":4:") {
				t.Fatalf("%s, chunk %v: the copy's checksum %s, want 4 rows", pair.name, c, copied)
			}
			for side, db := range map[string]*sql.DB{"source": pair.src, "target": pair.dst} {
				got, err := tbl.checksum(ctx, db, c)
				if err != nil {
					t.Fatal(err)
				}
				if got != copied {
					t.Errorf("%s, chunk %v: the %s's checksum %s, the copy's %s", pair.name, c, side, got, copied)
				}
			}
		}
	}
	before, err := tbl.checksum(ctx, dst, chunk{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.ExecContext(ctx, "UPDATE kinds SET f = 0.2 WHERE id = 4"); err != nil {
		t.Fatal(err)
	}
	if after, err := tbl.checksum(ctx, dst, chunk{}); err != nil || after == before {
		t.Fatalf("a float changed: checksum %s before, %s after (%v)", before, after, err)
	}
}

// tablesOf lists the tables of the mover's source.
func tablesOf(t *testing.T, m *Mover) []table {
	t.Helper()
	tables, err := listTables(context.Background(), m.src)
	if err != nil {
		t.Fatal(err)
	}
	return tables
}

// chunkNos is the chunks' numbers, in order.
func chunkNos(chunks []storedChunk) string {
	nos := make([]int, len(chunks))
	for i, c := range chunks {
		nos[i] = c.no
	}
	sort.Ints(nos)
	return fmt.Sprint(nos)
}

// provenChunks counts the chunks of table name the copy step proved.
func provenChunks(t *testing.T, m *Mover, name string) int {
	t.Helper()
	var n int
	if err := m.src.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM im_tenant_move_chunks WHERE table_name = ? AND proven = 1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// reprove takes the copy step's proof of the table back and, when again
// is set, takes it anew (proveTable) and says whether it proved every
// chunk.
func reprove(t *testing.T, m *Mover, tbl table, again bool) bool {
	t.Helper()
	ctx := context.Background()
	if _, err := m.src.ExecContext(ctx, "UPDATE im_tenant_move_chunks SET proven = 0 WHERE table_name = ?", tbl.name); err != nil {
		t.Fatal(err)
	}
	if !again {
		return false
	}
	if err := m.proveTable(ctx, tbl); err != nil {
		t.Fatal(err)
	}
	var all int
	if err := m.src.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move_chunks WHERE table_name = ?", tbl.name).Scan(&all); err != nil {
		t.Fatal(err)
	}
	return provenChunks(t, m, tbl.name) == all
}

// verifyOnce runs the verification's first round as verifyAll does: the
// marks cleared, then (after written, when set) the whole-table pass and
// the per-chunk pass. It returns whether the whole-table pass proved the
// table, and the chunks the per-chunk pass found differing.
func verifyOnce(t *testing.T, m *Mover, name string, written func()) (bool, []storedChunk) {
	t.Helper()
	ctx := context.Background()
	if err := m.clearMarks(ctx); err != nil {
		t.Fatal(err)
	}
	if written != nil {
		written()
	}
	tables := tablesOf(t, m)
	if err := m.verifyTables(ctx, tables); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := m.src.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move_chunks WHERE table_name = ? AND verified = 0", name).Scan(&left); err != nil {
		t.Fatal(err)
	}
	differ, err := m.verifyChunks(ctx, tables, true)
	if err != nil {
		t.Fatal(err)
	}
	return left == 0, differ
}

// TestVerificationFindsEveryCorruption: after a copy the copy step's proof
// and both passes of the verification prove the month table equal (the
// whole-table pass by CHECKSUM TABLE, no chunk left to the per-chunk
// pass); then the target is corrupted in one way at a time — one byte of
// one column of one row, for every column; a value made NULL where the
// source holds an empty string; a row missing; a row added inside a chunk
// and past the last — and each time the copy step's proof and the
// whole-table pass prove nothing and the per-chunk pass names the row's
// chunk (both chunks the key left and entered when the key itself
// changed), which a copy repairs. A table written on the source since the
// marks were cleared is left to the per-chunk pass.
func TestVerificationFindsEveryCorruption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	tables := tablesOf(t, m)
	tbl := tablesByName(tables)[name]
	if n := provenChunks(t, m, name); n != 7 {
		t.Fatalf("after the copy: %d chunks proven by the copy step, want the table's 7", n)
	}
	// the verification step's own passes, without the copy step's proof
	reprove(t, m, tbl, false)
	if whole, differ := verifyOnce(t, m, name, nil); !whole || len(differ) != 0 {
		t.Fatalf("after the copy: whole-table pass proved %v, chunks differing %d; want true, 0", whole, len(differ))
	}
	corrupt := func(what string, q string, args ...any) {
		t.Helper()
		res, err := m.dst.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%s: %d rows changed, want 1", what, n)
		}
		// the copy step's proof, as if the copy had written the target so
		// (it proves nothing), then the verification step's passes
		if reprove(t, m, tbl, true) {
			t.Errorf("%s: the copy step's proof proved the table equal", what)
		}
		whole, differ := verifyOnce(t, m, name, nil)
		if whole {
			t.Errorf("%s: the whole-table pass proved the table equal", what)
		}
		if len(differ) == 0 {
			t.Fatalf("%s: no chunk differs", what)
		}
		for _, c := range differ {
			if c.table != name {
				t.Fatalf("%s: chunks differing %+v, want only chunks of %s", what, differ, name)
			}
		}
		// in key order: a key moved into the next chunk is cleared there
		// by its old chunk's copy (TestCopyClearsAStaleRowOfAnotherChunkHoldingItsUniqueKey)
		sort.Slice(differ, func(i, j int) bool { return differ[i].no < differ[j].no })
		if err := m.copyChunks(ctx, tables, differ); err != nil {
			t.Fatal(err)
		}
		if whole, differ := verifyOnce(t, m, name, nil); !whole || len(differ) != 0 {
			t.Fatalf("%s, repaired: whole-table pass %v, chunks differing %d", what, whole, len(differ))
		}
	}
	types, err := column(ctx, m.src, `SELECT data_type FROM information_schema.columns
		WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position`, name)
	if err != nil {
		t.Fatal(err)
	}
	for i, col := range tbl.cols {
		c := quote(col)
		var set string
		switch types[i] {
		case "tinyint", "int", "bigint":
			set = c + " = " + c + " ^ 1"
		case "datetime":
			set = c + " = " + c + " + INTERVAL 1 SECOND"
		case "varchar", "longtext":
			// one character of the value (a digit keeps the JSON valid)
			set = c + " = INSERT(" + c + ", CHAR_LENGTH(" + c + ") - 2, 1, IF(SUBSTRING(" + c + ", CHAR_LENGTH(" + c + ") - 2, 1) = '5', '6', '5'))"
		default:
			t.Fatalf("column %s of type %s: no corruption for it", col, types[i])
		}
		// a row inside a chunk; the key's own byte on the last row, whose
		// neighbour key is free
		row := 1123
		if col == "message_id" {
			row = 1300
		}
		corrupt("one byte of "+col, "UPDATE "+quote(name)+" SET "+set+" WHERE message_id = ?", row)
	}
	for _, db := range []*sql.DB{m.src, m.dst} {
		if _, err := db.ExecContext(ctx, "UPDATE "+quote(name)+" SET client_msg_id = '' WHERE message_id = 1200"); err != nil {
			t.Fatal(err)
		}
	}
	corrupt("an empty string made NULL", "UPDATE "+quote(name)+" SET client_msg_id = NULL WHERE message_id = 1200")
	corrupt("a missing row", "DELETE FROM "+quote(name)+" WHERE message_id = 1077")
	// message_id 1077 is the only free key inside the chunks once the row is gone
	for _, db := range []*sql.DB{m.src, m.dst} {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+quote(name)+" WHERE message_id = 1077"); err != nil {
			t.Fatal(err)
		}
	}
	extra := "INSERT INTO " + quote(name) + " (message_id, topic, group_id, seqid, from_user, created_at, updated_at) VALUES (?, 'extra', 1, ?, 1, NOW(3), NOW(3))"
	corrupt("an extra row inside a chunk", extra, 1077, 1077)
	corrupt("an extra row past the last chunk", extra, 5000, 5000)

	// written on the source since the marks were cleared: left to the
	// chunks, which find it equal (the write was undone)
	undone := func() {
		for _, q := range []string{"version + 1", "version - 1"} {
			if _, err := m.src.ExecContext(ctx, "UPDATE "+quote(name)+" SET version = "+q+" WHERE message_id = 1010"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if whole, differ := verifyOnce(t, m, name, undone); whole || len(differ) != 0 {
		t.Fatalf("a marked table: whole-table pass proved %v, chunks differing %d; want false, 0", whole, len(differ))
	}
}

// TestCopyClearsAStaleRowOfAnotherChunkHoldingItsUniqueKey: a target row
// whose primary key was corrupted into the next chunk still holds its
// (topic, seqid); copying the chunk it left first (chunks copied in key
// order) writes the source's row back, and the stale row in the next chunk,
// which that chunk's range delete does not reach, is removed with it
// instead of failing the copy on uk_topic_seq. The next chunk's copy then
// repairs it, and the table verifies equal.
func TestCopyClearsAStaleRowOfAnotherChunkHoldingItsUniqueKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	// 1077 (chunk 1: keys 1051-1100) made free on both servers, then the
	// target's 1030 (chunk 0) moved there
	for _, db := range []*sql.DB{m.src, m.dst} {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+quote(name)+" WHERE message_id = 1077"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.dst.ExecContext(ctx, "UPDATE "+quote(name)+" SET message_id = 1077 WHERE message_id = 1030"); err != nil {
		t.Fatal(err)
	}
	tables := tablesOf(t, m)
	// as if the copy had written the target so
	if reprove(t, m, tablesByName(tables)[name], true) {
		t.Fatal("the copy step's proof proved the table equal")
	}
	_, differ := verifyOnce(t, m, name, nil)
	sort.Slice(differ, func(i, j int) bool { return differ[i].no < differ[j].no })
	if nos := chunkNos(differ); nos != "[0 1]" {
		t.Fatalf("chunks differing %s, want [0 1]", nos)
	}
	for _, c := range differ {
		if err := m.copyChunks(ctx, tables, []storedChunk{c}); err != nil {
			t.Fatalf("copy of chunk %d: %v", c.no, err)
		}
	}
	if whole, differ := verifyOnce(t, m, name, nil); !whole || len(differ) != 0 {
		t.Fatalf("repaired: whole-table pass %v, chunks differing %d", whole, len(differ))
	}
}

// TestVerificationSeesTheSourceChangedSinceTheCopy: a chunk is compared
// on the target only against the source checksum recorded at its copy,
// unless a row of it was written since. Rows of the source written after
// the copy (marked) make their chunks differ in the next verification
// even when the marks were cleared by a verification killed right after
// (their chunks' recorded checksums stay blank), and only those chunks:
// the others are proven on the target alone.
func TestVerificationSeesTheSourceChangedSinceTheCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	exec := func(q string) {
		t.Helper()
		if _, err := m.src.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec("UPDATE " + quote(name) + " SET content = '{\"text\":\"changed\"}' WHERE message_id = 1030")
	exec("DELETE FROM " + quote(name) + " WHERE message_id = 1180")
	// a verification killed after it cleared the marks
	if err := m.clearMarks(ctx); err != nil {
		t.Fatal(err)
	}
	var blank int
	if err := m.src.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move_chunks WHERE table_name = ? AND checksum = ''", name).Scan(&blank); err != nil {
		t.Fatal(err)
	}
	if blank != 2 {
		t.Fatalf("%d chunks blanked, want the 2 written", blank)
	}
	whole, differ := verifyOnce(t, m, name, nil)
	if whole {
		t.Fatal("the whole-table pass proved a table whose source changed")
	}
	// chunks of 50 keys from 1001: 1030 in chunk 0, 1180 in chunk 3
	if nos := chunkNos(differ); nos != "[0 3]" {
		t.Fatalf("chunks differing %s, want [0 3]", nos)
	}
	tables := tablesOf(t, m)
	if err := m.copyChunks(ctx, tables, differ); err != nil {
		t.Fatal(err)
	}
	// the other chunks still proven by the copy step: the two copied are
	// compared on the target only
	if _, differ := verifyOnce(t, m, name, nil); len(differ) != 0 {
		t.Fatalf("after the copy: chunks differing %d", len(differ))
	}
}

// TestVerificationTakesBackTheProofOfATableWrittenSince: the copy step
// proves a table nobody wrote right after its copy (every chunk proven,
// which the verification step takes as verified without reading it). A
// write on the source after that proof — an edit, a delete and an insert
// in a sealed month — takes the proof back from exactly the chunks the
// marks fall in as the verification step clears the marks, so the
// verification compares those on both servers, finds them differing and
// copies them, and the target ends holding the source's rows. Without the
// proof taken back the chunks stay verified and the writes never reach the
// target (their marks are gone).
func TestVerificationTakesBackTheProofOfATableWrittenSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	if n := provenChunks(t, m, name); n != 7 {
		t.Fatalf("after the copy: %d chunks proven, want the table's 7", n)
	}
	for _, q := range []string{
		"UPDATE " + quote(name) + " SET content = '{\"text\":\"edited\"}' WHERE message_id = 1030",
		"DELETE FROM " + quote(name) + " WHERE message_id = 1180",
		"INSERT INTO " + quote(name) + " (message_id, topic, group_id, seqid, from_user, created_at, updated_at) VALUES (5000, 'late', 1, 5000, 1, NOW(3), NOW(3))",
	} {
		if _, err := m.src.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// the step's first round: six chunks of 50 keys from 1001, then the
	// open-ended one: 1030 in chunk 0, 1180 in chunk 3, 5000 in chunk 6
	whole, differ := verifyOnce(t, m, name, nil)
	if whole {
		t.Fatal("a table written since its proof verified without the chunk pass")
	}
	if nos := chunkNos(differ); nos != "[0 3 6]" {
		t.Fatalf("chunks differing %s, want [0 3 6]", nos)
	}
	if n := provenChunks(t, m, name); n != 4 {
		t.Fatalf("%d chunks still proven, want the 4 not written", n)
	}
	// the whole step, as the mover runs it
	if err := m.verifyAll(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := m.unverified(ctx); err != nil || left != 0 {
		t.Fatalf("after the step: %d chunks unverified (%v), want 0", left, err)
	}
	tables := tablesOf(t, m)
	tbl := tablesByName(tables)[name]
	sum, dsum, err := onBoth(m.src, m.dst, func(db *sql.DB) (string, error) { return tbl.checksum(ctx, db, chunk{}) })
	if err != nil || sum != dsum {
		t.Fatalf("after the step: source %s, target %s (%v)", sum, dsum, err)
	}
}

// TestVerificationReadsARunOfChunksOnce: the chunks compared on the target
// only are read in runs (targetRun: consecutive chunks of a table holding
// a recorded checksum, never the whole table, whose read would take the
// text protocol), and a run is equal only when each piece of its rows, cut
// by the recorded row counts, equals its chunk's checksum and no row is
// left over: a row missing, a value changed, a row added inside a chunk or
// after the last piece's rows (still inside the run's range) each fail
// the run; a chunk without a recorded checksum ends it.
func TestVerificationReadsARunOfChunksOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	tables := tablesOf(t, m)
	all, err := m.chunks(ctx, "table_name = '"+name+"'")
	if err != nil {
		t.Fatal(err)
	}
	// seven chunks: six of 50 keys from 1001, the open-ended last
	if n := targetRun(all); n != 6 {
		t.Fatalf("run of %d chunks, want 6 (the whole table's 7 less its open end)", n)
	}
	if n := targetRun(all[2:]); n != 5 {
		t.Fatalf("run from chunk 2: %d chunks, want 5", n)
	}
	blank := append([]storedChunk(nil), all...)
	blank[3].checksum = ""
	if n := targetRun(blank); n != 3 {
		t.Fatalf("run with chunk 3 blank: %d chunks, want 3", n)
	}
	// keys 1077 (chunk 1) and 1250 (the last of chunk 4) made free on
	// both servers, the chunks copied again
	for _, db := range []*sql.DB{m.src, m.dst} {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+quote(name)+" WHERE message_id IN (1077, 1250)"); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.copyChunks(ctx, tables, []storedChunk{all[1], all[4]}); err != nil {
		t.Fatal(err)
	}
	if all, err = m.chunks(ctx, "table_name = '"+name+"'"); err != nil {
		t.Fatal(err)
	}
	run := all[1:5] // keys 1051 to 1250
	same := func() bool {
		t.Helper()
		ok, err := tablesByName(tables)[name].sameRun(ctx, m.dst, run)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !same() {
		t.Fatal("the copied run differs")
	}
	extra := "INSERT INTO " + quote(name) + " (message_id, topic, group_id, seqid, from_user, created_at, updated_at) VALUES (%d, 'extra', 1, %[1]d, 1, NOW(3), NOW(3))"
	for _, tc := range []struct{ what, corrupt string }{
		{"a row missing", "DELETE FROM " + quote(name) + " WHERE message_id = 1100"},
		{"a value changed", "UPDATE " + quote(name) + " SET version = version + 1 WHERE message_id = 1200"},
		{"a row added inside a chunk", fmt.Sprintf(extra, 1077)},
		{"a row added after the last piece's rows", fmt.Sprintf(extra, 1250)},
	} {
		if _, err := m.dst.ExecContext(ctx, tc.corrupt); err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		if same() {
			t.Errorf("%s: the run is equal", tc.what)
		}
		if err := m.copyChunks(ctx, tables, run); err != nil {
			t.Fatal(err)
		}
		if !same() {
			t.Fatalf("%s, repaired: the run differs", tc.what)
		}
	}
}

// TestChunkIndexOf: a marked key of one integer column falls in the one
// chunk holding it (the last chunk open-ended); any other key in every
// chunk of its table.
func TestChunkIndexOf(t *testing.T) {
	idx := newChunkIndex([]storedChunk{
		{chunk: chunk{no: 1, lo: []any{int64(10)}, hi: []any{int64(20)}}, table: "a"},
		{chunk: chunk{no: 0, hi: []any{int64(10)}}, table: "a"},
		{chunk: chunk{no: 2, lo: []any{int64(20)}}, table: "a"},
		{chunk: chunk{no: 0, hi: []any{"m", int64(3)}}, table: "b"},
		{chunk: chunk{no: 1, lo: []any{"m", int64(3)}}, table: "b"},
	})
	for _, tc := range []struct {
		table string
		key   []any
		want  string
	}{
		{"a", []any{int64(-5)}, "[0]"},
		{"a", []any{int64(10)}, "[0]"},
		{"a", []any{int64(11)}, "[1]"},
		{"a", []any{int64(20)}, "[1]"},
		{"a", []any{int64(21)}, "[2]"},
		{"a", []any{"x"}, "[0 1 2]"},
		{"b", []any{"a", int64(1)}, "[0 1]"},
		{"c", []any{int64(1)}, "[]"},
	} {
		got := map[int]bool{}
		idx.of(tc.table, tc.key, got)
		var nos []int
		for no := range got {
			nos = append(nos, no)
		}
		sort.Ints(nos)
		if s := fmt.Sprint(nos); s != tc.want {
			t.Errorf("%s %v: chunks %s, want %s", tc.table, tc.key, s, tc.want)
		}
	}
}

// TestDrainedRowsAreComparedBeforeTheirMarksGo: after the verification a
// row written on the source is marked; the copy of the marks before the
// fence (drainMarks) removes a mark only once its row compared equal on
// both servers after its copy. Here the target mangles every row written
// into it (a trigger standing for a copy gone wrong), so the drained row
// differs and keeps its mark; the switch's copy behind the fence, the
// target sound again, copies and verifies it, and the table ends equal on
// both servers. Without the comparison the mark went with the drain, the
// switch never looked at the row again, and the target kept the mangled
// one. A chunk the pre-checks' catch-up copies again is no longer
// counted as verified, so the switch compares it too.
func TestDrainedRowsAreComparedBeforeTheirMarksGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	if err := m.verifyAll(ctx); err != nil {
		t.Fatal(err)
	}
	exec := func(db *sql.DB, q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(m.dst, "CREATE TRIGGER mangle BEFORE INSERT ON "+quote(name)+` FOR EACH ROW SET NEW.content = '{"text":"mangled"}'`)
	exec(m.src, "UPDATE "+quote(name)+` SET content = '{"text":"edited"}' WHERE message_id = 1030`)
	if err := m.drainMarks(ctx); err != nil {
		t.Fatal(err)
	}
	var marks int
	if err := m.src.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move_marks").Scan(&marks); err != nil {
		t.Fatal(err)
	}
	if marks == 0 {
		t.Fatal("the drain removed the mark of a row that differs on the target after its copy")
	}
	// the pre-checks' catch-up copies the chunk the write changed again
	if _, err := m.catchUp(ctx, false); err != nil {
		t.Fatal(err)
	}
	if left, err := m.unverified(ctx); err != nil || left != 1 {
		t.Fatalf("after the catch-up: %d chunks unverified (%v), want the one it copied", left, err)
	}
	exec(m.dst, "DROP TRIGGER mangle")
	if err := m.fencedSync(ctx); err != nil {
		t.Fatal(err)
	}
	tbl := tablesByName(tablesOf(t, m))[name]
	sum, dsum, err := onBoth(m.src, m.dst, func(db *sql.DB) (string, error) { return tbl.checksum(ctx, db, chunk{}) })
	if err != nil || sum != dsum {
		t.Fatalf("after the switch's copy: source %s, target %s (%v)", sum, dsum, err)
	}
}
