package app

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/imshard/imshard/config"
)

// DevKafka is the Kafka stand-in that `imshard devkafka` runs for other
// processes to share, with the one duty of a group coordinator that kfake's
// classic groups miss (see reaper).
type DevKafka struct {
	*kfake.Cluster
	r *reaper
}

// StartDevKafka starts the stand-in on addr and its reaper. With k.SASL set
// it accepts only that user, the one the processes sharing it name in their
// own kafka.sasl; without, any local process may produce into it.
func StartDevKafka(k config.Kafka, addr string, log zerolog.Logger) (*DevKafka, error) {
	r := &reaper{log: log, heard: map[string]time.Time{}, groups: map[string]struct{}{}}
	cluster, err := startKafka(k, addr, r.watch)
	if err != nil {
		return nil, err
	}
	k.Brokers = cluster.ListenAddrs()
	conn, err := KafkaOpts(k)
	if err == nil {
		err = r.start(cluster, conn)
	}
	if err != nil {
		cluster.Close()
		return nil, err
	}
	return &DevKafka{Cluster: cluster, r: r}, nil
}

// Close stops the reaper, then the cluster.
func (d *DevKafka) Close() {
	d.r.stop()
	d.Cluster.Close()
}

// reaper removes from their groups the members that died in a rebalance.
//
// A group coordinator must drop a member that stops heartbeating once its
// session timeout has passed. kfake only arms that timer when a JoinGroup or
// SyncGroup answer reaches the member: when the member's connection closed
// while its JoinGroup was parked for a rebalance (a process killed
// mid-rebalance), the answer is dropped — about half of the time, whichever
// of the closed connection and the response buffer kfake's select picks —
// and no timer is armed. Once the leader's SyncGroup makes the group stable
// (which also forgets the members still owing a SyncGroup), such a member
// stays forever, holding the partitions the leader gave it, and nobody
// consumes them. Kafka arms the timer whether or not the answer arrives.
//
// So the reaper decides by what Kafka goes by, the member's silence: when a
// client connection closes, every member that joined on it and sends no
// group request (join, sync, heartbeat, offset commit) within the longest
// session timeout any member asked for is removed with a LeaveGroup on its
// behalf. A live member always speaks within its session timeout — it
// heartbeats, and a member whose old join connection was closed idle sends
// its next JoinGroup on a new one — so only the dead are removed.
type reaper struct {
	log     zerolog.Logger
	cluster *kfake.Cluster
	cl      *kgo.Client // to the cluster itself, for the LeaveGroups
	ctx     context.Context
	cancel  context.CancelFunc

	mu      sync.Mutex
	heard   map[string]time.Time // member ID → last group request of it
	groups  map[string]struct{}  // classic groups that members joined
	session time.Duration        // the longest session timeout any join asked for
}

// reaperKeys are the requests that show a member is alive.
var reaperKeys = []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit}

func (r *reaper) start(cluster *kfake.Cluster, conn []kgo.Opt) error {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return fmt.Errorf("devkafka: reaper client: %w", err)
	}
	r.cluster, r.cl = cluster, cl
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, key := range reaperKeys {
		// observe only: the request goes on to the coordinator
		cluster.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			r.heardFrom(req)
			return nil, nil, false
		})
	}
	return nil
}

func (r *reaper) stop() {
	r.cancel()
	r.cl.Close()
}

func (r *reaper) heardFrom(req kmsg.Request) {
	now := time.Now()
	var member string
	r.mu.Lock()
	defer r.mu.Unlock()
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		r.groups[q.Group] = struct{}{}
		r.session = max(r.session, time.Duration(q.SessionTimeoutMillis)*time.Millisecond)
		member = q.MemberID
	case *kmsg.SyncGroupRequest:
		member = q.MemberID
	case *kmsg.HeartbeatRequest:
		member = q.MemberID
	case *kmsg.OffsetCommitRequest:
		member = q.MemberID
	}
	if member != "" { // a first JoinGroup has no member ID yet
		r.heard[member] = now
	}
}

// watch wraps the cluster's listener so the reaper learns of every closed
// client connection.
func (r *reaper) watch(ln net.Listener) net.Listener {
	return &watchedListener{Listener: ln, closed: r.closed}
}

// closed schedules the check of the members that joined on the connection
// from addr, once the longest session timeout has passed.
func (r *reaper) closed(addr string) {
	at := time.Now()
	r.mu.Lock()
	wait := r.session
	r.mu.Unlock()
	if wait == 0 {
		return // no member has joined yet: none can have joined on it
	}
	time.AfterFunc(wait, func() { r.sweep(addr, at) })
}

// sweep removes the members that joined on the connection from addr and
// were not heard from since it closed at at.
func (r *reaper) sweep(addr string, at time.Time) {
	if r.ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	groups := make([]string, 0, len(r.groups))
	for g := range r.groups {
		groups = append(groups, g)
	}
	r.mu.Unlock()
	for _, g := range groups {
		info := r.cluster.GroupInfo(g)
		if info == nil {
			continue
		}
		for _, m := range info.Members {
			r.mu.Lock()
			silent := m.ClientHost == addr && !r.heard[m.MemberID].After(at)
			r.mu.Unlock()
			if silent {
				r.remove(g, m.MemberID)
			}
		}
	}
}

func (r *reaper) remove(group, member string) {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = member
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(r.ctx, r.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err == nil && len(resp.Members) > 0 {
		err = kerr.ErrorForCode(resp.Members[0].ErrorCode)
	}
	if err != nil {
		if r.ctx.Err() == nil {
			r.log.Warn().Err(err).Str("group", group).Str("member", member).Msg("devkafka: removing a dead group member failed")
		}
		return
	}
	r.mu.Lock()
	delete(r.heard, member)
	r.mu.Unlock()
	r.log.Info().Str("group", group).Str("member", member).
		Msg("devkafka: group member removed: its connection closed and it sent nothing within the session timeout")
}

// watchedListener reports each accepted connection's remote address once
// the connection is closed (by either side: kfake closes it when the
// client's end goes away).
type watchedListener struct {
	net.Listener
	closed func(addr string)
}

func (l *watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, closed: l.closed}, nil
}

type watchedConn struct {
	net.Conn
	once   sync.Once
	closed func(addr string)
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { c.closed(c.RemoteAddr().String()) })
	return c.Conn.Close()
}
