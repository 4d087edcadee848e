package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/migrate"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// Migration from the legacy single table (docs/migration.md): helpers.

const (
	migTopics   = 500
	migPerTopic = 400 // 200,000 legacy rows
	migMonths   = 6
	migGroup    = 4242
)

func migTopic(i int) string { return fmt.Sprintf("legacy-%03d", i) }

// migFixture is the legacy table of the acceptance test: topics "legacy-NNN".
func migFixture(first routing.Month, topics, perTopic int) bench.LegacyFixture {
	return bench.LegacyFixture{First: first, Months: migMonths, Topics: topics, PerTopic: perTopic, Prefix: "legacy-", Width: 3, GroupID: migGroup}
}

// migLegacy creates and fills the legacy table (bench.FillLegacy); topic
// 0's row of seq 10 is then created one month "late" (its created_at is in
// the month after its neighbours'): clock skew the split must keep
// contiguous.
func migLegacy(t *testing.T, db *sql.DB, first routing.Month, topics, perTopic int) {
	t.Helper()
	ctx := context.Background()
	if err := bench.FillLegacy(ctx, db, migFixture(first, topics, perTopic)); err != nil {
		t.Fatalf("legacy fixture: %v", err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE im_group_messages SET created_at = TIMESTAMPADD(MONTH, 1, created_at) WHERE topic = ? AND seqid = 10", migTopic(0)); err != nil {
		t.Fatal(err)
	}
}

// migGroups gives topics lo..hi-1 a group with rpMember and rpOther.
func migGroups(t *testing.T, db *sql.DB, lo, hi int) {
	t.Helper()
	g := sq.Insert("im_groups").Columns("topic", "group_id", "name", "status")
	m := sq.Insert("im_group_members").Columns("topic", "user_id", "role")
	for i := lo; i < hi; i++ {
		g = g.Values(migTopic(i), migGroup, migTopic(i), "active")
		m = m.Values(migTopic(i), rpMember, "member").Values(migTopic(i), rpOther, "member")
	}
	for _, b := range []sq.InsertBuilder{g, m} {
		if _, err := b.RunWith(db).Exec(); err != nil {
			t.Fatal(err)
		}
	}
}

// migCLI runs `imshard migrate ARGS --tenant=T` against the config.
func migCLI(t *testing.T, cfg, tenant string, args ...string) (int, string) {
	t.Helper()
	return runCLI(t, nil, append([]string{"--config", cfg, "migrate"}, append(args, "--tenant="+tenant)...)...)
}

func migState(t *testing.T, db *sql.DB) routing.Migration {
	t.Helper()
	m, err := routing.LoadMigration(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// migWait polls the migration until ok or the deadline.
func migWait(t *testing.T, db *sql.DB, what string, d time.Duration, ok func(routing.Migration) bool, out func() string) routing.Migration {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		m := migState(t, db)
		if ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("migration did not reach %q within %v: %+v\n%s", what, d, m, out())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// migHistory pages topic newest first from below cutover+1 down to the
// start and returns every message as JSON: the pages of seqs <= cutover.
func migHistory(t testing.TB, env *harness.Env, topic string, cutover int64) []string {
	t.Helper()
	var out []string
	q := url.Values{"limit": {"50"}, "before": {strconv.FormatInt(cutover+1, 10)}}
	for pages := 0; pages < 1000; pages++ {
		p := rpList(t, env, rpMember, topic, q)
		for _, m := range p.Messages {
			raw, _ := json.Marshal(m)
			out = append(out, string(raw))
		}
		if !p.HasMore || p.NextBefore == nil {
			return out
		}
		q.Set("before", strconv.FormatInt(*p.NextBefore, 10))
	}
	t.Fatal("history walk does not end")
	return nil
}

// migDuplicateSeqs counts (topic, seq) pairs stored more than once across
// every month table.
func migDuplicateSeqs(t *testing.T, env *harness.Env) int {
	t.Helper()
	shards, err := env.App.Catalog().List(context.Background(), env.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, s := range shards {
		parts = append(parts, "SELECT topic, seqid FROM "+s.Table.Quoted())
	}
	var n int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM (SELECT topic, seqid FROM (" + strings.Join(parts, " UNION ALL ") +
		") AS a GROUP BY topic, seqid HAVING COUNT(*) > 1) AS d").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAcceptance12_MigrationDualReadPauseKillResume: acceptance item 12 on 200,000 legacy rows over
// six months and 500 topics: reads go on throughout (pages of seqs up to
// cutover_seq identical before, during and after), sends are refused until
// cutover and go on after it, the backfill is paused and resumed, its
// process is killed with SIGKILL and a new one resumes from the last
// committed batch, verification passes, no seq is stored twice, and a
// corrupted row makes verification fail and finish refuse.
func TestAcceptance12_MigrationDualReadPauseKillResume(t *testing.T) {
	t.Parallel()
	start := time.Now()
	env := harness.Start(t, harness.Options{Roles: []string{app.Send, app.Query, app.Persist}})
	ctx := context.Background()
	now := env.Now()
	env.Activate(now) // the legacy rows are history: the tenant writes the current month
	first := now.Add(-migMonths)
	migLegacy(t, env.DB, first, migTopics, migPerTopic)
	migGroups(t, env.DB, 1, migTopics) // topic 0 still lacks its group
	t.Logf("fixture ready after %v", time.Since(start).Round(time.Millisecond))
	cfg := tenantConfig(t, env.Tenant, "shard: {auto_advance: false, lock_ttl: 2s}\nmigrate: {batch_size: 1000}\n")

	// start without a plan refuses and changes nothing
	if code, out := migCLI(t, cfg, env.Tenant, "start", "--yes"); code == 0 || !strings.Contains(out, "needs a plan") {
		t.Fatalf("start without plan: exit %d\n%s", code, out)
	}
	if s := migState(t, env.DB).State; s != routing.MigrationNone {
		t.Fatalf("state after refused start: %s", s)
	}
	code, out := migCLI(t, cfg, env.Tenant, "plan")
	if code != 0 || !strings.Contains(out, "200000 rows") || !strings.Contains(out, migTopic(0)) {
		t.Fatalf("plan: exit %d\n%s", code, out)
	}
	for i := 0; i < migMonths; i++ {
		if !strings.Contains(out, first.Add(i).String()) {
			t.Fatalf("plan does not report month %s:\n%s", first.Add(i), out)
		}
	}
	// planned: dual reads, no sends, no changes
	tok := env.Token(rpMember, "")
	sendBody := func(i int) map[string]any {
		return map[string]any{"client_msg_id": "after-" + strconv.Itoa(i), "msg_type": "text", "content": map[string]any{"text": "new"}}
	}
	code, body := env.Do("POST", "/v1/topics/"+migTopic(1)+"/messages", tok, sendBody(0))
	if code != 503 || !strings.Contains(string(body), `"migration":"pending"`) {
		t.Fatalf("send while planned: %d %s", code, body)
	}
	code, body = env.Do("POST", chSeqPath(migTopic(1), 5)+"/recall", tok, map[string]any{})
	if code != 503 || !strings.Contains(string(body), `"migration":"pending"`) {
		t.Fatalf("recall while planned: %d %s", code, body)
	}
	// start refuses while a topic lacks its group
	if code, out := migCLI(t, cfg, env.Tenant, "start", "--yes"); code == 0 || !strings.Contains(out, migTopic(0)) {
		t.Fatalf("start with a topic lacking its group: exit %d\n%s", code, out)
	}
	migGroups(t, env.DB, 0, 1)

	sample := []string{migTopic(0), migTopic(1), migTopic(250), migTopic(499)}
	cutover := int64(migPerTopic)
	before := map[string][]string{}
	for _, topic := range sample {
		before[topic] = migHistory(t, env, topic, cutover)
		if len(before[topic]) != migPerTopic {
			t.Fatalf("dual read before cutover: %s has %d visible rows", topic, len(before[topic]))
		}
	}

	code, out = migCLI(t, cfg, env.Tenant, "start", "--yes")
	if code != 0 || !strings.Contains(out, "writes open") {
		t.Fatalf("start: exit %d\n%s", code, out)
	}
	if seq, err := routing.CutoverSeq(ctx, env.DB, migTopic(7)); err != nil || seq != cutover {
		t.Fatalf("cutover_seq of %s: %d %v", migTopic(7), seq, err)
	}
	if hi, err := env.App.Allocator().ReservedHi(ctx, env.Tenant, migTopic(7)); err != nil || hi < cutover {
		t.Fatalf("reservation of %s: %d %v, want >= %d", migTopic(7), hi, err, cutover)
	}

	// reads and sends go on throughout the backfill
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent sync.Map // topic → []int64
	var reads, readFails atomic.Int64
	var sendErr atomic.Value
	wg.Add(2)
	go func() {
		defer wg.Done()
		opened := false // this process has seen the writes open
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			topic := sample[i%len(sample)]
			code, body := env.Do("POST", "/v1/topics/"+topic+"/messages", tok, sendBody(i))
			switch {
			case code == 201:
				opened = true
				var r struct{ Seq int64 }
				_ = json.Unmarshal(body, &r)
				v, _ := sent.LoadOrStore(topic, &[]int64{})
				*v.(*[]int64) = append(*v.(*[]int64), r.Seq)
			case code == 503 && strings.Contains(string(body), "pending") && !opened:
				// until its state cache refreshes, a process still sees "cutover"
			default:
				sendErr.Store(fmt.Sprintf("send %d: %d %s", i, code, body))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			topic := sample[i%len(sample)]
			got := migHistory(t, env, topic, cutover)
			reads.Add(1)
			if !slices.Equal(got, before[topic]) {
				readFails.Add(1)
				t.Errorf("history of %s during the backfill differs from before cutover (%d vs %d rows)", topic, len(got), len(before[topic]))
				return
			}
		}
	}()

	mcfg := faultsWriteConfig(t, fmt.Sprintf(`mysql: {dsn_template: %q}
redis: {addrs: [%q]}
tenants: [{id: %s, jwt_secret: "secret-%s"}]
metrics: {addr: "127.0.0.1:%d"}
shard: {auto_advance: false, lock_ttl: 2s}
migrate: {batch_size: 1000}
log: {level: warn}
`, testenv.DSNTemplate(), testenv.RedisAddr(), env.Tenant, env.Tenant, testenv.FreePort(t)))
	proc := faultsStart(t, nil, "serve", "--roles=migrate", "--config="+mcfg)
	total := int64(migTopics * migPerTopic)
	migWait(t, env.DB, "30% copied", 60*time.Second, func(m routing.Migration) bool { return m.RowsRead >= total*3/10 }, proc.out.String)

	// pause: the backfill stops after its current batch
	if code, out := migCLI(t, cfg, env.Tenant, "pause"); code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: exit %d\n%s", code, out)
	}
	time.Sleep(300 * time.Millisecond)
	held := migState(t, env.DB).RowsRead
	time.Sleep(1500 * time.Millisecond)
	if m := migState(t, env.DB); m.RowsRead != held || m.State != routing.MigrationPaused {
		t.Fatalf("paused backfill went on: %d → %d rows, state %s", held, m.RowsRead, m.State)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "resume"); code != 0 || !strings.Contains(out, "backfilling") {
		t.Fatalf("resume: exit %d\n%s", code, out)
	}
	migWait(t, env.DB, "60% copied", 60*time.Second, func(m routing.Migration) bool { return m.RowsRead >= total*6/10 }, proc.out.String)

	// SIGKILL the backfill; a new process resumes after the lock lapses
	proc.kill9(t)
	killed := migState(t, env.DB)
	proc = faultsStart(t, nil, "serve", "--roles=migrate", "--config="+mcfg)
	done := migWait(t, env.DB, "done", 120*time.Second, func(m routing.Migration) bool {
		return m.State == routing.MigrationDone || m.State == routing.MigrationVerifying && !m.VerifyPending
	}, proc.out.String)
	if done.State != routing.MigrationDone {
		diffs, _ := routing.LoadMigrationDiffs(ctx, env.DB, 10)
		t.Fatalf("verification did not pass: %+v\n%+v", done, diffs)
	}
	if done.RowsRead != total || done.RowsInserted != total || done.RowsPresent != 0 {
		t.Fatalf("after kill at cursor %d: read %d inserted %d present %d, want %d read, all inserted once",
			killed.CursorID, done.RowsRead, done.RowsInserted, done.RowsPresent, total)
	}
	// seq 10 of topic 0 moved its month's start: the 10th to the last row of
	// the first month's range go to the second month
	if want := int64(migPerTopic/migMonths - 10); done.RowsSkewed != want {
		t.Fatalf("skewed rows %d, want %d", done.RowsSkewed, want)
	}
	t.Logf("backfill of %d rows: opened %s, backfilled %s, verified %s", total, done.OpenedAt.Time.Format("15:04:05.000"),
		done.BackfilledAt.Time.Format("15:04:05.000"), done.VerifiedAt.Time.Format("15:04:05.000"))
	close(stop)
	wg.Wait()
	if v := sendErr.Load(); v != nil {
		t.Fatal(v)
	}
	if reads.Load() == 0 || readFails.Load() > 0 {
		t.Fatalf("reads during the backfill: %d, failed %d", reads.Load(), readFails.Load())
	}
	var sends int
	sent.Range(func(k, v any) bool {
		seqs := *v.(*[]int64)
		sends += len(seqs)
		for _, s := range seqs {
			if s <= cutover {
				t.Errorf("%s: seq %d sent after cutover is not above cutover_seq %d", k, s, cutover)
			}
		}
		return true
	})
	if sends == 0 {
		t.Fatal("no send succeeded after cutover")
	}
	for _, topic := range sample {
		if got := migHistory(t, env, topic, cutover); !slices.Equal(got, before[topic]) {
			t.Fatalf("history of %s after the backfill differs", topic)
		}
	}
	// the skewed row stays in its seq range's month: topic 0's month ranges are contiguous
	mirror, err := routing.LoadMirror(ctx, env.DB, migTopic(0))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(mirror); i++ {
		if mirror[i].MinSeq <= mirror[i-1].MaxSeq {
			t.Fatalf("topic 0's month ranges overlap: %+v", mirror)
		}
	}

	// the backfill indexed the copied messages' mentions (the fixture
	// mentions users 100 and 101 in every 13th message and everyone in
	// every 29th; every 97th is recalled)
	for _, topic := range []string{migTopic(0), migTopic(1)} {
		var want []string
		for i := 1; i <= migPerTopic; i++ {
			if i%97 == 0 {
				continue
			}
			if i%29 == 0 {
				want = append(want, fmt.Sprintf("0/%d", i))
			}
			if i%13 == 0 {
				want = append(want, fmt.Sprintf("100/%d", i), fmt.Sprintf("101/%d", i))
			}
		}
		slices.Sort(want)
		var got []string
		rows, err := env.DB.QueryContext(ctx, "SELECT user_id, seq FROM im_topic_mentions WHERE topic = ? AND seq <= ?", topic, migPerTopic)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var u, seq int64
			if err := rows.Scan(&u, &seq); err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("%d/%d", u, seq))
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("mention index of %s after the backfill: %d entries, want %d", topic, len(got), len(want))
		}
	}

	// a corrupted row: verification fails, finish refuses
	tbl, _, err := env.App.Catalog().Table(ctx, env.Tenant, first.Add(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.ExecContext(ctx, "UPDATE "+tbl.Quoted()+" SET content = JSON_OBJECT('text', 'corrupted') WHERE topic = ? AND seqid = ?",
		migTopic(3), 2*migPerTopic/migMonths+5); err != nil {
		t.Fatal(err)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "verify"); code != 0 {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	failed := migWait(t, env.DB, "verification failed", 60*time.Second, func(m routing.Migration) bool {
		return m.State == routing.MigrationVerifying && !m.VerifyPending && m.VerifyDiffs > 0
	}, proc.out.String)
	if failed.VerifyDiffs != 1 {
		t.Fatalf("differences %d, want 1", failed.VerifyDiffs)
	}
	code, out = migCLI(t, cfg, env.Tenant, "status")
	if code != 0 || !strings.Contains(out, "topic "+migTopic(3)+" month "+first.Add(2).String()) {
		t.Fatalf("status does not list the difference: exit %d\n%s", code, out)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "finish"); code == 0 || !strings.Contains(out, "differences") {
		t.Fatalf("finish with a difference: exit %d\n%s", code, out)
	}
	if ok, _ := routing.LegacyExists(ctx, env.DB); !ok {
		t.Fatal("a refused finish renamed the legacy table")
	}
	// repaired, verified, finished
	if _, err := env.DB.ExecContext(ctx, "UPDATE "+tbl.Quoted()+" AS m JOIN im_group_messages AS l ON l.message_id = m.message_id SET m.content = l.content WHERE m.topic = ?",
		migTopic(3)); err != nil {
		t.Fatal(err)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "verify"); code != 0 {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	migWait(t, env.DB, "done again", 60*time.Second, func(m routing.Migration) bool { return m.State == routing.MigrationDone }, proc.out.String)
	if code, out := migCLI(t, cfg, env.Tenant, "finish"); code != 0 || !strings.Contains(out, "finished") {
		t.Fatalf("finish: exit %d\n%s", code, out)
	}
	if ok, _ := routing.LegacyExists(ctx, env.DB); ok {
		t.Fatal("finish left the legacy table under its name")
	}
	time.Sleep(2 * routing.MigrationRefresh)
	for _, topic := range sample {
		if got := migHistory(t, env, topic, cutover); !slices.Equal(got, before[topic]) {
			t.Fatalf("history of %s after finish (month tables only) differs", topic)
		}
	}
	if n := migDuplicateSeqs(t, env); n != 0 {
		t.Fatalf("%d seqs are stored twice", n)
	}
	// after finish, changes are allowed again
	code, body = env.Do("POST", chSeqPath(migTopic(1), 5)+"/recall", env.Token(rpMember, "service"), map[string]any{})
	if code != 200 {
		t.Fatalf("recall after finish: %d %s", code, body)
	}
	t.Logf("migration acceptance took %v", time.Since(start).Round(time.Millisecond))
}

// TestMigrationRefusals: a legacy table of another schema is refused with
// its columns listed, abort is refused after cutover, and a second
// migrate module does not run a tenant whose lock another one holds.
func TestMigrationRefusals(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Roles: []string{app.Send, app.Query}})
	ctx := context.Background()
	cfg := tenantConfig(t, env.Tenant, "")
	if _, err := env.DB.ExecContext(ctx, "CREATE TABLE im_group_messages (message_id BIGINT PRIMARY KEY, topic VARCHAR(64), seq BIGINT, body TEXT)"); err != nil {
		t.Fatal(err)
	}
	code, out := migCLI(t, cfg, env.Tenant, "plan")
	if code == 0 || !strings.Contains(out, "missing columns: group_id bigint, seqid bigint") || !strings.Contains(out, "unexpected columns: seq, body") {
		t.Fatalf("plan on a legacy table of another schema: exit %d\n%s", code, out)
	}
	if s := migState(t, env.DB).State; s != routing.MigrationNone {
		t.Fatalf("refused plan left state %s", s)
	}
	if _, err := env.DB.ExecContext(ctx, "DROP TABLE im_group_messages"); err != nil {
		t.Fatal(err)
	}
	env.Activate(env.Now())
	migLegacy(t, env.DB, env.Now().Add(-migMonths), 3, 12)
	migGroups(t, env.DB, 0, 3)
	if code, out := migCLI(t, cfg, env.Tenant, "plan"); code != 0 {
		t.Fatalf("plan: exit %d\n%s", code, out)
	}
	// abort before cutover: the tenant is served as before
	if code, out := migCLI(t, cfg, env.Tenant, "abort"); code != 0 || !strings.Contains(out, "none") {
		t.Fatalf("abort: exit %d\n%s", code, out)
	}
	code, body := env.Do("POST", "/v1/topics/"+migTopic(1)+"/messages", env.Token(rpMember, ""),
		map[string]any{"client_msg_id": "x", "msg_type": "text", "content": map[string]any{"text": "x"}})
	if code != 201 {
		t.Fatalf("send after abort: %d %s", code, body)
	}
	// a send after abort took seq 1 of topic 1, which the legacy rows hold too:
	// start a fresh plan on the other topics only
	if _, err := env.DB.ExecContext(ctx, "DELETE FROM im_group_messages WHERE topic = ?", migTopic(1)); err != nil {
		t.Fatal(err)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "plan"); code != 0 {
		t.Fatalf("plan again: exit %d\n%s", code, out)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "start", "--yes"); code != 0 {
		t.Fatalf("start: exit %d\n%s", code, out)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "abort"); code == 0 || !strings.Contains(out, "planned") {
		t.Fatalf("abort after cutover: exit %d\n%s", code, out)
	}
	// the admin route shows the token's own tenant only
	var mig struct {
		Tenant, State string
		LegacyRows    int64 `json:"legacy_rows"`
	}
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/migrations", &mig); code != 200 || mig.Tenant != env.Tenant ||
		mig.State != "backfilling" || mig.LegacyRows != 2*12 {
		t.Fatalf("admin migrations: %d %+v", code, mig)
	}
	if code := rpGet(t, env, rpMember, "", "/v1/admin/migrations", nil); code != 403 {
		t.Fatalf("admin migrations as a member: %d", code)
	}
	other := harness.Start(t, harness.Options{Roles: []string{app.Query}})
	if code := rpGet(t, other, rpAdmin, "admin", "/v1/admin/migrations", &mig); code != 200 || mig.Tenant != other.Tenant || mig.State != "none" {
		t.Fatalf("another tenant's admin: %d %+v", code, mig)
	}
	if code, out := migCLI(t, cfg, env.Tenant, "finish"); code == 0 || !strings.Contains(out, "state done") {
		t.Fatalf("finish before verification: exit %d\n%s", code, out)
	}
	// two backfills of one tenant at once: the lock holder runs, the other waits
	keys := env.Keys()
	lock, err := routing.AcquireLock(ctx, env.Redis, env.App.Scripts(), keys.MigrateLock(), 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	mg := env.App.NewMigrator()
	time.Sleep(2 * routing.MigrationRefresh)
	if err := mg.Tick(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if m := migState(t, env.DB); m.RowsRead != 0 {
		t.Fatalf("a second backfill ran while another held the lock: %+v", m)
	}
	_ = lock.Release(ctx)
	if err := mg.Tick(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	m := migState(t, env.DB)
	if m.State != routing.MigrationDone || m.RowsInserted != 2*12 {
		diffs, _ := routing.LoadMigrationDiffs(ctx, env.DB, 0)
		t.Fatalf("after the lock was free: %+v %+v", m, diffs)
	}
	// running the copy again is harmless: every row is already present
	if _, err := migrate.Differences(ctx, env.DB, env.App.Catalog(), env.Tenant); err != nil {
		t.Fatal(err)
	}
}
