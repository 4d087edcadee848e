//go:build unix

package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/localsrv"
)

const redisReadyTimeout = 30 * time.Second

// portInUse are log lines meaning we lost the race for a "free" port.
var redisPortInUse = []string{"Address already in use", "Could not create server TCP listening socket"}

// RedisServer is a private redis-server on its own port and temp dir, for
// fault tests (stop, kill -9, flush, restart). It never touches the shared
// Redis. Stop, Kill and Start must be called from the test goroutine (they
// may call t.Fatalf).
type RedisServer struct {
	Addr string // 127.0.0.1:port
	Dir  string // its --dir (temp, removed on cleanup)

	t testing.TB
	p *localsrv.Proc
}

// StartRedis starts redis-server --port P --bind 127.0.0.1 --save ""
// --appendonly no --dir TMP plus extraArgs, waits until it answers PING, and
// kills it on cleanup.
func StartRedis(t testing.TB, extraArgs ...string) *RedisServer {
	t.Helper()
	dir := shortTempDir(t)
	return startRedisIn(t, dir, func(int) []string { return extraArgs })
}

// startRedisIn starts a redis-server in dir. extra gets the chosen port and
// returns the additional arguments; a lost race for the port is retried with
// another one.
func startRedisIn(t testing.TB, dir string, extra func(port int) []string) *RedisServer {
	t.Helper()
	bin, err := localsrv.LookBin("redis-server")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s := &RedisServer{Dir: dir, t: t}
	t.Cleanup(func() {
		if s.p != nil {
			if err := s.p.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
				t.Errorf("testenv: %v", err)
			}
		}
	})
	for attempt := 1; ; attempt++ {
		port := FreePort(t)
		args := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--logfile", "",
		}
		args = append(args, extra(port)...)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.p = &localsrv.Proc{Name: "redis-server " + s.Addr, Bin: bin, Args: args, LogPath: filepath.Join(dir, "redis.log")}
		if err := s.p.Start(); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		err := s.waitReady()
		if err == nil {
			return s
		}
		if attempt < localsrv.PortAttempts && s.p.LogContains(redisPortInUse...) {
			_ = s.p.Stop(syscall.SIGKILL, 5*time.Second)
			continue
		}
		t.Fatalf("testenv: %v\nlog %s:\n%s", err, s.p.LogPath, s.p.LogExcerpt())
	}
}

// waitReady waits until the server answers PING.
func (s *RedisServer) waitReady() error {
	deadline := time.Now().Add(redisReadyTimeout)
	var last error
	for {
		pong, err := respDo(s.Addr, time.Second, "PING")
		if err == nil && pong == "PONG" {
			return nil
		}
		last = fmt.Errorf("%v", errOr(err, "reply "+pong))
		select {
		case <-s.p.Exited():
			return fmt.Errorf("%s exited before answering PING", s.p.Name)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer PING after %v: %v", s.p.Name, redisReadyTimeout, last)
		}
	}
}

// Stop shuts the server down with SIGTERM and waits for it to exit.
func (s *RedisServer) Stop() {
	s.t.Helper()
	if err := s.p.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		s.t.Fatalf("testenv: stop: %v", err)
	}
}

// Kill kills the server with SIGKILL and waits for it to exit.
func (s *RedisServer) Kill() {
	s.t.Helper()
	if err := s.p.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		s.t.Fatalf("testenv: kill: %v", err)
	}
}

// Start starts the server again on the same port with the same arguments and
// waits until it answers PING. The server must be stopped.
func (s *RedisServer) Start() {
	s.t.Helper()
	if err := s.p.Start(); err != nil {
		s.t.Fatalf("testenv: restart: %v", err)
	}
	if err := s.waitReady(); err != nil {
		s.t.Fatalf("testenv: restart: %v\nlog %s:\n%s", err, s.p.LogPath, s.p.LogExcerpt())
	}
}

// StartRedisCluster starts n (>= 3) redis-server nodes with cluster mode on
// free loopback ports, spreads the 16384 slots evenly over them (no
// replicas), and waits until every node reports cluster_state:ok and knows
// all nodes and slots. All nodes are killed and their dirs removed on cleanup.
// It returns the node addresses.
func StartRedisCluster(t testing.TB, n int) []string {
	t.Helper()
	if n < 3 {
		t.Fatalf("testenv: StartRedisCluster needs n >= 3, got %d", n)
	}
	root := shortTempDir(t)
	nodes := make([]*RedisServer, n)
	busPorts := make([]int, n)
	addrs := make([]string, n)
	for i := range nodes {
		dir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		nodes[i] = startRedisIn(t, dir, func(int) []string {
			busPorts[i] = FreePort(t)
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-port", strconv.Itoa(busPorts[i]),
				"--cluster-announce-ip", "127.0.0.1",
				"--cluster-node-timeout", "5000",
			}
		})
		addrs[i] = nodes[i].Addr
	}
	fail := func(format string, args ...any) {
		t.Helper()
		var logs strings.Builder
		for _, s := range nodes {
			fmt.Fprintf(&logs, "\nlog %s:\n%s", s.p.LogPath, s.p.LogExcerpt())
		}
		t.Fatalf("testenv: redis cluster: "+format+"%s", append(args, logs.String())...)
	}
	const slots = 16384
	for i, s := range nodes {
		// Distinct config epochs up front, as redis-cli --cluster create does,
		// so that no epoch collision has to be resolved.
		if _, err := respDo(s.Addr, 5*time.Second, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			fail("set config epoch: %v", err)
		}
		lo, hi := i*slots/n, (i+1)*slots/n-1
		args := []string{"CLUSTER", "ADDSLOTS"}
		for slot := lo; slot <= hi; slot++ {
			args = append(args, strconv.Itoa(slot))
		}
		if _, err := respDo(s.Addr, 5*time.Second, args...); err != nil {
			fail("add slots %d-%d to %s: %v", lo, hi, s.Addr, err)
		}
	}
	for i := 1; i < n; i++ {
		_, port, _ := net.SplitHostPort(nodes[i].Addr)
		if _, err := respDo(nodes[0].Addr, 5*time.Second, "CLUSTER", "MEET", "127.0.0.1", port, strconv.Itoa(busPorts[i])); err != nil {
			fail("meet %s: %v", nodes[i].Addr, err)
		}
	}
	want := []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384", "cluster_known_nodes:" + strconv.Itoa(n)}
	deadline := time.Now().Add(redisReadyTimeout)
	for _, s := range nodes {
		for {
			info, err := respDo(s.Addr, 2*time.Second, "CLUSTER", "INFO")
			if err == nil && hasAllLines(info, want) {
				break
			}
			if time.Now().After(deadline) {
				fail("node %s not ready after %v (want %v): %v %s", s.Addr, redisReadyTimeout, want, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return addrs
}

func hasAllLines(info string, want []string) bool {
	have := map[string]bool{}
	for _, l := range strings.Split(info, "\n") {
		have[strings.TrimSpace(l)] = true
	}
	for _, w := range want {
		if !have[w] {
			return false
		}
	}
	return true
}
