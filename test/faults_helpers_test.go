package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// faultsProc is an imshard process a fault test starts, kills and restarts.
type faultsProc struct {
	cmd    *exec.Cmd
	out    *testenv.LogBuffer
	exited chan error
}

// faultsStart runs the binary with args and extra env; it is killed on cleanup.
func faultsStart(t *testing.T, env []string, args ...string) *faultsProc {
	t.Helper()
	cmd := exec.Command(imshardBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	p := &faultsProc{cmd: cmd, out: &testenv.LogBuffer{}, exited: make(chan error, 1)}
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

// running reports whether the process has not exited.
func (p *faultsProc) running() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// signal sends sig to the process, as systemctl does (SIGHUP on reload).
func (p *faultsProc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %v: %v", sig, p.cmd.Args, err)
	}
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
	return faultsConfigAt(t, tenant, broker, dsnTemplate, testenv.RedisAddr(), extra)
}

// faultsConfigAt is faultsConfig with the given Redis. The processes run
// without rate limits: their workloads send and read at machine speed.
func faultsConfigAt(t *testing.T, tenant, broker, dsnTemplate, redisAddr, extra string) string {
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
limits: {send: {user: {per_second: 0}, topic: {per_second: 0}}, reads: {per_second: 0}, changes: {per_second: 0}}
%s`, testenv.FreePort(t), testenv.FreePort(t), dsnTemplate, redisAddr, broker, tenant, tenant, extra))
}

// faultsAPI talks to a send process over HTTP, as clients do; every
// answer must be one docs/openapi.yaml describes.
type faultsAPI struct {
	t      *testing.T
	base   string
	secret []byte
	tenant string
	svc    string
	gate   chan struct{}
}

type faultsSent struct {
	topic string
	seq   int64
	month string
}

func faultsClient(t *testing.T, base string, secret []byte, tenant string) *faultsAPI {
	t.Helper()
	c := &faultsAPI{t: t, base: base, secret: secret, tenant: tenant, gate: make(chan struct{})}
	c.svc = c.token(t, 900, "service")
	return c
}

func (c *faultsAPI) token(t *testing.T, uid int64, role string) string {
	tok, err := httpapi.Sign(c.secret, c.tenant, uid, role, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// do sends one request; a nil body sends none.
func (c *faultsAPI) do(method, path, token string, body any) (int, []byte, error) {
	var raw []byte
	var rd io.Reader
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err == nil {
		harness.CheckExchange(c.t, req, raw, resp, out)
	}
	return resp.StatusCode, out, err
}

func (c *faultsAPI) ready() bool {
	code, _, err := c.do("PUT", "/v1/topics/probe", c.svc, map[string]any{"group_id": 999, "status": "active"})
	return err == nil && code == 200
}

// group creates topic's group with members [from, to).
func (c *faultsAPI) group(t *testing.T, topic string, gid, from, to int64) {
	t.Helper()
	if code, out, err := c.do("PUT", "/v1/topics/"+topic, c.svc, map[string]any{"group_id": gid, "status": "active"}); err != nil || code != 200 {
		t.Fatalf("put group %s: %d %s %v", topic, code, out, err)
	}
	for uid := from; uid < to; uid++ {
		if code, out, err := c.do("PUT", fmt.Sprintf("/v1/topics/%s/members/%d", topic, uid), c.svc, map[string]any{"role": "member"}); err != nil || code != 200 {
			t.Fatalf("put member %s/%d: %d %s %v", topic, uid, code, out, err)
		}
	}
}

// sendMany sends perClient messages from each of clients members (uids
// 1..clients) round-robin over topics; at half-way it closes half and
// waits for resume. A send that fails is retried with the same
// client_msg_id until accepted, as a client would.
func (c *faultsAPI) sendMany(topics []string, clients, perClient int, half chan struct{}) []faultsSent {
	var (
		mu     sync.Mutex
		out    []faultsSent
		wg     sync.WaitGroup
		halves sync.WaitGroup
	)
	halves.Add(clients)
	go func() { halves.Wait(); close(half) }()
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := int64(cl + 1)
			tok, err := httpapi.Sign(c.secret, c.tenant, uid, "", time.Hour)
			if err != nil {
				return
			}
			for i := 0; i < perClient; i++ {
				if i == perClient/2 {
					halves.Done()
					<-c.gate
				}
				topic := topics[(cl+i)%len(topics)]
				body := map[string]any{"client_msg_id": fmt.Sprintf("u%d-%d", uid, i), "msg_type": "text",
					"content": map[string]any{"text": "x"}}
				for attempt := 0; attempt < 50; attempt++ {
					code, raw, err := c.do("POST", "/v1/topics/"+topic+"/messages", tok, body)
					var r struct {
						Seq        int64  `json:"seq"`
						ShardMonth string `json:"shard_month"`
					}
					if err == nil && (code == 201 || code == 200) && json.Unmarshal(raw, &r) == nil {
						mu.Lock()
						out = append(out, faultsSent{topic: topic, seq: r.Seq, month: r.ShardMonth})
						mu.Unlock()
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// resume lets sendMany go on past half-way.
func (c *faultsAPI) resume() { close(c.gate) }
