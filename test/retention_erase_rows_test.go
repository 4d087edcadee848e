package test

import (
	"context"
	"slices"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/harness"
)

// TestRetentionEraseBatchWithTombstones: a batch none of whose messages
// was deleted before (month m2) and one with two deleted before (month m1:
// the one-statement try is rolled back and the rows read for their
// status) both erase exactly the messages not deleted yet: those are
// tombstones at version 2 and named by the topic's erase change, the two
// deleted before keep their version and deleted_at and are in no change,
// the mention index entries of the erased messages go while another
// user's message keeps its own, and a second erase changes nothing.
func TestRetentionEraseBatchWithTombstones(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	now := e.Now()
	m2, m1 := now.Add(-2), now.Add(-1)
	for i, topic := range []string{"ed", "ee"} {
		e.group(topic, int64(i+1), "active")
		e.member(topic, 5, "member", time.Time{})
	}
	retFixture(t, e, m2, "ee", 1, 3)
	retFixtureBy(t, e, m1, "ed", 1, 7, func(seq int64) int64 { return 5 + seq/7 })
	t1, t2 := "im_group_messages_"+m1.String(), "im_group_messages_"+m2.String()
	for _, table := range []string{t1, t2} {
		if _, err := sq.Update(table).Set("mentioned_user_ids", "[7]").RunWith(e.DB).ExecContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// seqs 2 and 4 deleted for everyone before the erase, their entries
	// gone with it
	deletedAt := m1.Start().Add(2 * time.Hour)
	if _, err := sq.Update(t1).Set("status", "deleted").Set("content", nil).Set("version", 2).Set("deleted_at", deletedAt).
		Where(sq.Eq{"topic": "ed", "seqid": []int64{2, 4}}).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Delete("im_topic_mentions").Where(sq.Eq{"topic": "ed", "seq": []int64{2, 4}}).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	e.Activate(now)

	j := retWaitJob(t, e, retStartJob(t, e, "POST", "/v1/admin/users/5/erase"))
	if j.RowsRemoved != 7 || j.Report.Months[m2.String()] != 3 || j.Report.Months[m1.String()] != 4 {
		t.Fatalf("erase job: %+v", j)
	}
	count := func(table string, where sq.Sqlizer) int { return retCount(t, e, table, where) }
	for _, c := range []struct {
		table string
		where sq.Sqlizer
		want  int
	}{
		{t2, sq.Eq{"topic": "ee", "status": "deleted", "content": nil, "version": 2}, 3},
		{t1, sq.Eq{"topic": "ed", "seqid": []int64{1, 3, 5, 6}, "status": "deleted", "content": nil, "version": 2}, 4},
		{t1, sq.Eq{"topic": "ed", "seqid": []int64{2, 4}, "version": 2, "deleted_at": deletedAt}, 2},
		{t1, sq.Eq{"topic": "ed", "seqid": 7, "from_user": 6, "status": "normal", "version": 1}, 1},
		{"im_topic_mentions", sq.Eq{"topic": "ee"}, 0},
		{"im_topic_mentions", sq.Eq{"topic": "ed"}, 1},
		{"im_topic_mentions", sq.Eq{"topic": "ed", "user_id": 7, "seq": 7}, 1},
		{"im_message_revisions", sq.Eq{"topic": "ee", "action": "erase", "seq_ids": "[1,2,3]", "seqid": 3}, 1},
		{"im_message_revisions", sq.Eq{"topic": "ed", "action": "erase", "seq_ids": "[1,3,5,6]", "seqid": 6}, 1},
		{"im_message_revisions", sq.Eq{"action": "erase"}, 2},
		{"im_change_outbox", sq.Eq{"topic": []string{"ed", "ee"}}, 2},
	} {
		if n := count(c.table, c.where); n != c.want {
			t.Errorf("%s where %v: %d, want %d", c.table, c.where, n, c.want)
		}
	}
	again := retWaitJob(t, e, retStartJob(t, e, "POST", "/v1/admin/users/5/erase"))
	if again.RowsRemoved != 0 || count("im_change_outbox", sq.Eq{"topic": []string{"ed", "ee"}}) != 2 ||
		count(t1, sq.Eq{"topic": "ed", "version": 3}) != 0 {
		t.Fatalf("a second erase changed something: %+v", again)
	}
}

// retCount counts table's rows where where holds.
func retCount(t *testing.T, e *sendEnv, table string, where sq.Sqlizer) int {
	t.Helper()
	var n int
	if err := sq.Select("COUNT(*)").From(table).Where(where).RunWith(e.DB).QueryRowContext(context.Background()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRetentionEraseMentionIndexMigration: a tenant database whose mention
// index predates the (topic, seq) index a user erase deletes by gets it
// from the schema step when its pool opens, and the step can run again.
func TestRetentionEraseMentionIndexMigration(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send"}})
	columns := func() []string {
		t.Helper()
		rows, err := sq.Select("COLUMN_NAME").From("information_schema.STATISTICS").Where("TABLE_SCHEMA = DATABASE()").
			Where(sq.Eq{"TABLE_NAME": "im_topic_mentions", "INDEX_NAME": "idx_topic_seq"}).OrderBy("SEQ_IN_INDEX").RunWith(e.DB).QueryContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := columns(); !slices.Equal(got, []string{"topic", "seq"}) {
		t.Fatalf("a new tenant's mention index by seq: %v", got)
	}
	if _, err := e.DB.ExecContext(ctx, "ALTER TABLE im_topic_mentions DROP INDEX idx_topic_seq"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := e.DB.ExecContext(ctx, "DELETE FROM im_schema_migrations WHERE version = 27"); err != nil {
			t.Fatal(err)
		}
		if err := tenantdb.Migrate(ctx, e.DB); err != nil {
			t.Fatal(err)
		}
		if got := columns(); !slices.Equal(got, []string{"topic", "seq"}) {
			t.Fatalf("the mention index by seq after the schema step: %v", got)
		}
	}
}
