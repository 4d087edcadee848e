package test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A consumer killed while its JoinGroup waits for a rebalance must leave the
// group within its session timeout, as with Kafka, or the partitions the
// leader hands it are never consumed (persist stalled for good after
// successive kills). devkafka's coordinator drops the JoinGroup answer of
// such a member about half of the time and then never expires it; each
// group here has one such member, so the run holds several independent
// chances of the stall.
func TestDevKafkaDropsAMemberKilledWhileItsJoinWaited(t *testing.T) {
	const groups = 8
	broker := faultsDevKafka(t)
	ctx := context.Background()
	var (
		leaders []*rawMember
		dead    []string
	)
	for i := range groups {
		group := fmt.Sprintf("reap-%d", i)
		x := newRawMember(t, broker, group)
		x.join(ctx) // alone: the leader, holding every partition

		// y's JoinGroup waits: the rebalance it started waits for x
		y := newRawMember(t, broker, group)
		y.id = y.memberID(ctx)
		parked := make(chan struct{})
		go func() {
			defer close(parked)
			_, _ = y.joinRequest(y.id).RequestWith(ctx, y.cl)
		}()
		waitFor(t, 10*time.Second, func() bool { return slices.Contains(x.members(ctx), y.id) })
		y.cl.Close() // killed with its JoinGroup waiting
		<-parked

		// x rejoins: the rebalance completes with y in it, and x, still
		// the leader, gives y half of the partitions
		x.join(ctx)
		leaders = append(leaders, x)
		dead = append(dead, y.id)
		for _, l := range leaders {
			l.heartbeat(ctx) // the groups set up before stay alive meanwhile
		}
	}

	// x heartbeats (and rejoins when told to) as a consumer does; every
	// group must come down to x alone within the session timeout
	deadline := time.Now().Add(3 * rawSessionTimeout)
	for {
		var left []string
		for i, x := range leaders {
			x.heartbeat(ctx)
			if ms := x.members(ctx); slices.Contains(ms, dead[i]) {
				left = append(left, fmt.Sprintf("%s: %v", x.group, ms))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d groups still hold the member killed while its JoinGroup waited, %v after the session timeout began:\n%s",
				len(left), groups, 3*rawSessionTimeout, strings.Join(left, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rawSessionTimeout is the session timeout rawMember joins with (kfake's
// least).
const rawSessionTimeout = 6 * time.Second

// rawMember is a consumer group member speaking the group protocol itself,
// so a test decides when it joins, syncs and dies.
type rawMember struct {
	t     *testing.T
	cl    *kgo.Client
	group string
	id    string
	gen   int32
}

func newRawMember(t *testing.T, broker, group string) *rawMember {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &rawMember{t: t, cl: cl, group: group}
}

func (m *rawMember) joinRequest(id string) *kmsg.JoinGroupRequest {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{"reap"}
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "range", meta.AppendTo(nil)
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.MemberID, req.ProtocolType = m.group, id, "consumer"
	req.SessionTimeoutMillis = int32(rawSessionTimeout / time.Millisecond)
	req.RebalanceTimeoutMillis = int32(2 * rawSessionTimeout / time.Millisecond)
	req.Protocols = append(req.Protocols, p)
	return req
}

// memberID sends the first JoinGroup, which only hands out the member ID.
func (m *rawMember) memberID(ctx context.Context) string {
	m.t.Helper()
	resp, err := m.joinRequest("").RequestWith(ctx, m.cl)
	if err != nil {
		m.t.Fatal(err)
	}
	if !errors.Is(kerr.ErrorForCode(resp.ErrorCode), kerr.MemberIDRequired) {
		m.t.Fatalf("first join of %s: %v, want MEMBER_ID_REQUIRED", m.group, kerr.ErrorForCode(resp.ErrorCode))
	}
	return resp.MemberID
}

// join joins (or rejoins) and, as the leader, gives the partitions 0-3 out
// round-robin, then syncs.
func (m *rawMember) join(ctx context.Context) {
	m.t.Helper()
	if m.id == "" {
		m.id = m.memberID(ctx)
	}
	resp, err := m.joinRequest(m.id).RequestWith(ctx, m.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		m.t.Fatalf("join %s: %v", m.group, err)
	}
	if resp.LeaderID != m.id {
		m.t.Fatalf("join %s: leader %s, want %s", m.group, resp.LeaderID, m.id)
	}
	m.gen = resp.Generation
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = m.group, m.id, m.gen
	for i, member := range resp.Members {
		a := kmsg.NewConsumerMemberAssignment()
		t := kmsg.NewConsumerMemberAssignmentTopic()
		t.Topic = "reap"
		for p := int32(i); p < 4; p += int32(len(resp.Members)) {
			t.Partitions = append(t.Partitions, p)
		}
		a.Topics = append(a.Topics, t)
		ga := kmsg.NewSyncGroupRequestGroupAssignment()
		ga.MemberID, ga.MemberAssignment = member.MemberID, a.AppendTo(nil)
		sync.GroupAssignment = append(sync.GroupAssignment, ga)
	}
	sresp, err := sync.RequestWith(ctx, m.cl)
	if err == nil {
		err = kerr.ErrorForCode(sresp.ErrorCode)
	}
	if err != nil {
		m.t.Fatalf("sync %s: %v", m.group, err)
	}
}

// heartbeat keeps the member in its group, rejoining when a rebalance began.
func (m *rawMember) heartbeat(ctx context.Context) {
	m.t.Helper()
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.MemberID, req.Generation = m.group, m.id, m.gen
	resp, err := req.RequestWith(ctx, m.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	switch {
	case errors.Is(err, kerr.RebalanceInProgress):
		m.join(ctx)
	case err != nil:
		m.t.Fatalf("heartbeat %s: %v", m.group, err)
	}
}

// members lists the member IDs the coordinator holds in the group.
func (m *rawMember) members(ctx context.Context) []string {
	m.t.Helper()
	described, err := kadm.NewClient(m.cl).DescribeGroups(ctx, m.group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		m.t.Fatalf("describe %s: %v", m.group, err)
	}
	var ids []string
	for _, g := range described {
		for _, mem := range g.Members {
			ids = append(ids, mem.MemberID)
		}
	}
	return ids
}
