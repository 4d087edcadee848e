package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
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

// retFixture writes seqs lo..hi of topic, sent by user 5, into month m's
// table (with a mention of user 7 on each) and the mirror, as persist
// would.
func retFixture(t *testing.T, e *sendEnv, m routing.Month, topic string, lo, hi int64) {
	t.Helper()
	retFixtureBy(t, e, m, topic, lo, hi, func(int64) int64 { return 5 })
}

// retFixtureBy is retFixture with each seq's sender from(seq).
func retFixtureBy(t *testing.T, e *sendEnv, m routing.Month, topic string, lo, hi int64, from func(seq int64) int64) {
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
		q = q.Values(int64(m.Int())*1_000_000+s*1000+int64(len(topic)), topic, 1, s, from(s), `{"text":"old"}`, at, at)
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

// retJob is a job as GET /v1/admin/jobs/{id} shows it.
type retJob struct {
	ID          string `json:"id"`
	Kind        string `json:"kind"`
	UserID      string `json:"user_id"`
	State       string `json:"state"`
	Error       string `json:"error"`
	RowsRemoved int64  `json:"rows_removed"`
	Report      struct {
		Months     map[string]int64 `json:"months"`
		Side       map[string]int64 `json:"side"`
		HeldTopics []string         `json:"held_topics"`
	} `json:"report"`
}

// retGetJob reads job id.
func retGetJob(t *testing.T, e *sendEnv, id string) retJob {
	t.Helper()
	var j retJob
	code, body := e.Do("GET", "/v1/admin/jobs/"+id, e.svc, nil)
	if err := json.Unmarshal(body, &j); code != 200 || err != nil {
		t.Fatalf("job %s: %d %s", id, code, body)
	}
	return j
}

// retStartJob asks for a job (a purge or an erase) and answers its id.
func retStartJob(t *testing.T, e *sendEnv, method, path string) string {
	t.Helper()
	code, body := e.Do(method, path, e.svc, nil)
	var j retJob
	if err := json.Unmarshal(body, &j); code != 202 || err != nil || j.State != "queued" {
		t.Fatalf("%s %s: %d %s", method, path, code, body)
	}
	return j.ID
}

// retWaitJob runs the tenant's jobs (a shard manager's loop may have taken
// the job first) until job id is done.
func retWaitJob(t *testing.T, e *sendEnv, id string) retJob {
	t.Helper()
	var j retJob
	sendWaitFor(t, 8*time.Second, "job "+id+" done", func() bool {
		if _, err := e.App.Retention().RunJobs(context.Background(), e.Tenant, "test-runner", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		j = retGetJob(t, e, id)
		return j.State == "done"
	})
	return j
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
	// user 9's hidden ranges of rmix (hi exclusive): one wholly past the
	// floor the drop raises to 5, one reaching past it
	if _, err := sq.Insert("im_dellog").Columns("topic", "deletedfor", "low", "hi").Values("rmix", 9, 1, 5).Values("rmix", 9, 2, 7).
		RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
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
		{"im_topic_mentions", sq.Eq{"topic": "rmix"}, 3},
		{"im_topic_mentions", sq.And{sq.Eq{"topic": "rmix"}, sq.Lt{"seq": 5}}, 0},
		{"im_dellog", sq.Eq{"topic": "rmix"}, 1},
		{"im_dellog", sq.Eq{"topic": "rmix", "low": 5, "hi": 7}, 1},
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
	if err := e.RaiseFloors(routing.Floor{Topic: "rr", Seq: 7}); err != nil {
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

// TestRetentionLegalHold: holds are set, listed and lifted by an admin
// (bad requests refused with 4xx, changing nothing); a held topic keeps
// its rows through a run that drops the month for the others (the month
// is trimmed per topic instead), its floor and route untouched; a held
// user keeps every topic they wrote in; the plan says what is held and why.
func TestRetentionLegalHold(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}, Mutate: func(c *config.Config) { c.Tenants[0].RetentionMonths = 1 }})
	admin := e.Token(1, "admin")
	now := e.Now()
	m3, m2 := now.Add(-3), now.Add(-2)
	for i, topic := range []string{"hx", "hyy", "hzzz"} {
		e.group(topic, int64(i+1), "active")
	}
	retFixture(t, e, m2, "hx", 1, 3)
	retFixture(t, e, m2, "hyy", 1, 4)
	retFixture(t, e, m3, "hzzz", 1, 2)
	e.Activate(now)
	mg := e.App.NewShardManager()
	for _, m := range []routing.Month{m3, m2} {
		if err := mg.Seal(ctx, e.Tenant, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		method, path, token string
		body                any
		want                int
	}{
		{"PUT", "/v1/admin/holds/case-1", e.svc, map[string]any{"tenant": e.Tenant, "topics": []string{"hx"}, "reason": "r"}, 403},
		{"PUT", "/v1/admin/holds/bad%20id", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"hx"}, "reason": "r"}, 400},
		{"PUT", "/v1/admin/holds/case-1", admin, map[string]any{"tenant": "other", "topics": []string{"hx"}, "reason": "r"}, 400},
		{"PUT", "/v1/admin/holds/case-1", admin, map[string]any{"tenant": e.Tenant, "reason": "r"}, 400},
		{"PUT", "/v1/admin/holds/case-1", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"hx"}, "reason": " "}, 400},
		{"PUT", "/v1/admin/holds/case-1", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"h x"}, "reason": "r"}, 400},
		{"PUT", "/v1/admin/holds/case-1", admin, map[string]any{"tenant": e.Tenant, "users": []int{0}, "reason": "r"}, 400},
		{"DELETE", "/v1/admin/holds/case-9", admin, nil, 404},
		{"GET", "/v1/admin/holds", e.svc, nil, 403},
	} {
		if code, body := e.Do(c.method, c.path, c.token, c.body); code != c.want {
			t.Fatalf("%s %s %v: %d %s, want %d", c.method, c.path, c.body, code, body, c.want)
		}
	}
	var list struct {
		Holds []struct {
			ID     string   `json:"id"`
			Topics []string `json:"topics"`
			Users  []string `json:"users"`
		} `json:"holds"`
	}
	if code, body := e.Do("GET", "/v1/admin/holds", admin, nil); code != 200 || json.Unmarshal(body, &list) != nil || len(list.Holds) != 0 {
		t.Fatalf("holds after refused puts: %d %s", code, body)
	}
	if code, body := e.Do("PUT", "/v1/admin/holds/case-1", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"hx", "hx"}, "reason": "litigation 42"}); code != 200 {
		t.Fatalf("put hold: %d %s", code, body)
	}
	if code, body := e.Do("GET", "/v1/admin/holds", admin, nil); code != 200 || json.Unmarshal(body, &list) != nil ||
		len(list.Holds) != 1 || list.Holds[0].ID != "case-1" || !slices.Equal(list.Holds[0].Topics, []string{"hx"}) {
		t.Fatalf("holds: %d %s", code, body)
	}

	plan, err := e.App.Retention().Plan(ctx, e.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Drops) != 1 || plan.Drops[0].Month != m3.String() || len(plan.Trims) != 1 || plan.Trims[0].Topic != "hyy" ||
		len(plan.Held) != 1 || plan.Held[0].Topic != "hx" || plan.Held[0].Rows != 3 || plan.Held[0].Reason != "hold case-1: litigation 42" {
		t.Fatalf("plan under a hold %+v", plan)
	}
	rep, err := e.App.Retention().Run(ctx, e.Tenant)
	if err != nil || rep.Months != 1 || rep.RowsTrimmed != 4 || len(rep.HeldSincePlan) != 0 {
		t.Fatalf("run under a hold: %+v %v", rep, err)
	}
	table := "im_group_messages_" + m2.String()
	for topic, want := range map[string]int{"hx": 3, "hyy": 0} {
		var n int
		if err := sq.Select("COUNT(*)").From(table).Where(sq.Eq{"topic": topic}).RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil || n != want {
			t.Fatalf("%s rows of %s: %d (%v), want %d", table, topic, n, err, want)
		}
	}
	if f, err := routing.LoadFloor(ctx, e.DB, "hx"); err != nil || f != 0 {
		t.Fatalf("held topic's floor %d %v", f, err)
	}
	if route, _, err := e.App.Routes().Load(ctx, e.Tenant, "hx"); err != nil || len(route) != 1 {
		t.Fatalf("held topic's route %+v %v", route, err)
	}
	e.member("hx", 5, "member", time.Time{})
	code, body := e.Do("GET", "/v1/topics/hx/messages?limit=10", e.Token(5, ""), nil)
	if code != 200 || strings.Count(string(body), `"seq"`) != 3 {
		t.Fatalf("held topic's page: %d %s", code, body)
	}

	// the topic hold lifted, a hold on the user who wrote there keeps it
	if code, body := e.Do("DELETE", "/v1/admin/holds/case-1", admin, nil); code != 204 {
		t.Fatalf("lift hold: %d %s", code, body)
	}
	if code, body := e.Do("PUT", "/v1/admin/holds/case-2", admin, map[string]any{"tenant": e.Tenant, "users": []any{"5", 77}, "reason": "audit"}); code != 200 ||
		!strings.Contains(string(body), `"users":["5","77"]`) {
		t.Fatalf("put user hold: %d %s", code, body)
	}
	plan, err = e.App.Retention().Plan(ctx, e.Tenant)
	if err != nil || len(plan.Drops) != 0 || len(plan.Held) != 1 || plan.Held[0].Reason != "user 5 under hold case-2: audit" {
		t.Fatalf("plan under a user hold %+v %v", plan, err)
	}
	if code, body := e.Do("DELETE", "/v1/admin/holds/case-2", admin, nil); code != 204 {
		t.Fatalf("lift user hold: %d %s", code, body)
	}
	if plan, err = e.App.Retention().Plan(ctx, e.Tenant); err != nil || len(plan.Drops) != 1 || plan.Drops[0].Month != m2.String() || len(plan.Held) != 0 {
		t.Fatalf("plan with no hold %+v %v", plan, err)
	}
}

// TestRetentionPurgeJob: a group purge is refused under a hold and with bad
// input; as a job it is paused and resumed, a runner whose lease has not
// expired keeps it from another, and once the lease expired (its runner
// killed) another runner finishes it: the topic's rows in both months, its
// side rows and route are gone, its pages answer empty, the report counts
// rows per month, a change event is recorded, another topic is untouched.
func TestRetentionPurgeJob(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	admin := e.Token(1, "admin")
	now := e.Now()
	m2, m1 := now.Add(-2), now.Add(-1)
	e.group("pg", 1, "active")
	e.group("pother", 2, "active")
	for _, topic := range []string{"pg", "pother"} {
		e.member(topic, 5, "member", time.Time{})
	}
	retFixture(t, e, m2, "pg", 1, 4)
	retFixture(t, e, m1, "pg", 5, 7)
	retFixture(t, e, m1, "pother", 1, 2)
	e.Activate(now)

	if code, body := e.Do("PUT", "/v1/admin/holds/h1", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"pg"}, "reason": "r"}); code != 200 {
		t.Fatalf("hold: %d %s", code, body)
	}
	code, body := e.Do("DELETE", "/v1/topics/pg?purge=true", e.svc, nil)
	if code != 409 || !strings.Contains(string(body), `"reason":"legal_hold"`) {
		t.Fatalf("purge under a hold: %d %s", code, body)
	}
	if code, body := e.Do("DELETE", "/v1/admin/holds/h1", admin, nil); code != 204 {
		t.Fatalf("lift: %d %s", code, body)
	}
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{"DELETE", "/v1/topics/pg", e.svc, 400},
		{"DELETE", "/v1/topics/pg?purge=1", e.svc, 400},
		{"DELETE", "/v1/topics/pg?purge=true", e.Token(5, ""), 403},
		{"GET", "/v1/admin/jobs/0", e.svc, 400},
		{"GET", "/v1/admin/jobs/999", e.svc, 404},
	} {
		if code, body := e.Do(c.method, c.path, c.token, nil); code != c.want {
			t.Fatalf("%s %s: %d %s, want %d", c.method, c.path, code, body, c.want)
		}
	}
	var j retJob
	do := func(method, path string, want int) {
		t.Helper()
		code, body := e.Do(method, path, e.svc, nil)
		if err := json.Unmarshal(body, &j); code != want || err != nil {
			t.Fatalf("%s %s: %d %s (%v), want %d", method, path, code, body, err, want)
		}
	}
	do("DELETE", "/v1/topics/pg?purge=true", 202)
	if j.State != "queued" {
		t.Fatalf("new job %+v", j)
	}
	path := "/v1/admin/jobs/" + j.ID
	do("POST", path+"/pause", 200)
	if n, err := e.App.Retention().RunJobs(ctx, e.Tenant, "runner-a", time.Second); err != nil || n != 0 || j.State != "paused" {
		t.Fatalf("a paused job ran: %d %v %+v", n, err, j)
	}
	do("POST", path+"/resume", 200)
	// runner "dead" took it and was killed: its lease still holds it
	if _, err := e.DB.ExecContext(ctx, "UPDATE im_jobs SET state = 'running', lease_owner = 'dead', lease_until = NOW(3) + INTERVAL 300000 MICROSECOND WHERE job_id = ?", j.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := e.App.Retention().RunJobs(ctx, e.Tenant, "runner-b", time.Second); err != nil || n != 0 {
		t.Fatalf("a job under another runner's lease ran: %d %v", n, err)
	}
	time.Sleep(350 * time.Millisecond)
	if n, err := e.App.Retention().RunJobs(ctx, e.Tenant, "runner-b", time.Second); err != nil || n != 1 {
		t.Fatalf("the expired job was not taken over: %d %v", n, err)
	}
	do("GET", path, 200)
	if j.State != "done" || j.RowsRemoved != 7 || j.Report.Months[m2.String()] != 4 || j.Report.Months[m1.String()] != 3 ||
		j.Report.Side["mentions"] != 7 || j.Report.Side["revisions"] != 2 {
		t.Fatalf("finished job %+v", j)
	}
	if code, body := e.Do("POST", path+"/pause", e.svc, nil); code != 409 {
		t.Fatalf("pause of a finished job: %d %s", code, body)
	}
	if v := persistMetric(t, e.Env, "imshard_jobs_rows_removed_total", `tenant="`+e.Tenant+`"`); v != 7 {
		t.Fatalf("rows removed metric %v", v)
	}
	// a hold placed after the purge was asked fails the job when it starts
	do("DELETE", "/v1/topics/pother?purge=true", 202)
	if code, body := e.Do("PUT", "/v1/admin/holds/late", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"pother"}, "reason": "late"}); code != 200 {
		t.Fatalf("late hold: %d %s", code, body)
	}
	if _, err := e.App.Retention().RunJobs(ctx, e.Tenant, "runner-b", time.Second); err != nil {
		t.Fatal(err)
	}
	if f := retGetJob(t, e, j.ID); f.State != "failed" || !strings.Contains(f.Error, "legal hold") {
		t.Fatalf("job under a late hold: %+v", f)
	}
	if v := persistMetric(t, e.Env, "imshard_jobs_failures_total", `tenant="`+e.Tenant+`"`); v != 1 {
		t.Fatalf("job failures metric %v", v)
	}
	for _, c := range []struct {
		table string
		topic string
		want  int
	}{
		{"im_group_messages_" + m2.String(), "pg", 0},
		{"im_group_messages_" + m1.String(), "pg", 0},
		{"im_group_messages_" + m1.String(), "pother", 2},
		{"im_group_message_topic_shards", "pg", 0},
		{"im_topic_mentions", "pg", 0},
		{"im_message_revisions", "pg", 0},
		{"im_change_outbox", "pg", 1},
	} {
		var n int
		if err := sq.Select("COUNT(*)").From(c.table).Where(sq.Eq{"topic": c.topic}).RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil || n != c.want {
			t.Errorf("%s rows of %s: %d (%v), want %d", c.table, c.topic, n, err, c.want)
		}
	}
	if route, _, err := e.App.Routes().Load(ctx, e.Tenant, "pg"); err != nil || len(route) != 0 {
		t.Fatalf("route after purge: %+v %v", route, err)
	}
	tok := e.Token(5, "")
	if code, body := e.Do("GET", "/v1/topics/pg/messages?limit=50", tok, nil); code != 200 || strings.Contains(string(body), `"seq"`) {
		t.Fatalf("purged topic's page: %d %s", code, body)
	}
	if code, body := e.Do("GET", "/v1/topics/pother/messages?limit=50", tok, nil); code != 200 || strings.Count(string(body), `"seq"`) != 2 {
		t.Fatalf("other topic's page: %d %s", code, body)
	}
}

// TestRetentionUserErase: an erase is refused while the user is held and
// with bad input; as a job it makes every message the user sent in every
// month a tombstone through the delete-for-everyone path (revision content
// cleared, change events recorded), leaves a held topic's messages and
// names it, leaves another user's messages, and reports per month.
func TestRetentionUserErase(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	admin := e.Token(1, "admin")
	now := e.Now()
	m2, m1 := now.Add(-2), now.Add(-1)
	for i, topic := range []string{"ea", "ebb", "eccc"} {
		e.group(topic, int64(i+1), "active")
		e.member(topic, 5, "member", time.Time{})
	}
	retFixture(t, e, m2, "ea", 1, 3)
	retFixture(t, e, m1, "ebb", 1, 2)
	retFixture(t, e, m1, "eccc", 1, 2)
	at := m1.Start().Add(time.Hour)
	if _, err := sq.Insert("im_group_messages_"+m1.String()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "content", "created_at", "updated_at").
		Values(999999, "ebb", 2, 3, 6, `{"text":"other"}`, at, at).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	e.Activate(now)

	if code, body := e.Do("PUT", "/v1/admin/holds/u5", admin, map[string]any{"tenant": e.Tenant, "users": []int{5}, "reason": "r"}); code != 200 {
		t.Fatalf("hold: %d %s", code, body)
	}
	if code, body := e.Do("POST", "/v1/admin/users/5/erase", e.svc, nil); code != 409 || !strings.Contains(string(body), `"reason":"legal_hold"`) {
		t.Fatalf("erase of a held user: %d %s", code, body)
	}
	if code, body := e.Do("DELETE", "/v1/admin/holds/u5", admin, nil); code != 204 {
		t.Fatalf("lift: %d %s", code, body)
	}
	if code, body := e.Do("PUT", "/v1/admin/holds/t3", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"eccc"}, "reason": "r"}); code != 200 {
		t.Fatalf("topic hold: %d %s", code, body)
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/v1/admin/users/0/erase", e.svc, 400},
		{"/v1/admin/users/x/erase", e.svc, 400},
		{"/v1/admin/users/5/erase", e.Token(5, ""), 403},
	} {
		if code, body := e.Do("POST", c.path, c.token, nil); code != c.want {
			t.Fatalf("POST %s: %d %s, want %d", c.path, code, body, c.want)
		}
	}
	// a month table made before the template had the sender index gets
	// it from the erase
	if _, err := e.DB.ExecContext(ctx, "ALTER TABLE im_group_messages_"+m2.String()+" DROP INDEX idx_from_topic_seq"); err != nil {
		t.Fatal(err)
	}
	var j retJob
	code, body := e.Do("POST", "/v1/admin/users/5/erase", e.svc, nil)
	if err := json.Unmarshal(body, &j); code != 202 || err != nil || j.Kind != "erase" || j.UserID != "5" || j.State != "queued" {
		t.Fatalf("erase: %d %s", code, body)
	}
	if n, err := e.App.Retention().RunJobs(ctx, e.Tenant, "runner", 5*time.Second); err != nil || n != 1 {
		t.Fatalf("erase run: %d %v", n, err)
	}
	if j = retGetJob(t, e, j.ID); j.State != "done" || j.RowsRemoved != 5 ||
		j.Report.Months[m2.String()] != 3 || j.Report.Months[m1.String()] != 2 || j.Report.Side["revisions"] != 0 ||
		!slices.Equal(j.Report.HeldTopics, []string{"eccc"}) {
		t.Fatalf("erase job: %+v", j)
	}
	for _, c := range []struct {
		table string
		where sq.Sqlizer
		want  int
	}{
		{"im_group_messages_" + m2.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil}, 3},
		{"im_group_messages_" + m1.String(), sq.Eq{"topic": "ebb", "from_user": 5, "status": "deleted", "content": nil}, 2},
		{"im_group_messages_" + m1.String(), sq.Eq{"topic": "eccc", "status": "normal"}, 2},
		{"im_group_messages_" + m1.String(), sq.Eq{"topic": "ebb", "from_user": 6, "status": "normal"}, 1},
		{"im_message_revisions", sq.And{sq.Eq{"topic": []string{"ea", "ebb"}}, sq.NotEq{"content": nil}}, 0},
		// one change of the topic's batch: its seqs in seq_ids, seqid the last
		{"im_message_revisions", sq.Eq{"topic": "ea", "action": "erase", "seqid": 3, "message_id": 0, "seq_ids": "[1,2,3]"}, 1},
		{"im_change_outbox", sq.Eq{"topic": "ea"}, 1},
	} {
		var n int
		if err := sq.Select("COUNT(*)").From(c.table).Where(c.where).RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil || n != c.want {
			t.Errorf("%s where %v: %d (%v), want %d", c.table, c.where, n, err, c.want)
		}
	}
	var indexed int
	if err := e.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = 'idx_from_topic_seq'",
		"im_group_messages_"+m2.String()).Scan(&indexed); err != nil || indexed == 0 {
		t.Fatalf("sender index of %s after the erase: %d %v", m2, indexed, err)
	}
	if code, body := e.Do("GET", "/v1/topics/ea/messages/2", e.Token(5, ""), nil); code != 200 || !strings.Contains(string(body), `"status":"deleted"`) {
		t.Fatalf("an erased message: %d %s", code, body)
	}
}

// TestRetentionEraseManyTopics: a user who wrote in 40 topics over two
// months (5,200 messages a month, more than one batch of 5,000 each) is
// erased batch by batch: every message a tombstone, no revision keeps
// content, one change (event and revision, action erase) per topic and
// batch whose seq_ids cover the topic's seqs in order with consecutive
// change_seqs, another user's message left, and the report counts each
// month.
func TestRetentionEraseManyTopics(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	now := e.Now()
	m2, m1 := now.Add(-2), now.Add(-1)
	var topics []string
	for i := 1; i <= 40; i++ {
		topic := "m" + strings.Repeat("t", i)
		topics = append(topics, topic)
		retFixture(t, e, m2, topic, 1, 130)
		retFixture(t, e, m1, topic, 131, 260)
	}
	at := m1.Start().Add(time.Hour)
	if _, err := sq.Insert("im_group_messages_"+m1.String()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "content", "created_at", "updated_at").
		Values(999999, topics[0], 1, 261, 6, `{"text":"other"}`, at, at).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	e.Activate(now)
	j := retWaitJob(t, e, retStartJob(t, e, "POST", "/v1/admin/users/5/erase"))
	if j.RowsRemoved != 10400 || j.Report.Months[m2.String()] != 5200 || j.Report.Months[m1.String()] != 5200 || j.Report.Side["revisions"] != 0 {
		t.Fatalf("erase job: %+v", j)
	}
	for _, c := range []struct {
		table string
		where sq.Sqlizer
		want  int
	}{
		{"im_group_messages_" + m2.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil, "version": 2}, 5200},
		{"im_group_messages_" + m1.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil, "version": 2}, 5200},
		{"im_group_messages_" + m1.String(), sq.Eq{"from_user": 6, "status": "normal"}, 1},
		{"im_message_revisions", sq.NotEq{"content": nil}, 0},
		{"im_message_revisions", sq.Eq{"action": "delete"}, 0},
		// one change per topic and batch: 5,000 messages of a batch span
		// 39 topics (the 39th split), so each month takes 41
		{"im_message_revisions", sq.Eq{"action": "erase"}, 82},
		{"im_change_outbox", nil, 82},
	} {
		q := sq.Select("COUNT(*)").From(c.table)
		if c.where != nil {
			q = q.Where(c.where)
		}
		var n int
		if err := q.RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil || n != c.want {
			t.Errorf("%s where %v: %d (%v), want %d", c.table, c.where, n, err, c.want)
		}
	}
	// each topic's events, in the order the relay reads them (by id):
	// change_seqs from 1 on, their seq_ids 1..60 in order, and each its
	// revision's: same change_seq, seqs, month, by the system, the job's
	// reason
	revs := map[string]map[int64]string{}
	rrows, err := sq.Select("topic", "change_seq", "seq_ids").From("im_message_revisions").
		Where(sq.Eq{"action": "erase", "actor": 0, "content": nil, "head": nil, "message_id": 0, "reason": "user erase (job " + j.ID + ")"}).
		Where("seqid = JSON_EXTRACT(seq_ids, CONCAT('$[', JSON_LENGTH(seq_ids) - 1, ']'))").RunWith(e.DB).QueryContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for rrows.Next() {
		var topic, seqs string
		var cs int64
		if err := rrows.Scan(&topic, &cs, &seqs); err != nil {
			t.Fatal(err)
		}
		if revs[topic] == nil {
			revs[topic] = map[int64]string{}
		}
		revs[topic][cs] = seqs
	}
	if err := errors.Join(rrows.Err(), rrows.Close()); err != nil {
		t.Fatal(err)
	}
	rows, err := sq.Select("topic", "change_seq", "event").From("im_change_outbox").OrderBy("id").RunWith(e.DB).QueryContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	next, changes := map[string]int64{}, map[string]int64{}
	for rows.Next() {
		var topic string
		var cs int64
		var raw []byte
		if err := rows.Scan(&topic, &cs, &raw); err != nil {
			t.Fatal(err)
		}
		var ev struct {
			SeqID     int64           `json:"seq_id"`
			SeqIDs    []int64         `json:"seq_ids"`
			ChangeSeq int64           `json:"change_seq"`
			Action    string          `json:"action"`
			Message   json.RawMessage `json:"message"`
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		changes[topic]++
		if cs != changes[topic] || ev.ChangeSeq != cs || ev.Action != "erase" || len(ev.SeqIDs) == 0 || ev.SeqID != ev.SeqIDs[0] || ev.Message != nil {
			t.Fatalf("%s: event %d of the topic is change_seq %d %s", topic, changes[topic], cs, raw)
		}
		for _, seq := range ev.SeqIDs {
			if next[topic]++; seq != next[topic] {
				t.Fatalf("%s: event %d of the topic names seq %d, want %d: %s", topic, changes[topic], seq, next[topic], raw)
			}
		}
		if b, _ := json.Marshal(ev.SeqIDs); revs[topic][cs] != string(b) {
			t.Fatalf("%s: change_seq %d's revision names %q, its event %s", topic, cs, revs[topic][cs], b)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, topic := range topics {
		if next[topic] != 260 {
			t.Errorf("%s: %d seqs erased, want 260", topic, next[topic])
		}
	}
}
