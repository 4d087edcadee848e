package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// retFixture writes seqs lo..hi of topic into month m's table (with a
// mention of user 7 on each) and the mirror, as persist would.
func retFixture(t *testing.T, e *sendEnv, m routing.Month, topic string, lo, hi int64) {
	t.Helper()
	ctx := context.Background()
	table, err := routing.TableFor(m)
	if err != nil {
		t.Fatal(err)
	}
	at := m.Start().Add(time.Hour)
	q := sq.Insert(table.Quoted()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "content", "created_at", "updated_at")
	var ms []routing.Mention
	for s := lo; s <= hi; s++ {
		q = q.Values(int64(m.Int())*1_000_000+s*1000+int64(len(topic)), topic, 1, s, 5, `{"text":"old"}`, at, at)
		ms = append(ms, routing.MentionsOf(topic, s, []int64{7}, false)...)
	}
	if _, err := q.RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := routing.Fenced(ctx, e.DB, func(tx *sql.Tx) error {
		if err := routing.AddMentions(ctx, tx, ms); err != nil {
			return err
		}
		return routing.WidenMirror(ctx, tx, []routing.MirrorRow{{Topic: topic,
			MonthRange: routing.MonthRange{Month: m, MinSeq: lo, MaxSeq: hi, Count: hi - lo + 1}, MinCreatedAt: at, MaxCreatedAt: at}})
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Routes().Merge(ctx, e.Tenant, topic, routing.MonthRange{Month: m, MinSeq: lo, MaxSeq: hi, Count: hi - lo + 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Insert("im_message_revisions").Columns("topic", "shard_month", "seqid", "message_id", "action", "version", "actor").
		Values(topic, m.String(), lo, 1, "edit", 1, 5).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionDropsAndTrims: with tenant retention 1, a month whose every
// topic expired is dropped whole and a month a group keeps forever loses
// only the expired topic's rows; the plan printed first names exactly what
// the run removed, side rows and routes go with the rows, floors rise, the
// catalog's counts (recorded at seal) follow, and a second run finds
// nothing.
func TestRetentionDropsAndTrims(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: func(c *config.Config) { c.Tenants[0].RetentionMonths = 1 }})
	now := e.Now()
	m3, m2 := now.Add(-3), now.Add(-2)
	e.group("ra", 1, "active")
	code, body := e.Do("PUT", "/v1/topics/rkeep", e.svc, map[string]any{"group_id": 2, "status": "active", "retention_months": 0})
	if code != 200 {
		t.Fatalf("put group with retention: %d %s", code, body)
	}
	var g struct {
		RetentionMonths *int `json:"retention_months"`
	}
	if err := json.Unmarshal(body, &g); err != nil || g.RetentionMonths == nil || *g.RetentionMonths != 0 {
		t.Fatalf("group answer %s (%v)", body, err)
	}
	if code, body := e.Do("PUT", "/v1/topics/rbad", e.svc, map[string]any{"group_id": 3, "status": "active", "retention_months": -1}); code != 400 {
		t.Fatalf("negative retention: %d %s", code, body)
	}
	retFixture(t, e, m3, "ra", 1, 5)
	retFixture(t, e, m3, "rkeep", 1, 3)
	retFixture(t, e, m2, "ra", 6, 10)
	// rmix: seqs 1..4 expire with their month, 5..7 stay
	e.group("rmix", 4, "active")
	e.member("rmix", 5, "member", time.Time{})
	retFixture(t, e, m2, "rmix", 1, 4)
	retFixture(t, e, now.Add(-1), "rmix", 5, 7)
	e.Activate(now)
	mg := e.App.NewShardManager()
	for _, m := range []routing.Month{m3, m2} {
		if err := mg.Seal(ctx, e.Tenant, m); err != nil {
			t.Fatal(err)
		}
	}
	list, err := mg.List(ctx, e.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.Month == m3 && (in.Rows != 8 || !in.StatsAt.Valid) {
			t.Fatalf("sealed %s: rows %d stats %v, want 8 counted at seal", m3, in.Rows, in.StatsAt)
		}
	}

	plan, err := e.App.Retention().Plan(ctx, e.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Drops) != 1 || plan.Drops[0].Month != m2.String() || plan.Drops[0].Rows != 9 ||
		len(plan.Trims) != 1 || plan.Trims[0].Topic != "ra" || plan.Trims[0].Month != m3.String() || plan.Trims[0].Rows != 5 {
		t.Fatalf("plan %+v", plan)
	}
	rep, err := e.App.Retention().Run(ctx, e.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	pj, _ := json.Marshal(plan)
	rj, _ := json.Marshal(rep.Plan)
	if string(pj) != string(rj) || rep.RowsDropped != 9 || rep.RowsTrimmed != 5 || rep.Months != 1 {
		t.Fatalf("run %+v after plan %s", rep, pj)
	}

	var tables int
	if err := e.DB.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", "im_group_messages_"+m2.String()).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%s table still there (%d, %v)", m2, tables, err)
	}
	for _, c := range []struct {
		table string
		where sq.Sqlizer
		want  int
	}{
		{"im_group_messages_" + m3.String(), sq.Eq{"topic": "ra"}, 0},
		{"im_group_messages_" + m3.String(), sq.Eq{"topic": "rkeep"}, 3},
		{"im_group_message_shards", sq.Eq{"shard_month": m2.String()}, 0},
		{"im_group_message_topic_shards", sq.Eq{"topic": "ra"}, 0},
		{"im_group_message_topic_shards", sq.Eq{"topic": "rkeep"}, 1},
		{"im_topic_mentions", sq.Eq{"topic": "ra"}, 0},
		{"im_topic_mentions", sq.Eq{"topic": "rkeep"}, 3},
		{"im_message_revisions", sq.Eq{"topic": "ra"}, 0},
		{"im_message_revisions", sq.Eq{"topic": "rkeep"}, 1},
		{"im_topic_floors", sq.Eq{"topic": "ra", "floor_seq": 11}, 1},
		{"im_group_message_shards", sq.Eq{"shard_month": m3.String(), "row_count": 3}, 1},
	} {
		var n int
		if err := sq.Select("COUNT(*)").From(c.table).Where(c.where).RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil || n != c.want {
			t.Errorf("%s where %v: %d rows (%v), want %d", c.table, c.where, n, err, c.want)
		}
	}
	route, _, err := e.App.Routes().Load(ctx, e.Tenant, "ra")
	if err != nil || len(route) != 0 {
		t.Fatalf("route of ra after retention: %+v %v", route, err)
	}
	if route, _, err := e.App.Routes().Load(ctx, e.Tenant, "rkeep"); err != nil || len(route) != 1 {
		t.Fatalf("route of rkeep: %+v %v", route, err)
	}
	retReadsBeginAtFloor(t, e)
	again, err := e.App.Retention().Plan(ctx, e.Tenant)
	if err != nil || len(again.Drops)+len(again.Trims)+len(again.Skipped) != 0 {
		t.Fatalf("second plan %+v %v", again, err)
	}
	if v := persistMetric(t, e.Env, "imshard_retention_months_dropped_total", "tenant", e.Tenant); v != 1 {
		t.Fatalf("months dropped metric %v", v)
	}
}

// retReadsBeginAtFloor: after the drop, rmix's history begins at seq 5.
func retReadsBeginAtFloor(t *testing.T, e *sendEnv) {
	t.Helper()
	tok := e.Token(5, "")
	var page struct {
		Messages []struct {
			Seq int64 `json:"seq"`
		} `json:"messages"`
		HasMore bool `json:"has_more"`
	}
	seqs := func() []int64 {
		var out []int64
		for _, m := range page.Messages {
			out = append(out, m.Seq)
		}
		return out
	}
	code, body := e.Do("GET", "/v1/topics/rmix/messages?limit=50", tok, nil)
	if err := json.Unmarshal(body, &page); code != 200 || err != nil || !slices.Equal(seqs(), []int64{7, 6, 5}) || page.HasMore {
		t.Fatalf("latest page after retention: %d %s", code, body)
	}
	code, body = e.Do("GET", "/v1/topics/rmix/messages?before=6&limit=1", tok, nil)
	if err := json.Unmarshal(body, &page); code != 200 || err != nil || !slices.Equal(seqs(), []int64{5}) || page.HasMore {
		t.Fatalf("a before walk must end at the floor: %d %s", code, body)
	}
	code, body = e.Do("GET", "/v1/topics/rmix/messages?before=3&limit=10", tok, nil)
	if err := json.Unmarshal(body, &page); code != 200 || err != nil || len(page.Messages) != 0 || page.HasMore {
		t.Fatalf("before below the floor: %d %s", code, body)
	}
	e.persistPassed()
	var since struct {
		Messages []struct {
			Seq int64 `json:"seq"`
		} `json:"messages"`
		NextSince int64 `json:"next_since"`
	}
	code, body = e.Do("GET", "/v1/topics/rmix/messages?since=1&limit=2", tok, nil)
	if err := json.Unmarshal(body, &since); code != 200 || err != nil || len(since.Messages) == 0 || since.Messages[0].Seq != 5 {
		t.Fatalf("a since walk from below the floor must start at it: %d %s", code, body)
	}
	for _, path := range []string{"/v1/topics/rmix/messages/2", "/v1/topics/rmix/messages/2/context"} {
		code, body := e.Do("GET", path, tok, nil)
		var env struct {
			Error struct {
				Code    string         `json:"code"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &env); code != 404 || err != nil || env.Error.Code != "not_found" || env.Error.Details["reason"] != "expired" {
			t.Fatalf("%s of an expired seq: %d %s", path, code, body)
		}
	}
	if code, body := e.Do("GET", "/v1/topics/rmix/messages/6", tok, nil); code != 200 {
		t.Fatalf("a kept seq: %d %s", code, body)
	}
}

// TestRetentionResumesAStoppedDrop: a run killed after it marked a month
// expiring and raised the floors leaves a month the next plan names as
// resumed, with its rows counted at seal, and the next run finishes it —
// even with a retention (here 0, keep forever) that would not expire it.
func TestRetentionResumesAStoppedDrop(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{})
	now := e.Now()
	m3 := now.Add(-3)
	e.group("rr", 1, "active")
	retFixture(t, e, m3, "rr", 1, 6)
	e.Activate(now)
	if err := e.App.NewShardManager().Seal(ctx, e.Tenant, m3); err != nil {
		t.Fatal(err)
	}
	// what the killed run did before it died
	if ok, err := routing.SetStatus(ctx, e.DB, m3, routing.StatusExpiring, routing.StatusSealed); err != nil || !ok {
		t.Fatalf("mark expiring: %v %v", ok, err)
	}
	if err := routing.RaiseFloors(ctx, e.DB, []routing.Floor{{Topic: "rr", Seq: 7}}); err != nil {
		t.Fatal(err)
	}
	plan, err := e.App.Retention().Plan(ctx, e.Tenant)
	if err != nil || len(plan.Drops) != 1 || !plan.Drops[0].Resumed || plan.Drops[0].Rows != 6 || plan.Drops[0].Month != m3.String() {
		t.Fatalf("plan after a stopped drop: %+v %v", plan, err)
	}
	rep, err := e.App.Retention().Run(ctx, e.Tenant)
	if err != nil || rep.Months != 1 || rep.RowsDropped != 6 {
		t.Fatalf("resumed run: %+v %v", rep, err)
	}
	var n int
	if err := e.DB.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", "im_group_messages_"+m3.String()).Scan(&n); err != nil || n != 0 {
		t.Fatalf("table of the resumed month still there (%d, %v)", n, err)
	}
	if _, _, err := e.App.Catalog().Table(ctx, e.Tenant, m3); err == nil {
		t.Fatal("the resumed month is still in the catalog")
	}
	if route, _, err := e.App.Routes().Load(ctx, e.Tenant, "rr"); err != nil || len(route) != 0 {
		t.Fatalf("route after the resumed drop: %+v %v", route, err)
	}
}

// TestRetentionCommands: `retention plan` and `run` answer per tenant, in
// text and JSON, and refuse an unknown tenant as a usage error.
func TestRetentionCommands(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	if code, out := runCLI(t, nil, "--config", cfg, "shard", "ensure"); code != 0 {
		t.Fatalf("shard ensure: exit %d\n%s", code, out)
	}
	code, out := runCLI(t, nil, "--config", cfg, "retention", "plan", "--tenant", tenant)
	if code != 0 || !strings.Contains(out, "tenant "+tenant+": now ") || !strings.Contains(out, "0 months to drop, 0 topic trims, 0 rows") {
		t.Fatalf("retention plan: exit %d\n%s", code, out)
	}
	code, out = runCLI(t, nil, "--config", cfg, "retention", "run", "--tenant", tenant, "--output=json")
	var got struct {
		Reports []struct {
			Plan struct {
				Tenant string `json:"tenant"`
			} `json:"plan"`
			Months int `json:"months_dropped"`
		} `json:"reports"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Reports) != 1 || got.Reports[0].Plan.Tenant != tenant {
		t.Fatalf("retention run --output=json: exit %d (%v)\n%s", code, err, out)
	}
	if code, out := runCLI(t, nil, "--config", cfg, "retention", "plan", "--tenant", "nope"); code != 2 {
		t.Fatalf("unknown tenant: exit %d, want 2\n%s", code, out)
	}
}
