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
	_, src := testenv.MigratedTenantDB(t)
	_, dst := testenv.MigratedTenantDB(t)
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
	tables, err := listTables(ctx, m.src)
	if err != nil {
		t.Fatal(err)
	}
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

// TestVerificationFindsEveryCorruption: after a copy both passes of the
// verification prove the month table equal (the whole-table pass by
// CHECKSUM TABLE, no chunk left to the per-chunk pass); then the target
// is corrupted in one way at a time — one byte of one column of one row,
// for every column; a value made NULL where the source holds an empty
// string; a row missing; a row added inside a chunk and past the last —
// and each time the whole-table pass proves nothing and the per-chunk
// pass names the row's chunk (both chunks the key left and entered when
// the key itself changed), which a copy repairs. A table
// written on the source since the marks were cleared is left to the
// per-chunk pass.
func TestVerificationFindsEveryCorruption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, name := verifySetup(t)
	tables, err := listTables(ctx, m.src)
	if err != nil {
		t.Fatal(err)
	}
	tbl := tablesByName(tables)[name]
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
		// last first: a key moved into the next chunk is cleared there
		// before its old chunk writes it back (the unique keys)
		sort.Slice(differ, func(i, j int) bool { return differ[i].no < differ[j].no })
		for i := len(differ) - 1; i >= 0; i-- {
			if err := m.copyChunks(ctx, tables, differ[i:i+1]); err != nil {
				t.Fatal(err)
			}
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
	var nos []int
	for _, c := range differ {
		nos = append(nos, c.no)
	}
	sort.Ints(nos)
	// chunks of 50 keys from 1001: 1030 in chunk 0, 1180 in chunk 3
	if fmt.Sprint(nos) != "[0 3]" {
		t.Fatalf("chunks differing %v, want [0 3]", nos)
	}
	tables, err := listTables(ctx, m.src)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.copyChunks(ctx, tables, differ); err != nil {
		t.Fatal(err)
	}
	if whole, differ := verifyOnce(t, m, name, nil); !whole || len(differ) != 0 {
		t.Fatalf("after the copy: whole-table pass %v, chunks differing %d", whole, len(differ))
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
