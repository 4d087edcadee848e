package test

import (
	"context"
	"strings"
	"testing"

	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
)

// mfCounts sums a view's message counts.
func mfCounts(rs []routecheck.Range) int64 {
	var n int64
	for _, r := range rs {
		n += r.Count
	}
	return n
}

// TestMigrationRouteFixMidCopy: `route check --fix` while the copy is
// paused, of a topic whose mirror differs and whose month tables already
// hold copied legacy rows, writes the mirror and Redis route from the rows
// above the topic's cutover_seq only (the mirror pass has not reached the
// topic), so the pass after the copy adds the legacy rows' counts exactly
// once: after the migration the mirror and Redis agree with the tables
// without another fix.
func TestMigrationRouteFixMidCopy(t *testing.T) {
	t.Parallel()
	env := mrsSlowStart(t)
	ctx := context.Background()
	// the copy goes by message_id: the first batch holds this topic's row
	var topic string
	if err := env.DB.QueryRow("SELECT topic FROM im_group_messages ORDER BY message_id LIMIT 1").Scan(&topic); err != nil {
		t.Fatal(err)
	}
	mg := env.App.NewMigrator()
	rc := env.App.NewRouteCheck()
	check := func(stage string, fix bool) (routecheck.CheckResult, []string) {
		t.Helper()
		var diffs []string
		res, err := rc.Check(ctx, env.Tenant, nil, fix, func(d routecheck.Difference) { diffs = append(diffs, d.String()) })
		if err != nil {
			t.Fatalf("%s: route check: %v", stage, err)
		}
		return res, diffs
	}

	if _, err := mg.Plan(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Start(ctx, env.Tenant, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	seq := mrSend(t, env, topic, rpOther, "after cutover")
	mrStored(t, env, topic, seq)

	mrsPauseMidCopy(t, env, mg)
	if m := migState(t, env.DB); m.State != routing.MigrationPaused || m.RoutesDone || m.RowsRead == 0 || m.RowsRead >= m.LegacyRows {
		t.Fatalf("migration after the pause: %+v", m)
	}
	st, err := rc.Topic(ctx, env.Tenant, topic)
	if err != nil {
		t.Fatal(err)
	}
	if st.Legacy == nil || mfCounts(st.Legacy.Tables) == 0 || len(st.Differences) != 0 {
		t.Fatalf("%s mid-copy: want copied legacy rows and no difference: %+v (legacy %+v)", topic, st, st.Legacy)
	}

	// a mirror that went wrong mid-copy (a lost or doubled merge)
	res, err := env.DB.Exec("UPDATE im_group_message_topic_shards SET message_count = message_count + 5 WHERE topic = ?", topic)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("corrupt the mirror of %s: %d rows, %v", topic, n, err)
	}
	if r, diffs := check("mid-copy --fix", true); r.Fixed != 1 || len(diffs) == 0 {
		t.Fatalf("mid-copy --fix: fixed %d topics, want 1; differences:\n%s", r.Fixed, strings.Join(diffs, "\n"))
	}
	st, err = rc.Topic(ctx, env.Tenant, topic)
	if err != nil {
		t.Fatal(err)
	}
	// only the message sent after cutover: the pass adds the legacy rows
	for _, view := range []struct {
		name string
		rs   []routecheck.Range
	}{{"mirror", st.Mirror}, {"redis", st.Redis}} {
		if mfCounts(view.rs) != 1 || len(view.rs) != 1 || view.rs[0].MinSeq != seq || view.rs[0].MaxSeq != seq {
			t.Fatalf("%s of %s after the mid-copy fix: %+v, want seq %d alone", view.name, topic, view.rs, seq)
		}
	}
	if len(st.Differences) != 0 {
		t.Fatalf("%s after the mid-copy fix: %+v", topic, st.Differences)
	}

	if _, err := mg.Resume(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if err := mg.WithThrottle(0).RunUntilDone(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if m := migState(t, env.DB); m.State != routing.MigrationDone || !m.RoutesDone || m.RowsPresent != 0 {
		t.Fatalf("migration after the backfill: %+v", m)
	}
	if r, diffs := check("done", false); len(diffs) != 0 || r.Legacy != 0 {
		t.Fatalf("route check after the migration: %d legacy topics, differences:\n%s", r.Legacy, strings.Join(diffs, "\n"))
	}
	st, err = rc.Topic(ctx, env.Tenant, topic)
	if err != nil {
		t.Fatal(err)
	}
	if mfCounts(st.Mirror) != mrPer+1 || mfCounts(st.Redis) != mrPer+1 || mfCounts(st.Tables) != mrPer+1 {
		t.Fatalf("%s after the migration: mirror %+v, redis %+v, tables %+v: want %d messages in each",
			topic, st.Mirror, st.Redis, st.Tables, mrPer+1)
	}
}
