package test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// retWarm reads everything a reader keeps copies of for topic as user:
// a page (the hot cache and the process's copy), the badges (remembered),
// the topic list (route mirrors, last message), a sync.
func retWarm(t *testing.T, e *sendEnv, user int64, topic string) {
	t.Helper()
	for range 2 {
		rpList(t, e.Env, user, topic, nil)
		rsUnread(t, e, user)
		rsTopics(t, e, user, 50)
		rsSync(t, e, user, "", 50)
	}
}

// TestRetentionJobsLeaveNoCopies: a purge and an erase after every cache
// of the read path was warmed (Redis hot cache, the process's recent
// copies, remembered badges, route mirrors, the topic list's last
// message): no reader is served a removed or erased message afterwards.
func TestRetentionJobsLeaveNoCopies(t *testing.T) {
	e := startSend(t, harness.Options{Roles: []string{"all"}})
	const reader, writer, other = 6, 5, 7
	for i, topic := range []string{"cpurge", "cerase"} {
		e.group(topic, int64(700+i), "active")
		for _, u := range []int64{reader, writer, other} {
			e.member(topic, u, "member", time.Time{})
		}
	}
	send := func(user int64, topic string, n int) {
		for i := range n {
			e.mustSend(e.Token(user, ""), topic, sendBody(topic+strconv.FormatInt(user, 10)+"-"+strconv.Itoa(i), "secret "+topic))
		}
	}
	send(writer, "cpurge", 4)
	send(other, "cerase", 2)
	send(writer, "cerase", 3)
	chWaitSettled(t, e.Env, "cpurge")
	chWaitSettled(t, e.Env, "cerase")
	retWarm(t, e, reader, "cpurge")
	retWarm(t, e, reader, "cerase")

	// purge: nothing of the topic is served any more
	purge := retStartJob(t, e, "DELETE", "/v1/topics/cpurge?purge=true")
	retWaitJob(t, e, purge)
	if p := rpList(t, e.Env, reader, "cpurge", nil); len(p.seqs()) != 0 {
		t.Fatalf("purged topic's page: %v", p.seqs())
	}
	if code, body := e.Do("GET", "/v1/topics/cpurge/messages/2", e.Token(reader, ""), nil); code != 404 {
		t.Fatalf("purged message read: %d %s", code, body)
	}
	_, badges := rsUnread(t, e, reader)
	if b := badges["cpurge"]; b.Unread != 0 {
		t.Fatalf("purged topic's badge: %+v", b)
	}
	for _, tp := range rsTopics(t, e, reader, 50) {
		if tp.Topic == "cpurge" && (tp.LastMessage != nil || tp.Unread != 0) {
			t.Fatalf("purged topic in the list: %+v", tp)
		}
	}
	for _, tp := range rsSync(t, e, reader, "", 50).Topics {
		if tp.Topic == "cpurge" && (tp.LastMessage != nil || tp.Unread != 0) {
			t.Fatalf("purged topic in a sync: %+v", tp)
		}
	}

	// erase: the writer's messages are tombstones everywhere, the other
	// user's stay
	erase := retStartJob(t, e, "POST", "/v1/admin/users/"+strconv.Itoa(writer)+"/erase")
	retWaitJob(t, e, erase)
	p := rpList(t, e.Env, reader, "cerase", nil)
	normal := 0
	for _, m := range p.Messages {
		if int64(m.FromUser) == writer && (m.Status != "deleted" || strings.Contains(string(m.Content), "secret")) {
			t.Fatalf("erased message served: %+v", m)
		}
		if m.Status == "normal" {
			normal++
		}
	}
	if normal != 2 {
		t.Fatalf("the other user's messages: %+v", p.Messages)
	}
	_, badges = rsUnread(t, e, reader)
	if b := badges["cerase"]; b.Unread != 2 {
		t.Fatalf("erased topic's badge: %+v", b)
	}
	for _, tp := range rsTopics(t, e, reader, 50) {
		if tp.Topic == "cerase" && (tp.LastMessage == nil || strings.Contains(string(tp.LastMessage.Content), "secret") && int64(tp.LastMessage.FromUser) == writer) {
			t.Fatalf("erased topic in the list: %+v", tp)
		}
	}
}

// TestRetentionHoldStopsARunningJob: a hold placed while a purge runs —
// its first month removed, its next batch waiting on a row lock — stops
// the job before that batch commits: the batch rolls back, the held rows
// stay, the job fails naming the hold, and its report keeps what it did.
func TestRetentionHoldStopsARunningJob(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	now := e.Now()
	m2, m1 := now.Add(-2), now.Add(-1)
	e.group("hp", 1, "active")
	retFixture(t, e, m2, "hp", 1, 3)
	retFixture(t, e, m1, "hp", 4, 6)
	e.Activate(now)
	count := func(m routing.Month) int {
		t.Helper()
		var n int
		if err := sq.Select("COUNT(*)").From("im_group_messages_" + m.String()).Where(sq.Eq{"topic": "hp"}).
			RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	lock, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.ExecContext(ctx, "SELECT seqid FROM im_group_messages_"+m1.String()+" WHERE topic = 'hp' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	id := retStartJob(t, e, "DELETE", "/v1/topics/hp?purge=true")
	ran := make(chan error, 1)
	go func() {
		_, err := e.App.Retention().RunJobs(ctx, e.Tenant, "runner", 10*time.Second)
		ran <- err
	}()
	sendWaitFor(t, 5*time.Second, "the older month purged", func() bool { return count(m2) == 0 })
	admin := e.Token(1, "admin")
	if code, body := e.Do("PUT", "/v1/admin/holds/late", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"hp"}, "reason": "case 9"}); code != 200 {
		t.Fatalf("hold: %d %s", code, body)
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if j := retGetJob(t, e, id); j.State != "failed" || !strings.Contains(j.Error, "legal hold: hold late: case 9") ||
		j.Report.Months[m2.String()] != 3 || j.Report.Months[m1.String()] != 0 {
		t.Fatalf("job under a hold placed mid-run: %+v", j)
	}
	if n := count(m1); n != 3 {
		t.Fatalf("held rows removed: %d left of 3", n)
	}
}

// TestRetentionPurgeSurvivesKill9: a shard manager process running a
// purge is killed with SIGKILL right after its second batch committed
// (two of three months removed, the job still running under its lease);
// a new shard manager process takes the job over once the lease expired,
// finishes it from its checkpoint, and every purged row was removed
// exactly once — the per-month counts and the one purge event say so —
// while another topic's rows are untouched.
func TestRetentionPurgeSurvivesKill9(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	now := e.Now()
	months := []routing.Month{now.Add(-3), now.Add(-2), now.Add(-1)}
	e.group("kp", 1, "active")
	e.group("kother", 2, "active")
	for i, m := range months {
		retFixture(t, e, m, "kp", int64(3*i+1), int64(3*i+3))
	}
	retFixture(t, e, months[1], "kother", 1, 2)
	e.Activate(now)
	count := func(table, topic string) int {
		t.Helper()
		var n int
		if err := sq.Select("COUNT(*)").From(table).Where(sq.Eq{"topic": topic}).RunWith(e.DB).QueryRowContext(ctx).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	kpRows := func() (n int) {
		for _, m := range months {
			n += count("im_group_messages_"+m.String(), "kp")
		}
		return n
	}

	id := retStartJob(t, e, "DELETE", "/v1/topics/kp?purge=true")
	state, removed, shardmgr := retKillJob(t, e, id, 2)
	if state != "running" || removed != 6 || kpRows() != 3 {
		t.Fatalf("killed mid-purge: state %s, %d rows recorded, %d left", state, removed, kpRows())
	}
	// the dead runner's lease runs out; the next runner's first poll takes
	// the job over
	sendWaitFor(t, 3*time.Second, "the lease expired", func() bool {
		var n int
		err := e.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_jobs WHERE job_id = ? AND lease_until < NOW(3)", id).Scan(&n)
		return err == nil && n == 1
	})
	shardmgr()
	var j retJob
	sendWaitFor(t, 8*time.Second, "the job done", func() bool {
		j = retGetJob(t, e, id)
		return j.State == "done"
	})
	for _, m := range months {
		if j.Report.Months[m.String()] != 3 {
			t.Fatalf("report %+v: want 3 rows of each month", j)
		}
	}
	if j.RowsRemoved != 9 || kpRows() != 0 || count("im_change_outbox", "kp") != 1 || count("im_topic_mentions", "kp") != 0 {
		t.Fatalf("after the resumed purge: %+v, %d rows left, %d purge events", j, kpRows(), count("im_change_outbox", "kp"))
	}
	if n := count("im_group_messages_"+months[1].String(), "kother"); n != 2 {
		t.Fatalf("another topic's rows: %d of 2", n)
	}
}

// TestFloorCopyInRedis: a page checks the retention floor in its Redis
// round trip, not in MySQL: a raise writes the record and then the copy
// (with a TTL), pages and exact reads answer from the copy even with the
// record's table out of reach, a stranger is refused before the floor
// says anything, a missing copy is read from the record and put back, and
// a lower raise lowers neither.
func TestFloorCopyInRedis(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "persist", "query"}})
	const reader, stranger = 5, 9
	e.group("fc", 1, "active")
	e.member("fc", reader, "member", time.Time{})
	for i := range 6 {
		e.mustSend(e.Token(reader, ""), "fc", sendBody("fc-"+strconv.Itoa(i), "m"))
	}
	chWaitSettled(t, e.Env, "fc")
	if err := e.RaiseFloors(routing.Floor{Topic: "fc", Seq: 4}); err != nil {
		t.Fatal(err)
	}
	key := e.Keys().Floor("fc")
	copyOf := func() string {
		t.Helper()
		v, err := e.Redis.Do(ctx, e.Redis.B().Get().Key(key).Build()).ToString()
		if err != nil {
			t.Fatalf("floor copy: %v", err)
		}
		return v
	}
	if v := copyOf(); v != "4" {
		t.Fatalf("floor copy after the raise: %q, want 4", v)
	}
	if ttl, err := e.Redis.Do(ctx, e.Redis.B().Ttl().Key(key).Build()).AsInt64(); err != nil || ttl <= 0 {
		t.Fatalf("floor copy TTL: %d %v", ttl, err)
	}
	pages := func(what string) {
		t.Helper()
		if got := rpList(t, e.Env, reader, "fc", nil).seqs(); !slices.Equal(got, []int64{6, 5, 4}) {
			t.Fatalf("%s: latest page %v, want [6 5 4]", what, got)
		}
		if got := rpList(t, e.Env, reader, "fc", url.Values{"since": {"0"}}).seqs(); !slices.Equal(got, []int64{4, 5, 6}) {
			t.Fatalf("%s: since page %v, want [4 5 6]", what, got)
		}
		if got := rpList(t, e.Env, reader, "fc", url.Values{"before": {"4"}}).seqs(); len(got) != 0 {
			t.Fatalf("%s: before the floor %v, want nothing", what, got)
		}
	}
	pages("copy in Redis")

	// the record out of reach: pages answer from the copy alone
	rename := func(from, to string) {
		t.Helper()
		if _, err := e.DB.ExecContext(ctx, "RENAME TABLE "+from+" TO "+to); err != nil {
			t.Fatal(err)
		}
	}
	rename("im_topic_floors", "im_topic_floors_away")
	restored := false
	defer func() {
		if !restored {
			rename("im_topic_floors_away", "im_topic_floors")
		}
	}()
	pages("record out of reach")
	rename("im_topic_floors_away", "im_topic_floors")
	restored = true

	// a stranger learns nothing, wherever the cursor is
	for _, q := range []string{"?before=3", "?since=1", ""} {
		if code, body := e.Do("GET", "/v1/topics/fc/messages"+q, e.Token(stranger, ""), nil); code != 403 {
			t.Fatalf("stranger %s: %d %s", q, code, body)
		}
	}

	// a missing copy: read from the record, then put back
	if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	pages("copy missing")
	if v := copyOf(); v != "4" {
		t.Fatalf("floor copy put back: %q, want 4", v)
	}
	if code, body := e.Do("GET", "/v1/topics/fc/messages/2", e.Token(reader, ""), nil); code != 404 || !strings.Contains(string(body), "expired") {
		t.Fatalf("an expired seq: %d %s", code, body)
	}

	// never down: neither the record nor the copy
	if err := e.RaiseFloors(routing.Floor{Topic: "fc", Seq: 2}); err != nil {
		t.Fatal(err)
	}
	if rec, err := routing.LoadFloor(ctx, e.DB, "fc"); err != nil || rec != 4 || copyOf() != "4" {
		t.Fatalf("after a lower raise: record %d (%v), copy %s; want 4 and 4", rec, err, copyOf())
	}
}

// retKillJob runs job id in a shard manager process that the failpoint
// kills right after the job's batch-th batch committed, and returns the
// job's state and rows_removed as the kill left them, and a starter of
// shard manager processes (one takes the job over once its lease expired).
func retKillJob(t *testing.T, e *sendEnv, id string, batch int) (state string, removed int64, shardmgr func(env ...string) *faultsProc) {
	t.Helper()
	cfg := tenantConfig(t, e.Tenant, "shard: {lock_ttl: 1s}\n")
	shardmgr = func(env ...string) *faultsProc {
		env = append(env, fmt.Sprintf("IMSHARD_METRICS_ADDR=127.0.0.1:%d", testenv.FreePort(t)))
		return faultsStart(t, env, "serve", "--roles=shardmgr", "--config", cfg)
	}
	p := shardmgr(fmt.Sprintf("%s=%d", testhook.CrashAfterJobBatchEnv, batch))
	if err := p.wait(t, 8*time.Second); err == nil {
		t.Fatalf("the shard manager was not killed\n%s", p.out.String())
	}
	if err := e.DB.QueryRowContext(context.Background(), "SELECT state, rows_removed FROM im_jobs WHERE job_id = ?", id).Scan(&state, &removed); err != nil {
		t.Fatal(err)
	}
	return state, removed, shardmgr
}

// TestRetentionEraseSurvivesKill9: a shard manager process running a user
// erase is killed with SIGKILL right after the erase's first batch
// committed (5,000 of the user's 7,500 messages of the oldest month
// erased, the job still running under its lease); a new shard manager
// process takes the job over once the lease expired and finishes it from
// there: every message of the user in the three months is erased exactly
// once — one tombstone version each, one change event and one erase
// revision per topic and batch, no revision left with content — another
// user's message is
// untouched, and the job's report counts each month's messages once.
func TestRetentionEraseSurvivesKill9(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	now := e.Now()
	m3, m2, m1 := now.Add(-3), now.Add(-2), now.Add(-1)
	retFixture(t, e, m3, "ka", 1, 7500)
	retFixture(t, e, m2, "ka", 7501, 7800)
	retFixture(t, e, m1, "kbb", 1, 300)
	at := m1.Start().Add(time.Hour)
	if _, err := sq.Insert("im_group_messages_"+m1.String()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "content", "created_at", "updated_at").
		Values(999999, "kbb", 1, 301, 6, `{"text":"other"}`, at, at).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	// the fixture's edit revisions keep what the messages said before
	if _, err := sq.Update("im_message_revisions").Set("content", `{"text":"before"}`).RunWith(e.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	e.Activate(now)
	count := func(table string, where sq.Sqlizer) int { return retCount(t, e, table, where) }
	erased := func(m routing.Month) int {
		return count("im_group_messages_"+m.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil})
	}

	id := retStartJob(t, e, "POST", "/v1/admin/users/5/erase")
	state, removed, shardmgr := retKillJob(t, e, id, 1)
	if state != "running" || removed != 5000 || erased(m3) != 5000 || erased(m2) != 0 {
		t.Fatalf("killed mid-erase: state %s, %d messages recorded, %d erased in %s, %d in %s", state, removed, erased(m3), m3, erased(m2), m2)
	}
	sendWaitFor(t, 3*time.Second, "the lease expired", func() bool {
		return count("im_jobs", sq.And{sq.Eq{"job_id": id}, sq.Expr("lease_until < NOW(3)")}) == 1
	})
	shardmgr()
	var j retJob
	sendWaitFor(t, 8*time.Second, "the job done", func() bool {
		j = retGetJob(t, e, id)
		return j.State == "done"
	})
	if j.RowsRemoved != 8100 || j.Report.Months[m3.String()] != 7500 || j.Report.Months[m2.String()] != 300 || j.Report.Months[m1.String()] != 300 {
		t.Fatalf("after the resumed erase: %+v", j)
	}
	for _, c := range []struct {
		table string
		where sq.Sqlizer
		want  int
	}{
		{"im_group_messages_" + m3.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil, "version": 2}, 7500},
		{"im_group_messages_" + m2.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil, "version": 2}, 300},
		{"im_group_messages_" + m1.String(), sq.Eq{"from_user": 5, "status": "deleted", "content": nil, "version": 2}, 300},
		{"im_group_messages_" + m1.String(), sq.Eq{"from_user": 6, "status": "normal"}, 1},
		{"im_message_revisions", sq.NotEq{"content": nil}, 0},
		// one change per topic and batch: ka's 7,500 of one month in two
		// batches, its 300 of the next in one, kbb's in one
		{"im_message_revisions", sq.Eq{"action": "erase"}, 4},
		{"im_change_outbox", sq.Eq{"topic": "ka"}, 3},
		{"im_change_outbox", sq.Eq{"topic": "kbb"}, 1},
	} {
		if n := count(c.table, c.where); n != c.want {
			t.Errorf("%s where %v: %d, want %d", c.table, c.where, n, c.want)
		}
	}
	var events, seqs int
	if err := e.DB.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT topic, JSON_VALUE(event, '$.seq_id')) FROM im_change_outbox").Scan(&events, &seqs); err != nil || events != seqs {
		t.Fatalf("change events: %d for %d messages (%v)", events, seqs, err)
	}
}
