package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/modules/migrate"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// Read state and route checks while a tenant migrates (docs/migration.md
// "The dual read"): legacy messages count in mention_unread, and
// legacy-only topics sort by their messages in the topic list, before and
// while the backfill copies them, exactly as once the mirror is built;
// `imshard route check` reports the copied legacy rows as legacy, not as
// missing from the route mirror.

// mrsNewest is the created_at of topic's newest legacy row.
func mrsNewest(t *testing.T, env *harness.Env, topic string) time.Time {
	t.Helper()
	var at time.Time
	if err := env.DB.QueryRow("SELECT created_at FROM im_group_messages WHERE topic = ? ORDER BY seqid DESC LIMIT 1", topic).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// mrsExpect checks rpMember's read state at one stage: legacy-001's unread
// and mention_unread (badges and topic list alike), the topic list's order
// and the activity of the legacy-only topic legacy-000.
func mrsExpect(t *testing.T, env *harness.Env, stage string, unread, mentions int, order []string, newest000 time.Time) {
	t.Helper()
	topic := migTopic(1)
	var sum inbox.UnreadSummary
	if code := rpGet(t, env, rpMember, "", "/v1/me/unread", &sum); code != 200 {
		t.Fatalf("%s: unread: %d", stage, code)
	}
	found := false
	for _, u := range sum.Topics {
		if u.Topic == topic {
			found = true
			if u.Unread != unread || u.MentionUnread != mentions {
				t.Fatalf("%s: badge of %s: unread %d, mention_unread %d; want %d, %d", stage, topic, u.Unread, u.MentionUnread, unread, mentions)
			}
		}
	}
	if !found {
		t.Fatalf("%s: no badge for %s: %+v", stage, topic, sum)
	}
	var page inbox.TopicsPage
	if code := rpGet(t, env, rpMember, "", "/v1/me/topics?limit=50", &page); code != 200 {
		t.Fatalf("%s: topic list: %d", stage, code)
	}
	var got []string
	for _, it := range page.Topics {
		got = append(got, it.Topic)
		switch it.Topic {
		case topic:
			if it.Unread != unread || it.MentionUnread != mentions {
				t.Fatalf("%s: list entry of %s: unread %d, mention_unread %d; want %d, %d", stage, topic, it.Unread, it.MentionUnread, unread, mentions)
			}
		case migTopic(0):
			if want := newest000.UTC().Truncate(time.Millisecond); !it.ActivityAt.Equal(want) {
				t.Fatalf("%s: activity_at of %s is %v, want its newest legacy message's %v", stage, it.Topic, it.ActivityAt.Time, want)
			}
		}
	}
	if strings.Join(got, ",") != strings.Join(order, ",") {
		t.Fatalf("%s: topic list order %v, want %v (newest activity first)", stage, got, order)
	}
}

// mrsSlowStart is mrStart with a slow copy of 3 rows a batch at 1 row/s,
// so that a pause catches it with part of the rows copied and the mirror
// pass not run.
func mrsSlowStart(t *testing.T) *harness.Env {
	t.Helper()
	env, _ := mrStart(t, harness.Options{Mutate: func(c *config.Config) {
		c.Migrate.BatchSize = 3
		c.Migrate.RowsPerSecond = 1
	}})
	return env
}

// mrsPauseMidCopy runs the module of a tenant started by mrsSlowStart and
// past cutover until it copied a batch, then pauses it: it waits a few
// seconds before the next batch, so the copy is partial and the mirror
// pass has not run.
func mrsPauseMidCopy(t *testing.T, env *harness.Env, mg *migrate.Migrator) {
	t.Helper()
	ctx := context.Background()
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- mg.RunUntilDone(runCtx, env.Tenant) }()
	migWait(t, env.DB, "some rows copied", time.Minute, func(m routing.Migration) bool { return m.RowsRead > 0 }, func() string { return "" })
	if _, err := mg.Pause(ctx, env.Tenant); err != nil {
		t.Fatalf("pause (the copy of 36 rows at 1 row/s should still run): %v", err)
	}
	stopRun()
	<-ran
}

// TestMigrationReadStateAndRouteCheck: rpMember is mentioned in legacy
// rows of legacy-001 by id as a number (seq 3), as a string (seq 7), by a
// mention of everyone (seq 9) and in a recalled row (seq 10, which counts
// for nobody); rpOther in seq 4. The legacy-only topics' newest messages
// order the list (legacy-000 newest, then legacy-002, then legacy-001),
// against the order in which rpMember joined (legacy-002 last). Planned,
// after cutover, paused with part of the rows copied (the route mirror
// not built yet), backfilled and finished, rpMember's legacy-001 shows the
// same 3 mentions and the list the same order; meanwhile the route check
// finds no difference and reports the copied rows as legacy.
func TestMigrationReadStateAndRouteCheck(t *testing.T) {
	t.Parallel()
	env := mrsSlowStart(t)
	ctx := context.Background()
	for _, stmt := range []string{
		"UPDATE im_group_messages SET mentioned_user_ids = JSON_ARRAY(1001) WHERE topic = 'legacy-001' AND seqid = 3",
		"UPDATE im_group_messages SET mentioned_user_ids = JSON_ARRAY('1001') WHERE topic = 'legacy-001' AND seqid = 7",
		"UPDATE im_group_messages SET mention_all = 1 WHERE topic = 'legacy-001' AND seqid = 9",
		"UPDATE im_group_messages SET mentioned_user_ids = JSON_ARRAY(1001), status = 'recalled' WHERE topic = 'legacy-001' AND seqid = 10",
		"UPDATE im_group_messages SET mentioned_user_ids = JSON_ARRAY(1002) WHERE topic = 'legacy-001' AND seqid = 4",
		// legacy-000's newest message is a day newer than the others'
		"UPDATE im_group_messages SET created_at = created_at + INTERVAL 1 DAY, updated_at = updated_at + INTERVAL 1 DAY WHERE topic = 'legacy-000' AND seqid = 12",
		// rpMember joined legacy-000 first and legacy-002 last
		"UPDATE im_group_members SET created_at = '2020-01-01 00:00:00' WHERE user_id = 1001 AND topic = 'legacy-000'",
		"UPDATE im_group_members SET created_at = '2020-01-02 00:00:00' WHERE user_id = 1001 AND topic = 'legacy-001'",
		"UPDATE im_group_members SET created_at = '2020-01-03 00:00:00' WHERE user_id = 1001 AND topic = 'legacy-002'",
	} {
		if _, err := env.DB.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	newest := mrsNewest(t, env, migTopic(0))
	legacyOrder := []string{migTopic(0), migTopic(2), migTopic(1)}
	mg := env.App.NewMigrator()
	rc := env.App.NewRouteCheck()
	check := func(stage string, legacy bool) {
		t.Helper()
		var diffs []string
		res, err := rc.Check(ctx, env.Tenant, nil, false, func(d routecheck.Difference) { diffs = append(diffs, d.String()) })
		if err != nil {
			t.Fatalf("%s: route check: %v", stage, err)
		}
		if len(diffs) > 0 || (res.Legacy > 0) != legacy {
			t.Fatalf("%s: route check: %d topics with copied legacy rows (want some: %v), differences:\n%s",
				stage, res.Legacy, legacy, strings.Join(diffs, "\n"))
		}
	}

	if _, err := mg.Plan(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	mrsExpect(t, env, "planned", 11, 3, legacyOrder, newest)
	if _, err := mg.Start(ctx, env.Tenant, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	mrsExpect(t, env, "after cutover", 11, 3, legacyOrder, newest)
	seq := mrSend(t, env, migTopic(1), rpOther, "after cutover")
	mrStored(t, env, migTopic(1), seq)
	// legacy-001 now has the newest message; the others still sort by
	// their legacy messages, not by when rpMember joined
	sentOrder := []string{migTopic(1), migTopic(0), migTopic(2)}
	mrsExpect(t, env, "after a send", 12, 3, sentOrder, newest)

	mrsPauseMidCopy(t, env, mg)
	if err := mg.Tick(ctx, env.Tenant); err != nil { // no work while paused: it only exports the state
		t.Fatal(err)
	}
	m := migState(t, env.DB)
	if m.State != routing.MigrationPaused || m.RoutesDone || m.RowsRead == 0 || m.RowsRead >= m.LegacyRows {
		t.Fatalf("migration after the pause: %+v", m)
	}
	if m.RateLimit != 1 {
		t.Fatalf("the copy's recorded limit: %d rows/s, want 1", m.RateLimit)
	}
	tenant := `tenant="` + env.Tenant + `"`
	if v := persistMetric(t, env, "imshard_migrate_rows_per_second_limit", tenant); v != 1 {
		t.Fatalf("imshard_migrate_rows_per_second_limit: %v, want 1", v)
	}
	if v := persistMetric(t, env, "imshard_migrate_achieved_rows_per_second", tenant); v != 0 {
		t.Fatalf("imshard_migrate_achieved_rows_per_second of a paused copy: %v, want 0", v)
	}
	mrsExpect(t, env, "paused mid-copy", 12, 3, sentOrder, newest)
	check("paused mid-copy", true)
	var st routecheck.TopicState
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/topics/"+migTopic(1)+"/route", &st); code != 200 {
		t.Fatalf("admin route of %s: %d", migTopic(1), code)
	}
	if len(st.Differences) != 0 || st.Legacy == nil || st.Legacy.CutoverSeq != mrPer || len(st.Tables) != 1 || st.Tables[0].MinSeq != seq {
		t.Fatalf("route of %s mid-copy: %+v (legacy %+v)", migTopic(1), st, st.Legacy)
	}
	cfg := tenantConfig(t, env.Tenant, "")
	if code, out := runCLI(t, nil, "--config", cfg, "route", "check", "--tenant", env.Tenant); code != 0 ||
		!strings.Contains(out, "state paused") || !strings.Contains(out, "reported as legacy") || !strings.Contains(out, " 0 differences") {
		t.Fatalf("route check mid-copy: exit %d\n%s", code, out)
	}

	if _, err := mg.Resume(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if err := mg.WithThrottle(0).RunUntilDone(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if m := migState(t, env.DB); m.State != routing.MigrationDone {
		t.Fatalf("migration after the backfill: %+v", m)
	}
	// the mention index now holds the copied mentions too: each counts once
	mrsExpect(t, env, "backfilled", 12, 3, sentOrder, newest)
	check("backfilled", false)
	if _, err := mg.Finish(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	mrsExpect(t, env, "finished", 12, 3, sentOrder, newest)
	check("finished", false)
}
