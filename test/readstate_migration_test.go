package test

import (
	"context"
	"strings"
	"testing"

	imsql "github.com/imshard/imshard/sql"

	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/testenv"
)

// TestReadCursorBackfillOnOldData: migration 0005 applied by the service's
// own migration runner to a database at version 4 that already holds data
// (groups, members, stored messages in the route mirror, a few cursor rows
// written by 0004-era processes): every member without a cursor starts at
// the topic's last stored seq (across months), a member of a topic with
// nothing stored at 0, an existing cursor row is left as it is, and a
// second run changes nothing.
func TestReadCursorBackfillOnOldData(t *testing.T) {
	ctx := context.Background()
	tenant := testenv.NewTenant(t)
	if _, err := testenv.MySQL(t).ExecContext(ctx, "CREATE DATABASE `"+testenv.TenantDBPrefix+tenant+"`"); err != nil {
		t.Fatal(err)
	}
	db := testenv.OpenDB(t, strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant))
	steps, err := imsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(imsql.MigrationsTable())
	for _, st := range steps {
		if st.Version > 4 {
			continue
		}
		for _, q := range st.Statements {
			exec(q)
		}
		exec("INSERT INTO im_schema_migrations (version, name) VALUES (?, ?)", st.Version, st.Name)
	}
	// 0004's data: two topics with stored messages (one over two months),
	// one with none; user 3 already moved a cursor, down from nothing.
	exec("INSERT INTO im_groups (topic, group_id) VALUES ('old-a', 1), ('old-b', 2), ('old-c', 3)")
	exec("INSERT INTO im_group_members (topic, user_id) VALUES ('old-a', 1), ('old-a', 2), ('old-a', 3), ('old-b', 1), ('old-c', 2)")
	exec("INSERT INTO im_group_message_topic_shards (topic, shard_month, min_seq, max_seq, message_count, min_created_at, max_created_at) VALUES " +
		"('old-a', '202610', 1, 40, 40, NOW(3), NOW(3)), ('old-a', '202611', 41, 57, 17, NOW(3), NOW(3)), " +
		"('old-b', '202611', 1, 9, 9, NOW(3), NOW(3))")
	exec("INSERT INTO im_user_read_cursors (user_id, topic, read_seq, pinned) VALUES (3, 'old-a', 12, 1)")

	if err := tenantdb.Migrate(ctx, db); err != nil {
		t.Fatalf("migrate 4 → latest: %v", err)
	}
	want := map[[2]any]int64{
		{int64(1), "old-a"}: 57, {int64(2), "old-a"}: 57, {int64(3), "old-a"}: 12,
		{int64(1), "old-b"}: 9, {int64(2), "old-c"}: 0,
	}
	check := func() {
		t.Helper()
		rows, err := db.QueryContext(ctx, "SELECT user_id, topic, read_seq, pinned FROM im_user_read_cursors")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var u, seq int64
			var topic string
			var pinned bool
			if err := rows.Scan(&u, &topic, &seq, &pinned); err != nil {
				t.Fatal(err)
			}
			w, ok := want[[2]any{u, topic}]
			if !ok || w != seq {
				t.Errorf("cursor %d/%s = %d, want %d (known %v)", u, topic, seq, w, ok)
			}
			if pinned != (u == 3) {
				t.Errorf("cursor %d/%s pinned = %v", u, topic, pinned)
			}
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != len(want) {
			t.Errorf("%d cursor rows, want %d", n, len(want))
		}
	}
	check()
	var v int
	if err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM im_schema_migrations").Scan(&v); err != nil || v != steps[len(steps)-1].Version {
		t.Fatalf("recorded version %d (%v), want %d", v, err, steps[len(steps)-1].Version)
	}
	// nothing is left to apply: a rerun changes nothing
	if err := tenantdb.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	check()
}
