package test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/localsrv"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/robustness"
	"github.com/imshard/imshard/test/testenv"
)

// mdTopics are the topics of each tenant of the deployment test, mdUsers
// the members of each (uids 1..mdUsers).
var mdTopics = []string{"md0", "md1", "md2", "md3"}

const mdUsers = 4

// mdRole is one role process of the deployment, as its unit runs it.
type mdRole struct {
	name    string // the instance, as in imshard@<name>
	roles   string // --roles
	opsAddr string
	apiAddr string // "" for a role without an HTTP API
	p       *faultsProc
}

// mdLoad is one tenant's steady load: senders, an editor and readers
// recording into one history, and what each saw.
type mdLoad struct {
	t      *testing.T
	tenant string
	cl     *rbClient // bases: [the send API, the query API]
	// the first actor id of this tenant's goroutines (actors are unique
	// across the history: walks and follows are keyed by them)
	actor int

	mu   sync.Mutex
	sent []robustness.Msg // acknowledged sends, in answer order
	// back-in-time reads a reader saw: a since cursor or a latest page's
	// top seq lower than one it read before
	back []string
}

// TestMoveDeploySplitRolesUnderLoad moves a tenant, as an operator does,
// while the roles run as the shipped units split them — a send API, a
// query API, persist and the shard manager, each its own process of the
// built executable, with a devkafka process as the broker — under a
// steady send, change and read load on two tenants. The tenant's source is
// a database on the shared MariaDB and its target one on a private
// mariadbd the test starts. `imshard tenant move --yes` runs as its own
// process; then, under the same load, `tenant move reverse --yes` moves it
// back and `finish` drops the copy on the private server.
//
// Every send of both tenants answers 201 and every read 200 (a change may
// answer 409 with retry_after_ms while the tenant's writes are held; it is
// retried); every acknowledged message is on the final server exactly
// once, under the seq it was acknowledged with, each topic's seqs
// contiguous month by month; no reader's since cursor or latest page goes
// back; the robustness checkers find nothing in the recorded history; the
// processes follow each new epoch without a restart, and persist ends
// with no parked event and no dead letter.
func TestMoveDeploySplitRolesUnderLoad(t *testing.T) {
	if _, err := localsrv.LookBin("mariadbd", "mysqld"); err != nil {
		t.Skipf("the test moves a tenant to a private MariaDB server: %v", err)
	}
	t.Parallel()
	begin := time.Now()
	moving, other := testenv.NewTenant(t), testenv.NewTenant(t)
	_, targetDSN := mvStartSecond(t, moving)
	sourceDSN, _ := mvSourceStore(t, moving)
	broker := faultsDevKafka(t)

	// one configuration file for every process, as /etc/imshard/imshard.yaml
	cfg := faultsWriteConfig(t, fmt.Sprintf(`http: {shutdown_grace: 10s}
mysql: {dsn_template: %q}
redis: {addrs: [%q]}
kafka: {brokers: [%q], partitions: 4}
tenants: [{id: %s, jwt_secret: "secret-%s"}, {id: %s, jwt_secret: "secret-%s"}]
shard: {auto_advance: false}
persist: {batch_size: 25, batch_linger: 5ms, retry_backoff: 10ms, retry_backoff_max: 100ms}
log: {level: info, format: json}
limits: {send: {user: {per_second: 0}, topic: {per_second: 0}}, reads: {per_second: 0}, changes: {per_second: 0}}
`, testenv.DSNTemplate(), testenv.RedisAddr(), broker, moving, moving, other, other))
	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"shard", "ensure", "--from", now.String()},
		{"shard", "activate", "--tenant", moving, "--month", now.String()},
		{"shard", "activate", "--tenant", other, "--month", now.String()},
	} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg}, args...)...); code != 0 {
			t.Fatalf("%v: %d\n%s", args, code, out)
		}
	}

	roles := []*mdRole{
		{name: "api", roles: "send"}, {name: "query", roles: "query"}, {name: "persist", roles: "persist"},
		{name: "shardmgr", roles: "shardmgr,migrate"},
	}
	for _, r := range roles {
		r.opsAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		env := []string{"IMSHARD_METRICS_ADDR=" + r.opsAddr}
		if r.roles == "send" || r.roles == "query" {
			r.apiAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			env = append(env, "IMSHARD_HTTP_ADDR="+r.apiAddr)
		}
		r.p = faultsStart(t, env, "serve", "--roles="+r.roles, "--config", cfg)
	}
	for _, r := range roles {
		waitReadyz(t, r.p, r.opsAddr)
	}
	h := &robustness.History{}
	keep := sync.OnceValue(func() string { return mdKeep(t, roles, h) })
	defer func() {
		if t.Failed() {
			keep()
		}
	}()

	loads := []*mdLoad{mdNewLoad(t, h, moving, roles, 0), mdNewLoad(t, h, other, roles, 100)}
	for _, l := range loads {
		l.setUp()
	}
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// the moving tenant at about twice the other's rate
	loads[0].run(ctx, &wg, 4)
	loads[1].run(ctx, &wg, 2)
	loadStopped := false
	stop := func() {
		if !loadStopped {
			loadStopped = true
			stopLoad()
			wg.Wait()
		}
	}
	defer stop()

	src := testenv.OpenDB(t, sourceDSN)
	sendWaitFor(t, 30*time.Second, "sends of the moving tenant stored on the source", func() bool {
		n, _ := mvTopicRows(t, src, mdTopics[0])
		return n >= 50
	})

	// the move, by the operator, as its own process
	mover := func(args ...string) string {
		t.Helper()
		start := time.Now()
		p := faultsStart(t, nil, append([]string{"--config", cfg, "tenant", "move"}, args...)...)
		if err := p.wait(t, 90*time.Second); err != nil {
			t.Fatalf("tenant move %v: %v\n%s", args, err, p.out.String())
		}
		t.Logf("tenant move %v: %v, load %s", args, time.Since(start).Round(time.Millisecond), mdLoadAvg())
		for _, line := range strings.Split(p.out.String(), "\n") {
			if strings.Contains(line, "switch took") {
				t.Log(line)
			}
		}
		return p.out.String()
	}
	out := mover("--tenant="+moving, "--to="+targetDSN, "--yes")
	if !strings.Contains(out, "moved") || !strings.Contains(out, "switch took") {
		t.Fatalf("the move's output names no switch:\n%s", out)
	}
	mdWaitEpoch(t, roles, moving, 1)
	dst := testenv.OpenDB(t, targetDSN)
	before, _ := mvTopicRows(t, dst, mdTopics[0])
	sendWaitFor(t, 30*time.Second, "sends of the moving tenant stored on the target", func() bool {
		n, _ := mvTopicRows(t, dst, mdTopics[0])
		return n >= before+50
	})

	out = mover("reverse", "--tenant="+moving, "--yes")
	if !strings.Contains(out, "switch took") {
		t.Fatalf("the reverse's output names no switch:\n%s", out)
	}
	mdWaitEpoch(t, roles, moving, 2)
	before, _ = mvTopicRows(t, src, mdTopics[0])
	sendWaitFor(t, 30*time.Second, "sends of the moving tenant stored on the source again", func() bool {
		n, _ := mvTopicRows(t, src, mdTopics[0])
		return n >= before+50
	})
	stop()
	if out := mover("finish", "--tenant="+moving); !strings.Contains(out, "dropped") {
		t.Fatalf("finish:\n%s", out)
	}

	// settle: persist stores what it parked, then the final reads
	for _, l := range loads {
		l.settle(time.Minute)
	}
	persist := roles[2]
	sendWaitFor(t, 30*time.Second, "persist holds no parked event", func() bool {
		return opsMetric(t, "http://"+persist.opsAddr, "imshard_persist_parked_events") == 0
	})
	h.Record(robustness.Op{Kind: robustness.Quiesce, Tenant: moving})
	for _, l := range loads {
		l.final()
	}

	ops := h.Ops()
	var sends, reads, changes, held, unstored int
	// the ids a by-id read found: one not found before was not stored yet
	found := map[string]bool{}
	for i := range ops {
		if ops[i].Kind == robustness.ByID && ops[i].Status == 200 {
			found[ops[i].MessageID] = true
		}
	}
	for i := range ops {
		o := &ops[i]
		if o.Kind == robustness.ByID && o.Status == 404 && found[o.MessageID] {
			reads++
			unstored++
			continue
		}
		switch o.Kind {
		case robustness.Send:
			sends++
			if o.Status != 201 {
				t.Errorf("%s: send %s of %s answered %d %s %s", o.Tenant, o.ClientMsgID, o.Topic, o.Status, o.Code, o.Err)
			}
		case robustness.PageSince, robustness.PageBefore, robustness.ByID:
			reads++
			if o.Status != 200 {
				t.Errorf("%s: read %s of %s answered %d %s %s", o.Tenant, o.Kind, o.Topic, o.Status, o.Code, o.Err)
			}
		case robustness.Edit:
			changes++
			if o.Status == 409 && o.RetryAfterMS > 0 {
				held++
			} else if o.Status != 200 {
				t.Errorf("%s: edit of %s/%d answered %d %s %s", o.Tenant, o.Topic, o.Seq, o.Status, o.Code, o.Err)
			}
		}
	}
	elapsed := time.Since(begin)
	t.Logf("%d sends, %d reads (%d by id found once stored), %d edits (%d answered 409 with retry_after_ms) in %v, load %s",
		sends, reads, unstored, changes, held, elapsed.Round(time.Second), mdLoadAvg())
	if vs := robustness.Check(ops); len(vs) > 0 {
		path := filepath.Join(keep(), "history.jsonl")
		for _, c := range robustness.Checkers {
			if i := slices.IndexFunc(vs, func(v robustness.Violation) bool { return v.Checker == c.Name }); i >= 0 {
				t.Errorf("checker %s: %s\nshrunk history:\n%s\nfull history: %s", c.Name, vs[i].Detail,
					robustness.Format(robustness.Shrink(ops, c)), path)
			}
		}
	}
	for _, l := range loads {
		l.mu.Lock()
		for _, b := range l.back {
			t.Errorf("%s: a read went back in time: %s", l.tenant, b)
		}
		l.mu.Unlock()
	}

	// every acknowledged message on its tenant's final server exactly once
	loads[0].checkStored(src)
	loads[1].checkStored(testenv.OpenDB(t, strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", other)))
	if n := opsMetric(t, "http://"+persist.opsAddr, "group_message_dead_letter_total"); n != 0 {
		t.Errorf("persist dead-lettered %v events", n)
	}
	t.Logf("persist batches refused by the fence and retried: %v",
		opsMetric(t, "http://"+persist.opsAddr, "imshard_persist_retries_total", `reason="moved"`))
	// no process was restarted: each one followed the epochs in place
	for _, r := range roles {
		if !r.p.running() {
			t.Errorf("%s exited\n%s", r.name, r.p.out.String())
		}
		if !strings.Contains(r.p.out.String(), "tenant placement changed") {
			t.Errorf("%s never logged that it followed the new placement", r.name)
		}
	}
	for _, r := range roles {
		r.p.signal(t, syscall.SIGTERM)
	}
	for _, r := range roles {
		if err := r.p.wait(t, 30*time.Second); err != nil {
			t.Errorf("%s did not stop cleanly on SIGTERM: %v", r.name, err)
		}
	}
	if elapsed > 4*time.Minute {
		t.Errorf("the test took %v, more than its 4 minutes", elapsed.Round(time.Second))
	}
}

func mdNewLoad(t *testing.T, h *robustness.History, tenant string, roles []*mdRole, actor int) *mdLoad {
	secret := []byte("secret-" + tenant)
	return &mdLoad{t: t, tenant: tenant, actor: actor, cl: &rbClient{t: t, h: h, tenant: tenant, secret: secret,
		bases: []string{"http://" + roles[0].apiAddr, "http://" + roles[1].apiAddr}, tokens: map[string]string{},
		hc: &http.Client{Timeout: rbRequestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}}
}

// The API process a request of the load goes to.
const (
	mdSendAPI  = 0
	mdQueryAPI = 1
)

// setUp creates the tenant's groups with their members.
func (l *mdLoad) setUp() {
	for i, topic := range mdTopics {
		if op := l.cl.group(l.actor, mdSendAPI, topic, int64(i+1), "active"); !op.Acked() {
			l.t.Fatalf("%s: group %s: %d %s", l.tenant, topic, op.Status, op.Err)
		}
		for u := int64(1); u <= mdUsers; u++ {
			if op := l.cl.member(l.actor, mdSendAPI, topic, u, true); !op.Acked() {
				l.t.Fatalf("%s: join %s %d: %d %s", l.tenant, topic, u, op.Status, op.Err)
			}
		}
	}
}

// run starts senders (each about 50 sends/s at most), one editor and
// two readers until ctx ends.
func (l *mdLoad) run(ctx context.Context, wg *sync.WaitGroup, senders int) {
	goes := func(f func(actor int, r *rand.Rand)) {
		l.actor++
		actor := l.actor
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(actor, rand.New(rand.NewPCG(uint64(actor), 0)))
		}()
	}
	for range senders {
		goes(func(actor int, r *rand.Rand) {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ctx.Err() == nil; i++ {
				user, topic := 1+r.Int64N(mdUsers), mdTopics[r.IntN(len(mdTopics))]
				cmid := fmt.Sprintf("a%d-%d", actor, i)
				if op := l.cl.send(actor, mdSendAPI, user, topic, cmid, cmid, nil, false); op.Acked() {
					l.mu.Lock()
					l.sent = append(l.sent, op.Messages[0])
					l.mu.Unlock()
				}
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		})
	}
	goes(func(actor int, r *rand.Rand) { l.editor(ctx, actor, r) })
	for range 2 {
		goes(func(actor int, r *rand.Rand) { l.reader(ctx, actor, r) })
	}
}

// editor edits an acknowledged message now and then, as its sender; a
// 409 with retry_after_ms (the tenant's writes held by a switch, or the
// message not stored yet) is retried after the wait it names.
func (l *mdLoad) editor(ctx context.Context, actor int, r *rand.Rand) {
	versions := map[string]int64{}
	for ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		l.mu.Lock()
		if len(l.sent) == 0 {
			l.mu.Unlock()
			continue
		}
		m := l.sent[r.IntN(len(l.sent))]
		l.mu.Unlock()
		key := fmt.Sprint(m.Topic, "/", m.Seq)
		if versions[key] == 0 {
			versions[key] = m.Version
		}
		for try := 0; try < 40 && ctx.Err() == nil; try++ {
			op := l.cl.edit(actor, mdSendAPI, m.SenderID, m.Topic, m.Seq, versions[key], fmt.Sprintf("edit %d of %s", versions[key], key))
			if op.Acked() {
				versions[key] = op.Messages[0].Version
				break
			}
			if op.Status != 409 || op.RetryAfterMS <= 0 {
				break
			}
			time.Sleep(time.Duration(op.RetryAfterMS) * time.Millisecond)
		}
	}
}

// byID reads message id as user; one not found (persist has not stored it
// yet: a read by id looks in MySQL only) is read again every 200 ms, for
// 20 s at most.
func (l *mdLoad) byID(ctx context.Context, actor int, user int64, id string) {
	for deadline := time.Now().Add(20 * time.Second); ctx.Err() == nil && time.Now().Before(deadline); {
		if op := l.cl.one(actor, mdQueryAPI, user, "", 0, id); op.Status != 404 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mdByIDAfter is how long after a reader saw a message in a page it may
// read it by id: more than persist takes to store it, a switch's pause
// included (the bar is 2 s).
const mdByIDAfter = 5 * time.Second

// mdSeen is a message id a reader saw, and when.
type mdSeen struct {
	id string
	at time.Time
}

// reader follows every topic's since chain from its own cursor, reads the
// latest page and reads by id one message it saw a while ago, as a member
// (again until it is found: see byID); a since
// cursor or a latest page's top seq lower than one it read before is noted
// as a read back in time.
func (l *mdLoad) reader(ctx context.Context, actor int, r *rand.Rand) {
	user := 1 + r.Int64N(mdUsers)
	since, top := map[string]int64{}, map[string]int64{}
	var seen []mdSeen
	for ctx.Err() == nil {
		topic := mdTopics[r.IntN(len(mdTopics))]
		op := l.cl.since(actor, mdQueryAPI, user, topic, since[topic], 50)
		if op.Acked() {
			if op.NextSince < since[topic] {
				l.backInTime(fmt.Sprintf("since %d of %s answered next_since %d", since[topic], topic, op.NextSince))
			}
			since[topic] = max(since[topic], op.NextSince)
		}
		op = l.cl.before(actor, mdQueryAPI, user, topic, 0, 20)
		if op.Acked() && len(op.Messages) > 0 {
			got := op.Messages[0].Seq
			for _, m := range op.Messages {
				got = max(got, m.Seq)
			}
			if got < top[topic] {
				l.backInTime(fmt.Sprintf("the latest page of %s (op %d, %s) topped at %d after %d", topic, op.ID, op.Start.Format("15:04:05.000"), got, top[topic]))
			}
			top[topic] = max(top[topic], got)
			m := op.Messages[r.IntN(len(op.Messages))]
			seen = append(seen, mdSeen{m.MessageID, time.Now()})
		}
		// by id: a message seen mdByIDAfter ago or more (the id is
		// looked up in MySQL: one the hot cache shows, not stored yet,
		// is not found)
		i := 0
		for i < len(seen) && time.Since(seen[i].at) >= mdByIDAfter {
			i++
		}
		if i > 0 {
			l.byID(ctx, actor, user, seen[r.IntN(i)].id)
			seen = seen[i-1:]
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *mdLoad) backInTime(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.back = append(l.back, what)
}

// settle waits (at most d) until every topic's since walk, as the admin,
// reaches the highest acknowledged seq of the topic.
func (l *mdLoad) settle(d time.Duration) {
	top := map[string]int64{}
	l.mu.Lock()
	for _, m := range l.sent {
		top[m.Topic] = max(top[m.Topic], m.Seq)
	}
	l.mu.Unlock()
	sendWaitFor(l.t, d, l.tenant+": every acknowledged send readable", func() bool {
		for _, topic := range mdTopics {
			if l.walk(topic) < top[topic] {
				return false
			}
		}
		return true
	})
}

// walk walks topic's since chain from 0 as the admin and returns where it
// ended (-1 when a page failed).
func (l *mdLoad) walk(topic string) int64 {
	var since int64
	for {
		op := l.cl.since(0, mdQueryAPI, rbAdmin, topic, since, 200)
		if !op.Acked() {
			return -1
		}
		since = max(since, op.NextSince)
		if !op.HasMore {
			return since
		}
	}
}

// final reads the settled state: every topic's whole since walk, as the
// admin and as each member.
func (l *mdLoad) final() {
	for _, topic := range mdTopics {
		l.walk(topic)
		for u := int64(1); u <= mdUsers; u++ {
			var since int64
			for {
				op := l.cl.since(0, mdQueryAPI, u, topic, since, 200)
				if !op.Acked() || !op.HasMore {
					break
				}
				since = op.NextSince
			}
		}
	}
}

// checkStored checks that db holds every acknowledged send of the tenant
// exactly once, under its seq and message id, and nothing else of the
// load's topics; and that each topic's seqs run from 1 without a hole,
// month after month.
func (l *mdLoad) checkStored(db *sql.DB) {
	t := l.t
	type stored struct {
		id    string
		month string
	}
	rows := map[string]map[int64]stored{}
	perMonth := map[string]int{}
	for _, tb := range mvMonthTables(t, db) {
		month := strings.TrimPrefix(tb, "im_group_messages_")
		q, err := db.Query("SELECT topic, seqid, message_id FROM " + tb)
		if err != nil {
			t.Fatal(err)
		}
		for q.Next() {
			var topic, id string
			var seq int64
			if err := q.Scan(&topic, &seq, &id); err != nil {
				t.Fatal(err)
			}
			if rows[topic] == nil {
				rows[topic] = map[int64]stored{}
			}
			if prev, dup := rows[topic][seq]; dup {
				t.Errorf("%s: %s/%d stored twice, in %s and %s", l.tenant, topic, seq, prev.month, month)
			}
			rows[topic][seq] = stored{id, month}
			perMonth[month]++
		}
		if err := q.Err(); err != nil {
			t.Fatal(err)
		}
		q.Close()
	}
	l.mu.Lock()
	sent := slices.Clone(l.sent)
	l.mu.Unlock()
	for _, m := range sent {
		if s, ok := rows[m.Topic][m.Seq]; !ok || s.id != m.MessageID {
			t.Errorf("%s: %s/%d acknowledged as message %s, stored as %q", l.tenant, m.Topic, m.Seq, m.MessageID, s.id)
		}
	}
	total := 0
	for _, topic := range mdTopics {
		total += len(rows[topic])
		// seqs 1..n, and a month's seqs all above the months' before it
		var last string
		for seq := int64(1); seq <= int64(len(rows[topic])); seq++ {
			s, ok := rows[topic][seq]
			if !ok {
				t.Errorf("%s: %s has %d rows but no seq %d", l.tenant, topic, len(rows[topic]), seq)
				break
			}
			if s.month < last {
				t.Errorf("%s: %s/%d is in %s, after a seq in %s", l.tenant, topic, seq, s.month, last)
			}
			last = s.month
		}
	}
	if total != len(sent) {
		t.Errorf("%s: %d rows stored, %d sends acknowledged", l.tenant, total, len(sent))
	}
	t.Logf("%s: %d sends acknowledged, stored once each (per month %v)", l.tenant, len(sent), perMonth)
}

// mdWaitEpoch waits until every role process follows tenant at epoch.
func mdWaitEpoch(t *testing.T, roles []*mdRole, tenant string, epoch int64) {
	t.Helper()
	for _, r := range roles {
		sendWaitFor(t, 15*time.Second, r.name+" follows epoch "+fmt.Sprint(epoch), func() bool {
			return opsMetric(t, "http://"+r.opsAddr, "imshard_tenant_placement_epoch", `tenant="`+tenant+`"`) == float64(epoch)
		})
	}
}

// mdKeep writes every role process's log and the history (JSON lines,
// history.jsonl) to a directory that outlives the test and returns it.
func mdKeep(t *testing.T, roles []*mdRole, h *robustness.History) string {
	dir, err := os.MkdirTemp("", "imshard-movedeploy-")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roles {
		_ = os.WriteFile(filepath.Join(dir, r.name+".log"), []byte(r.p.out.String()), 0o600)
	}
	if f, err := os.Create(filepath.Join(dir, "history.jsonl")); err == nil {
		_ = h.Write(f)
		f.Close()
	}
	t.Logf("the processes' logs: %s", dir)
	return dir
}

// mdLoadAvg is the machine's load average, as uptime shows it.
func mdLoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
