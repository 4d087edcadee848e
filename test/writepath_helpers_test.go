package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// writepathStart runs every role (send → Kafka → persist) for a fresh
// tenant; opts.Roles may narrow it.
func writepathStart(t *testing.T, opts harness.Options) *sendEnv {
	t.Helper()
	if len(opts.Roles) == 0 {
		opts.Roles = []string{app.All}
	}
	mutate := opts.Mutate
	opts.Mutate = func(c *config.Config) {
		c.Persist.RetryBackoff = 10 * time.Millisecond
		c.Persist.RetryBackoffMax = 100 * time.Millisecond
		if mutate != nil {
			mutate(c)
		}
	}
	return startSend(t, opts)
}

// writepathPeer starts another App for e's tenant, Redis, database and Kafka
// (a second node of the same deployment) with the given roles.
func writepathPeer(t *testing.T, e *sendEnv, roles ...string) *sendEnv {
	t.Helper()
	return writepathStart(t, harness.Options{Roles: roles, Tenant: e.Tenant, Brokers: e.Config.Kafka.Brokers})
}

// writepathMembers adds members uids [from, to) to topic directly in MySQL
// (a 10,000-member group through the API would dominate the test's time),
// then re-puts the group so the ACL cache is invalidated.
func writepathMembers(t *testing.T, e *sendEnv, topic string, groupID int64, from, to int64) {
	t.Helper()
	e.group(topic, groupID, "active")
	for lo := from; lo < to; lo += 1000 {
		hi := min(lo+1000, to)
		var sb strings.Builder
		args := make([]any, 0, 2*(hi-lo))
		sb.WriteString("INSERT INTO im_group_members (topic, user_id, role) VALUES ")
		for uid := lo; uid < hi; uid++ {
			if uid > lo {
				sb.WriteByte(',')
			}
			sb.WriteString("(?, ?, 'member')")
			args = append(args, topic, uid)
		}
		if _, err := e.DB.Exec(sb.String(), args...); err != nil {
			t.Fatal(err)
		}
	}
	e.group(topic, groupID, "active")
}

// writepathSent is one accepted send.
type writepathSent struct {
	topic string
	cmid  string
	resp  sendResp
}

// writepathSendMany sends n messages per client from clients concurrent
// members (uids first..first+clients-1) spread over topics; between, if set,
// runs once half of the messages were accepted (e.g. a month switch).
func writepathSendMany(t *testing.T, nodes []*sendEnv, topics []string, first int64, clients, n int, between func()) []writepathSent {
	t.Helper()
	var (
		mu   sync.Mutex
		out  []writepathSent
		wg   sync.WaitGroup
		half sync.WaitGroup
		errs = make(chan string, clients)
	)
	half.Add(clients)
	gate := make(chan struct{})
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := nodes[c%len(nodes)]
			uid := first + int64(c)
			tok := node.Token(uid, "")
			for i := 0; i < n; i++ {
				if i == n/2 {
					half.Done()
					<-gate
				}
				topic := topics[(c*n+i)%len(topics)]
				cmid := fmt.Sprintf("u%d-m%d", uid, i)
				code, r := node.send(tok, topic, sendBody(cmid, cmid))
				if code != 201 {
					errs <- fmt.Sprintf("send %s %s: %d %+v", topic, cmid, code, r)
					return
				}
				mu.Lock()
				out = append(out, writepathSent{topic: topic, cmid: cmid, resp: r})
				mu.Unlock()
			}
		}()
	}
	half.Wait()
	if between != nil {
		between()
	}
	close(gate)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	return out
}

// writepathCheckStored waits until every accepted send is stored, then
// checks each is stored exactly once in the month its answer (= its event)
// named, that per topic the seqs are unique and the month ranges do not
// overlap, and that the mirror and Redis routes agree with the tables.
func writepathCheckStored(t *testing.T, e *sendEnv, sent []writepathSent, months ...routing.Month) map[string]map[int64]routing.Month {
	t.Helper()
	stored := persistWaitCount(t, e.Env, len(sent), 90*time.Second+time.Duration(len(sent))*5*time.Millisecond, months...)
	for _, s := range sent {
		if got := stored[s.topic][s.resp.Seq]; got.String() != s.resp.ShardMonth {
			t.Fatalf("%s seq %d stored in %q, answered month %s", s.topic, s.resp.Seq, got, s.resp.ShardMonth)
		}
	}
	for topic, seqs := range stored {
		hi := map[routing.Month]int64{}
		lo := map[routing.Month]int64{}
		for seq, m := range seqs {
			if v, ok := lo[m]; !ok || seq < v {
				lo[m] = seq
			}
			hi[m] = max(hi[m], seq)
		}
		ms := make([]routing.Month, 0, len(hi))
		for m := range hi {
			ms = append(ms, m)
		}
		for _, a := range ms {
			for _, b := range ms {
				if a.Before(b) && hi[a] >= lo[b] {
					t.Fatalf("%s: month %s range [%d,%d] overlaps %s [%d,%d]", topic, a, lo[a], hi[a], b, lo[b], hi[b])
				}
			}
		}
	}
	persistCheckRoutes(t, e.Env, stored)
	return stored
}

// writepathActive is the node's view of the tenant's active month.
func writepathActive(t *testing.T, e *sendEnv) routing.Month {
	t.Helper()
	m, err := e.App.Allocator().ActiveMonth(context.Background(), e.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
