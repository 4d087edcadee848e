package test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/test/testenv"
)

// faultsProc is an imshard process a fault test starts, kills and restarts.
type faultsProc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// faultsStart runs the binary with args and extra env; it is killed on cleanup.
func faultsStart(t *testing.T, env []string, args ...string) *faultsProc {
	t.Helper()
	cmd := exec.Command(imshardBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	p := &faultsProc{cmd: cmd, out: &syncBuffer{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

// kill9 kills the process with SIGKILL and waits for it.
func (p *faultsProc) kill9(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	p.wait(t, 10*time.Second)
}

// wait waits for the process to exit and returns its error.
func (p *faultsProc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(d):
		t.Fatalf("process %v did not exit within %v\n%s", p.cmd.Args, d, p.out.String())
	}
	return nil
}

// faultsDevKafka runs `imshard devkafka` as its own process (log on disk)
// and returns its address.
func faultsDevKafka(t *testing.T) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := faultsStart(t, nil, "devkafka", "--addr="+addr, "--data-dir="+t.TempDir(),
		"--config="+faultsWriteConfig(t, "kafka: {partitions: 4}\n"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("devkafka did not listen on %s\n%s", addr, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func faultsWriteConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "imshard.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// faultsConfig is the config file of separate role processes of one tenant
// sharing one devkafka, the shared Redis and the given MySQL.
func faultsConfig(t *testing.T, tenant, broker, dsnTemplate, extra string) string {
	t.Helper()
	return faultsWriteConfig(t, fmt.Sprintf(`http: {addr: "127.0.0.1:%d", shutdown_grace: 10s}
metrics: {addr: "127.0.0.1:%d"}
mysql: {dsn_template: %q}
redis: {addrs: [%q]}
kafka: {brokers: [%q], partitions: 4}
tenants: [{id: %s, jwt_secret: "secret-%s"}]
shard: {auto_advance: false}
persist: {batch_size: 25, batch_linger: 5ms, retry_backoff: 10ms, retry_backoff_max: 100ms}
log: {level: warn}
%s`, testenv.FreePort(t), testenv.FreePort(t), dsnTemplate, testenv.RedisAddr(), broker, tenant, tenant, extra))
}
