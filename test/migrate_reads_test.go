package test

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/query"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// Migration from the legacy table, continued (docs/migration.md): every
// read of messages includes the legacy table while the tenant migrates,
// changes after cutover, abort, and a tenant without the state table.

const (
	mrTopics  = 3
	mrPer     = 12 // two legacy rows per month
	mrService = 101
)

// mrStart runs send, query and persist for a tenant whose legacy table
// holds mrTopics × mrPer rows (topics legacy-000..002, from_user 100..104)
// over the six months before the active one; every topic has a group with
// rpMember, rpOther and mrService (the sender of seqs 1, 6, 11) as members.
func mrStart(t *testing.T, opts harness.Options) (*harness.Env, routing.Month) {
	t.Helper()
	opts.Roles = []string{app.Send, app.Query, app.Persist}
	env := harness.Start(t, opts)
	now := env.Now()
	env.Activate(now)
	first := now.Add(-migMonths)
	migLegacy(t, env.DB, first, mrTopics, mrPer)
	migGroups(t, env.DB, 0, mrTopics)
	for i := 0; i < mrTopics; i++ {
		if _, err := env.DB.Exec("INSERT INTO im_group_members (topic, user_id, role) VALUES (?, ?, 'member')", migTopic(i), mrService); err != nil {
			t.Fatal(err)
		}
	}
	return env, first
}

// mrLegacyID is the message_id of a legacy row (read before finish renames the table).
func mrLegacyID(t *testing.T, env *harness.Env, topic string, seq int64) int64 {
	t.Helper()
	var id int64
	if err := env.DB.QueryRow("SELECT message_id FROM im_group_messages WHERE topic = ? AND seqid = ?", topic, seq).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// mrExpectReads checks every read of topic legacy-001 at one stage: a
// search finds its legacy seq 12, its legacy seq 5 is found by id (member
// and admin), and rpMember's unread badge, topic list entry and last
// message count up to last.
func mrExpectReads(t *testing.T, env *harness.Env, stage string, now routing.Month, id, last int64) {
	t.Helper()
	topic := migTopic(1)
	q := url.Values{"q": {"legacy message 12 of 1"}, "from": {now.Add(-1).Start().Format(time.RFC3339)},
		"to": {now.Start().Format(time.RFC3339)}, "limit": {"10"}}
	var found rpPage
	if code := rpGet(t, env, rpMember, "", "/v1/topics/"+topic+"/search?"+q.Encode(), &found); code != 200 ||
		len(found.Messages) != 1 || found.Messages[0].Seq != 12 {
		t.Fatalf("%s: search of a legacy row: %d %+v", stage, code, found.seqs())
	}
	var m message.Message
	if code := rpGet(t, env, rpMember, "", "/v1/messages/"+strconv.FormatInt(id, 10), &m); code != 200 || m.Seq != 5 || m.Topic != topic {
		t.Fatalf("%s: a legacy row by id: %d %+v", stage, code, m)
	}
	var loc query.Located
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/messages/"+strconv.FormatInt(id, 10), &loc); code != 200 ||
		loc.Message.Seq != 5 || loc.ShardMonth == "" {
		t.Fatalf("%s: admin lookup of a legacy row: %d %+v", stage, code, loc)
	}
	var unread inbox.UnreadSummary
	if code := rpGet(t, env, rpMember, "", "/v1/me/unread", &unread); code != 200 {
		t.Fatalf("%s: unread: %d", stage, code)
	}
	badge := -1
	for _, u := range unread.Topics {
		if u.Topic == topic {
			badge = u.Unread
		}
	}
	if badge != int(last) {
		t.Fatalf("%s: unread of %s is %d, want %d (%+v)", stage, topic, badge, last, unread)
	}
	var topics inbox.TopicsPage
	if code := rpGet(t, env, rpMember, "", "/v1/me/topics?limit=50", &topics); code != 200 {
		t.Fatalf("%s: topic list: %d", stage, code)
	}
	for _, it := range topics.Topics {
		if it.Topic != topic {
			continue
		}
		if it.LastSeq != last || it.LastMessage == nil || it.LastMessage.Seq != last {
			t.Fatalf("%s: topic list entry of %s: last_seq %d, last_message %+v, want %d", stage, topic, it.LastSeq, it.LastMessage, last)
		}
		return
	}
	t.Fatalf("%s: %s is not in the topic list", stage, topic)
}

// mrSend sends one message to topic as user once this process lets it
// (its migration state refreshes within a second) and returns its seq.
func mrSend(t *testing.T, env *harness.Env, topic string, user int64, text string) int64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := env.Do("POST", "/v1/topics/"+topic+"/messages", env.Token(user, ""),
			map[string]any{"client_msg_id": text, "msg_type": "text", "content": map[string]any{"text": text}})
		if code == 201 {
			var r struct{ Seq int64 }
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			return r.Seq
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("send to %s: %d %s", topic, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mrStored waits until topic's seq is in a month table.
func mrStored(t *testing.T, env *harness.Env, topic string, seq int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mirror, err := routing.LoadMirror(context.Background(), env.DB, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range mirror {
			if r.MaxSeq >= seq {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s seq %d not stored: %+v", topic, seq, mirror)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMigrationDualReadEverywhere: while the tenant migrates, search, the
// lookups by message id (member and admin), the unread badges and the
// topic list's last message read the legacy table as one more source —
// planned (the legacy table whole), after cutover before any row is
// copied (legacy up to cutover_seq, month tables above it), after the
// backfill, and after finish (month tables only).
func TestMigrationDualReadEverywhere(t *testing.T) {
	t.Parallel()
	env, _ := mrStart(t, harness.Options{})
	ctx := context.Background()
	now := env.Now()
	id := mrLegacyID(t, env, migTopic(1), 5)
	mg := env.App.NewMigrator()
	if _, err := mg.Plan(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	mrExpectReads(t, env, "planned", now, id, mrPer)
	if _, err := mg.Start(ctx, env.Tenant, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	mrExpectReads(t, env, "after cutover", now, id, mrPer)
	seq := mrSend(t, env, migTopic(1), rpOther, "after cutover")
	if seq != mrPer+1 {
		t.Fatalf("first seq after cutover: %d, want %d", seq, mrPer+1)
	}
	mrStored(t, env, migTopic(1), seq)
	mrExpectReads(t, env, "after cutover and a send", now, id, seq)
	time.Sleep(2 * routing.MigrationRefresh) // the module copies only once writes are open everywhere
	if err := mg.RunUntilDone(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if m := migState(t, env.DB); m.State != routing.MigrationDone {
		t.Fatalf("migration after the backfill: %+v", m)
	}
	mrExpectReads(t, env, "backfilled", now, id, seq)
	if _, err := mg.Finish(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	mrExpectReads(t, env, "finished", now, id, seq)
}

// TestMigrationChangesAfterCutover: before cutover a change answers 503
// (details.migration); after it a recall, an edit and a delete for
// everyone of rows only the legacy table holds succeed — each copies its
// row into its month table and writes both — and readers see them at
// once; the backfill then finds those rows present, the verification
// passes, and after finish the month tables show the same changes.
func TestMigrationChangesAfterCutover(t *testing.T) {
	t.Parallel()
	env, _ := mrStart(t, harness.Options{})
	ctx := context.Background()
	topic := migTopic(1)
	mg := env.App.NewMigrator()
	if _, err := mg.Plan(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	service := env.Token(rpMember, "service")
	if code, r := chRecall(t, env, service, topic, 5, nil); code != 503 || r.Error.Details["migration"] != "pending" {
		t.Fatalf("recall before cutover: %d %+v", code, r)
	}
	if _, err := mg.Start(ctx, env.Tenant, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, r := chRecall(t, env, service, topic, 5, nil)
		if code == 200 && r.Message.Status == message.StatusRecalled {
			break
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("recall of a legacy row after cutover: %d %+v", code, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	edit := chEditBody("edited legacy row", 1)
	edit["from_user"] = strconv.Itoa(mrService)
	if code, r := chEdit(t, env, service, topic, 6, edit); code != 200 || chText(r.Message) != "edited legacy row" || r.Message.Version != 2 {
		t.Fatalf("edit of a legacy row: %d %+v", code, r)
	}
	if code, r := chDeleteAll(t, env, env.Token(rpAdmin, "admin"), topic, 7, "cleanup"); code != 200 || r.Message.Status != message.StatusDeleted {
		t.Fatalf("delete of a legacy row: %d %+v", code, r)
	}
	if code, r := chRecall(t, env, service, topic, mrPer+40, nil); code != 404 {
		t.Fatalf("recall of a seq that never existed: %d %+v", code, r)
	}
	expect := func(stage string) {
		t.Helper()
		p := rpList(t, env, rpMember, topic, url.Values{"before": {"8"}, "limit": {"10"}})
		if got := p.seqs(); len(got) != 6 || got[0] != 6 {
			t.Fatalf("%s: page below 8: %v", stage, got)
		}
		if p.Messages[0].Version != 2 || chText(p.Messages[0]) != "edited legacy row" || p.Messages[1].Status != message.StatusRecalled {
			t.Fatalf("%s: changed rows as read: %+v", stage, p.Messages[:2])
		}
		if revs := chRevisions(t, env, topic, 6); len(revs) != 1 {
			t.Fatalf("%s: revisions of seq 6: %+v", stage, revs)
		}
	}
	expect("after the changes")
	// each changed row is in its month table already, and in the legacy table alike
	for _, seq := range []int64{5, 6, 7} {
		m, err := routing.LegacyMonth(ctx, env.DB, topic, seq)
		if err != nil {
			t.Fatal(err)
		}
		tbl, _, err := env.App.Catalog().Table(ctx, env.Tenant, m)
		if err != nil {
			t.Fatal(err)
		}
		var monthV, legacyV int
		if err := env.DB.QueryRow("SELECT m.version, l.version FROM "+tbl.Quoted()+" AS m JOIN im_group_messages AS l USING (message_id) WHERE m.topic = ? AND m.seqid = ?",
			topic, seq).Scan(&monthV, &legacyV); err != nil {
			t.Fatalf("seq %d in %s: %v", seq, tbl.Name(), err)
		}
		if monthV != 2 || legacyV != 2 {
			t.Fatalf("seq %d: version %d in its month table, %d in the legacy table", seq, monthV, legacyV)
		}
	}
	time.Sleep(2 * routing.MigrationRefresh)
	if err := mg.RunUntilDone(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	m := migState(t, env.DB)
	if m.State != routing.MigrationDone || m.RowsPresent != 3 || m.RowsInserted != mrTopics*mrPer-3 {
		diffs, _ := routing.LoadMigrationDiffs(ctx, env.DB, 0)
		t.Fatalf("after the backfill: %+v %+v", m, diffs)
	}
	expect("backfilled")
	if _, err := mg.Finish(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	expect("finished")
	if n := migDuplicateSeqs(t, env); n != 0 {
		t.Fatalf("%d seqs stored twice", n)
	}
}

// TestMigrationAbortDropsPlanMonths: abort drops the month tables the plan
// created before the active month that are still empty — unregistered and
// gone — and keeps one holding a row, a month table that existed before
// the plan, and the active month's.
func TestMigrationAbortDropsPlanMonths(t *testing.T) {
	t.Parallel()
	env, first := mrStart(t, harness.Options{})
	ctx := context.Background()
	now := env.Now()
	// a month table that was there before the plan
	pre, err := routing.TableFor(first.Add(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec(pre.CreateDDL()); err != nil {
		t.Fatal(err)
	}
	if err := routing.RegisterShard(ctx, env.DB, pre); err != nil {
		t.Fatal(err)
	}
	before, err := env.App.Catalog().List(ctx, env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	existed := map[routing.Month]bool{}
	for _, s := range before {
		existed[s.Month] = true
	}
	mg := env.App.NewMigrator()
	if _, err := mg.Plan(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	// a plan month that got a row (nothing writes one; an operator might)
	kept, err := routing.TableFor(first.Add(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("INSERT INTO " + kept.Quoted() + " SELECT * FROM im_group_messages WHERE topic = 'legacy-002' AND seqid = 3"); err != nil {
		t.Fatal(err)
	}
	rep, err := mg.Abort(ctx, env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Migration.State != routing.MigrationNone {
		t.Fatalf("state after abort: %s", rep.Migration.State)
	}
	var want []routing.Month
	for m := first; m.Before(now); m = m.Next() {
		if m != first.Add(1) && !existed[m] {
			want = append(want, m)
		}
	}
	if mrMonths(rep.Dropped) != mrMonths(want) {
		t.Fatalf("dropped %v, want %v (kept %v)", mrMonths(rep.Dropped), mrMonths(want), mrMonths(rep.Kept))
	}
	shards, err := env.App.Catalog().List(ctx, env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	registered := map[routing.Month]bool{}
	for _, s := range shards {
		registered[s.Month] = true
	}
	for _, m := range want {
		tbl, _ := routing.TableFor(m)
		var n int
		if err := env.DB.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", tbl.Name()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 || registered[m] {
			t.Fatalf("%s after abort: table present %v, registered %v", tbl.Name(), n != 0, registered[m])
		}
	}
	for _, m := range []routing.Month{first.Add(1), first.Add(2), now} {
		if !registered[m] {
			t.Fatalf("month %s was dropped from the catalog", m)
		}
	}
	var rows int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM " + kept.Quoted()).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("the plan month holding a row: %d rows, %v", rows, err)
	}
	// the tenant is served as before: a send goes to the active month
	mrSend(t, env, migTopic(0), rpMember, "after abort")
}

// mrMonths lists months for a comparison.
func mrMonths(ms []routing.Month) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return strings.Join(out, ",")
}

// mrLog collects a process's log lines.
type mrLog struct{ testenv.LogBuffer }

// TestMigrationStateTableMissingIsQuiet: a tenant database without the
// migration tables (its schema predates them) reads as "no migration":
// sends and the admin route work, and the state refresh logs nothing.
func TestMigrationStateTableMissingIsQuiet(t *testing.T) {
	t.Parallel()
	var logs mrLog
	log := zerolog.New(&logs).Level(zerolog.WarnLevel)
	env := harness.Start(t, harness.Options{Roles: []string{app.Send, app.Query, app.Persist}, Log: &log})
	env.Activate(env.Now())
	rpGroup(t, env, "fresh")
	if _, err := env.DB.Exec("DROP TABLE im_migration"); err != nil {
		t.Fatal(err)
	}
	mrSend(t, env, "fresh", rpMember, "no migration")
	var mig struct{ State string }
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/migrations", &mig); code != 200 || mig.State != "none" {
		t.Fatalf("admin migrations: %d %+v", code, mig)
	}
	time.Sleep(3 * routing.MigrationRefresh)
	if out := logs.String(); strings.Contains(out, "migration state refresh failed") || strings.Contains(out, "im_migration") {
		t.Fatalf("a tenant without the migration tables logged:\n%s", out)
	}
}
