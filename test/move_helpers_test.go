package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/placement"
	"github.com/imshard/imshard/modules/shardmgr"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// mvLive is a live tenant to move: a second server started as its target
// (targetDSN), the service following its placement every 200 ms, the
// placement store, the tenant's placement (at) and database (src) with its
// month tables up to monthsAhead after the current one (months, tables).
type mvLive struct {
	tenant    string
	targetDSN string
	env       *harness.Env
	store     *placement.Store
	at        tenantdb.Placement
	src       *sql.DB
	months    []string
	tables    []string
}

func mvStartLive(t *testing.T, monthsAhead int) mvLive {
	t.Helper()
	l := mvLive{tenant: testenv.NewTenant(t)}
	_, l.targetDSN = mvStartSecond(t, l.tenant)
	l.env = harness.Start(t, harness.Options{Tenant: l.tenant, Mutate: func(c *config.Config) {
		c.MySQL.PlacementPoll = 200 * time.Millisecond
	}})
	l.store = mvStore(t, l.env)
	ctx := context.Background()
	if res := l.env.App.NewShardManager().SyncTenant(ctx, l.tenant, shardmgr.Options{MonthsAhead: monthsAhead}); res.Err != nil {
		t.Fatal(res.Err)
	}
	var err error
	if l.src, err = l.env.App.Pools().DB(ctx, l.tenant); err != nil {
		t.Fatal(err)
	}
	if l.at, err = l.env.App.Pools().Placement(l.tenant); err != nil {
		t.Fatal(err)
	}
	for m, i := l.env.Now(), 0; i <= monthsAhead; m, i = m.Next(), i+1 {
		l.months = append(l.months, m.String())
		l.tables = append(l.tables, "im_group_messages_"+m.String())
	}
	return l
}

// mvStore is the placement store env's processes follow (its
// mysql.placement_dsns, or the default: the shared server's placement
// database); the test's records are removed at cleanup.
func mvStore(t *testing.T, env *harness.Env) *placement.Store {
	t.Helper()
	dsns := env.Config.MySQL.PlacementDSNs
	if len(dsns) == 0 {
		var err error
		if dsns, err = placement.DefaultServers([]string{env.Config.TenantDSN(env.Config.Tenants[0])}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := placement.Open(dsns, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Delete(context.Background(), env.Tenant)
		_ = s.Close()
	})
	return s
}

// mvPlace writes tenant's placement record (every placement server).
func mvPlace(t *testing.T, s *placement.Store, tenant, dsn string, epoch int64) {
	t.Helper()
	if err := s.Write(context.Background(), placement.Record{Tenant: tenant, DSN: dsn, Epoch: epoch}); err != nil {
		t.Fatalf("write placement: %v", err)
	}
}

// mvWaitEpoch waits until env's process follows tenant at epoch.
func mvWaitEpoch(t *testing.T, env *harness.Env, epoch int64) {
	t.Helper()
	sendWaitFor(t, 10*time.Second, "the process follows the new placement", func() bool {
		at, err := env.App.Pools().Placement(env.Tenant)
		return err == nil && at.Epoch == epoch
	})
}

// mvFence is the fence epoch of the database db.
func mvFence(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var e int64
	if err := db.QueryRow("SELECT epoch FROM im_tenant_fence WHERE id = 1").Scan(&e); err != nil {
		t.Fatal(err)
	}
	return e
}

// mvSourceStore is the tenant's DSN on the shared server (where a move
// starts) and the placement records kept beside it; the tenant's record is
// removed when the test ends.
func mvSourceStore(t *testing.T, tenant string) (string, *placement.Store) {
	t.Helper()
	sourceDSN := strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant)
	servers, err := placement.DefaultServers([]string{sourceDSN})
	if err != nil {
		t.Fatal(err)
	}
	store, err := placement.Open(servers, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Delete(context.Background(), tenant); _ = store.Close() })
	return sourceDSN, store
}

// mvStartSecond starts a private MariaDB server and returns it with the
// DSN the tenant's database would have there.
func mvStartSecond(t *testing.T, tenant string) (*testenv.MariaDB, string) {
	t.Helper()
	m := testenv.StartMariaDB(t)
	return m, strings.ReplaceAll(m.DSNTemplate, "{tenant}", tenant)
}

// mvBeginStopped begins the move of tenant to targetDSN with chunks of 20
// rows and runs it until its catch-up step, where it stops and closes:
// copied, neither caught up nor switched. It returns the options, whose
// hook stops any later run there too.
func mvBeginStopped(t *testing.T, ctx context.Context, tenant string, at tenantdb.Placement, targetDSN string, store *placement.Store) move.Options {
	t.Helper()
	stopped := errors.New("stopped")
	o := move.Options{ChunkRows: 20, StepHook: func(step string) error {
		if step == move.StepCatchUp {
			return stopped
		}
		return nil
	}}
	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); !errors.Is(err, stopped) {
		t.Fatalf("run: %v, want it stopped at the catch-up", err)
	}
	m.Close()
	return o
}

// liveTraffic is a user's sends to a group, each followed by a read of
// the latest page when reads is set, every 5 ms from a goroutine while a
// test moves the tenant or archives a month: it keeps the seqs of the
// sends answered 201 (a first time) and counts every other answer as a
// failure.
type liveTraffic struct {
	topic      string
	mu         sync.Mutex
	seqs       []int64
	failed     atomic.Int64
	failure    atomic.Value
	stop, done chan struct{}
	once       sync.Once
}

// mvStartTraffic makes the group topic (rpGroup) and starts rpMember's
// traffic to it (startLiveTraffic).
func mvStartTraffic(t *testing.T, env *harness.Env, topic string, reads bool) *liveTraffic {
	t.Helper()
	rpGroup(t, env, topic)
	return startLiveTraffic(t, env, topic, env.Token(rpMember, ""), reads)
}

// startLiveTraffic starts the traffic of the member whose token is tok to
// group topic; the test's cleanup stops it if the test did not.
func startLiveTraffic(t *testing.T, env *harness.Env, topic, tok string, reads bool) *liveTraffic {
	t.Helper()
	tr := &liveTraffic{topic: topic, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			default:
			}
			code, body := env.Do("POST", "/v1/topics/"+topic+"/messages", tok, map[string]any{
				"client_msg_id": fmt.Sprintf("%s%d", topic, i), "msg_type": "text", "content": map[string]any{"text": fmt.Sprint(i)}})
			var r sendResp
			if code != 201 || json.Unmarshal(body, &r) != nil || r.Duplicate {
				tr.failed.Add(1)
				tr.failure.Store(fmt.Sprintf("send %d: %d %s", i, code, body))
				continue
			}
			tr.mu.Lock()
			tr.seqs = append(tr.seqs, r.Seq)
			tr.mu.Unlock()
			if reads {
				if code, body := env.Do("GET", "/v1/topics/"+topic+"/messages?limit=20", tok, nil); code != 200 {
					tr.failed.Add(1)
					tr.failure.Store(fmt.Sprintf("read: %d %s", code, body))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(tr.halt)
	return tr
}

func (tr *liveTraffic) halt() { tr.once.Do(func() { close(tr.stop); <-tr.done }) }

// sent is how many sends were answered 201 so far.
func (tr *liveTraffic) sent() int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return int64(len(tr.seqs))
}

// sortedSeqs are the seqs of the sends answered 201, in order.
func (tr *liveTraffic) sortedSeqs() []int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := slices.Clone(tr.seqs)
	slices.Sort(out)
	return out
}

// stopClean stops the traffic and fails the test if a send or read failed.
func (tr *liveTraffic) stopClean(t *testing.T) {
	t.Helper()
	tr.halt()
	if n := tr.failed.Load(); n > 0 {
		t.Fatalf("%d sends or reads to %s failed; last: %v", n, tr.topic, tr.failure.Load())
	}
}

// wantStoredOnce waits until db (where the tenant ended) holds as many of
// the topic's rows as sends were answered 201, then, a moment later, wants
// exactly that many, each seq once: every acknowledged send stored once.
func (tr *liveTraffic) wantStoredOnce(t *testing.T, db *sql.DB) {
	t.Helper()
	var rowsN, seqs int64
	count := func() { rowsN, seqs = mvTopicRows(t, db, tr.topic) }
	// a parked tenant's persistence resumes with its backoff, slowly on a
	// loaded machine: wait long, and fail with the counts, not a timeout
	pollUntil(60*time.Second, func() bool { count(); return rowsN >= tr.sent() })
	time.Sleep(300 * time.Millisecond)
	count()
	if rowsN != tr.sent() || seqs != rowsN {
		t.Fatalf("topic %s: %d rows, %d seqs; %d sends answered 201", tr.topic, rowsN, seqs, tr.sent())
	}
}
