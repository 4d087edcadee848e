package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/testenv"
)

// The shipped unit's paths that a test root replaces: nothing else of the
// unit or its environment files is changed.
const (
	unitBinary = "/usr/local/bin/imshard"
	unitEtc    = "/etc/imshard/"
)

// systemdDir is docs/systemd of this checkout.
func systemdDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(filepath.Dir(file)), "docs", "systemd")
}

// shippedUnit is what the tests read of docs/systemd/imshard@.service, as
// systemd reads it.
type shippedUnit struct {
	execStart  []string // argv; ${VAR} is expanded from the environment at start
	execReload []string // argv
	stopAfter  string   // TimeoutStopSec=
	envFile    string   // EnvironmentFile=, with %i
	env        []string // Environment= assignments
}

func readShippedUnit(t *testing.T) shippedUnit {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(systemdDir(), "imshard@.service"))
	if err != nil {
		t.Fatal(err)
	}
	var u shippedUnit
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("unit line without '=': %q", line)
		}
		if section != "[Service]" {
			continue
		}
		switch key {
		case "ExecStart":
			if u.execStart != nil || strings.ContainsAny(val, `"'\`) {
				t.Fatalf("the test reads one ExecStart without quoting, got %q", val)
			}
			u.execStart = strings.Fields(val)
		case "TimeoutStopSec":
			u.stopAfter = val
		case "ExecReload":
			u.execReload = strings.Fields(val)
		case "EnvironmentFile":
			u.envFile = val
		case "Environment":
			if strings.ContainsAny(val, `"' `) {
				t.Fatalf("the test reads one unquoted Environment= assignment per line, got %q", val)
			}
			u.env = append(u.env, val)
		}
	}
	if u.execStart == nil || u.execReload == nil || u.envFile == "" {
		t.Fatalf("unit lacks ExecStart, ExecReload or EnvironmentFile")
	}
	return u
}

// readEnvFile reads KEY=VALUE lines as systemd's EnvironmentFile= does
// (comments and blank lines skipped; the test refuses quoting it would
// have to interpret).
func readEnvFile(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.Contains(line, "=") || strings.ContainsAny(line, `"'\ `) {
			t.Fatalf("%s: the test reads plain KEY=VALUE lines, got %q", path, line)
		}
		out = append(out, line)
	}
	return out
}

var unitVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// unitInstance is one instance of the template as systemd would start it
// on a test root: etc stands for /etc/imshard/ and bin for the binary.
type unitInstance struct {
	name    string   // the instance, as in imshard@<name>
	args    []string // argv, paths substituted, variables expanded
	env     []string // Environment= then the instance's env file
	shipped []string // argv with the shipped paths, variables expanded
	opsAddr string
	apiAddr string
}

// instance writes <etc>/<name>.env from the shipped <role>.env with the
// listen ports set to free ones (the units read them from there), and
// returns the command line and environment the unit gives.
func (u shippedUnit) instance(t *testing.T, etc, bin, name, role string) unitInstance {
	t.Helper()
	in := unitInstance{name: name}
	var lines []string
	for _, kv := range readEnvFile(t, filepath.Join(systemdDir(), role+".env")) {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "IMSHARD_HTTP_ADDR":
			in.apiAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			kv = k + "=" + in.apiAddr
		case "IMSHARD_METRICS_ADDR":
			in.opsAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			kv = k + "=" + in.opsAddr
		}
		lines = append(lines, kv)
	}
	if in.opsAddr == "" {
		t.Fatalf("%s.env gives no IMSHARD_METRICS_ADDR: instances on one VM would share a port", role)
	}
	envPath := strings.ReplaceAll(u.envFile, "%i", name)
	if !strings.HasPrefix(envPath, unitEtc) {
		t.Fatalf("EnvironmentFile=%s is not under %s", u.envFile, unitEtc)
	}
	envPath = filepath.Join(etc, strings.TrimPrefix(envPath, unitEtc))
	if err := os.WriteFile(envPath, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kv := range u.env {
		in.env = append(in.env, strings.ReplaceAll(kv, unitEtc, etc+"/"))
	}
	in.env = append(in.env, readEnvFile(t, envPath)...)
	lookup := map[string]string{}
	for _, kv := range in.env {
		k, v, _ := strings.Cut(kv, "=")
		lookup[k] = v
	}
	for _, a := range u.execStart {
		a = unitVar.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := lookup[unitVar.FindStringSubmatch(m)[1]]
			if !ok {
				t.Fatalf("ExecStart uses %s, which neither Environment= nor %s.env sets", m, role)
			}
			return v
		})
		in.shipped = append(in.shipped, a)
		if a == unitBinary {
			a = bin
		}
		in.args = append(in.args, strings.ReplaceAll(a, unitEtc, etc+"/"))
	}
	if in.args[0] != bin {
		t.Fatalf("ExecStart runs %s, want %s", u.execStart[0], unitBinary)
	}
	return in
}

// start runs the instance as its own process.
func (in unitInstance) start(t *testing.T) *faultsProc {
	t.Helper()
	return faultsStart(t, in.env, in.args[1:]...)
}

// checkRunsShipped proves from /proc that the running process has exactly the
// unit's command line and every line of its env file.
func (in unitInstance) checkRunsShipped(t *testing.T, p *faultsProc, etc string) {
	t.Helper()
	pid := p.cmd.Process.Pid
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	if !slices.Equal(got, in.args) {
		t.Fatalf("%s runs %q, want %q", in.name, got, in.args)
	}
	back := slices.Clone(got)
	for i, a := range back {
		if a == in.args[0] && i == 0 {
			a = unitBinary
		}
		back[i] = strings.ReplaceAll(a, etc+"/", unitEtc)
	}
	if !slices.Equal(back, in.shipped) {
		t.Fatalf("%s: the command line differs from the shipped unit's beyond its paths: %q vs %q", in.name, back, in.shipped)
	}
	raw, err = os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	environ := strings.Split(string(raw), "\x00")
	for _, kv := range in.env {
		if !slices.Contains(environ, kv) {
			t.Fatalf("%s: %s missing from the process environment", in.name, kv)
		}
	}
}

// TestDeploySplitRolesFromShippedUnits deploys imshard as the units in
// docs/systemd do on one VM: two API instances, two persist instances and
// the shard manager as separate processes with their own env files, an
// `imshard devkafka` standing in for Kafka. Clients send through both APIs
// (retrying on the other one, as behind a load balancer) while one persist
// is killed with SIGKILL and restarted (Restart=on-failure), every other
// process is reloaded with SIGHUP, then an API is killed with SIGKILL
// mid-traffic and restarted; finally SIGTERM stops everything. Every acknowledged
// message is stored once, under the seq it was acknowledged with, and no
// client message is stored twice.
func TestDeploySplitRolesFromShippedUnits(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	broker := faultsDevKafka(t)
	bin := imshardBinary(t)
	etc := t.TempDir()
	unit := readShippedUnit(t)

	// The site's files: the shared config and the tenants file the unit names.
	writeEtc := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(etc, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeEtc("imshard.yaml", fmt.Sprintf(`http: {shutdown_delay: 1s, shutdown_grace: 10s}
log: {level: info, format: json}
mysql: {dsn_template: %q}
redis: {addrs: [%q]}
kafka: {brokers: [%q], partitions: 4}
persist: {batch_size: 25, batch_linger: 5ms, retry_backoff: 10ms, retry_backoff_max: 100ms}
`, testenv.DSNTemplate(), testenv.RedisAddr(), broker))
	writeEtc("tenants.yaml", fmt.Sprintf("- {id: %s, jwt_secret: secret-%s}\n", tenant, tenant))

	// Before first traffic, as the operations guide says.
	if code, out := runCLI(t, []string{"IMSHARD_TENANTS_FILE=" + filepath.Join(etc, "tenants.yaml")},
		"--config", filepath.Join(etc, "imshard.yaml"), "shard", "ensure"); code != 0 {
		t.Fatalf("shard ensure: %d\n%s", code, out)
	}

	specs := []struct{ name, role string }{
		{"api", "api"}, {"api-2", "api"}, {"persist", "persist"}, {"persist-2", "persist"}, {"shardmgr", "shardmgr"},
		{"relay", "relay"},
	}
	inst := map[string]unitInstance{}
	procs := map[string]*faultsProc{}
	for _, s := range specs {
		in := unit.instance(t, etc, bin, s.name, s.role)
		inst[s.name], procs[s.name] = in, in.start(t)
	}
	for _, s := range specs {
		waitReadyz(t, procs[s.name], inst[s.name].opsAddr)
		inst[s.name].checkRunsShipped(t, procs[s.name], etc)
	}

	apis := []*faultsAPI{
		faultsClient(t, "http://"+inst["api"].apiAddr, []byte("secret-"+tenant), tenant),
		faultsClient(t, "http://"+inst["api-2"].apiAddr, []byte("secret-"+tenant), tenant),
	}
	topics := []string{"d0", "d1", "d2", "d3"}
	for i, tp := range topics {
		apis[i%2].group(t, tp, int64(i+1), 1, 9)
	}

	const clients, perClient = 8, 50
	var (
		mu    sync.Mutex
		acked = map[string]faultsSent{} // client_msg_id → answer
		wg    sync.WaitGroup
		halfs sync.WaitGroup
		gate  = make(chan struct{})
	)
	halfs.Add(clients)
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := httpapi.Sign([]byte("secret-"+tenant), tenant, int64(c), "", time.Hour)
			if err != nil {
				t.Error(err)
				return
			}
			for i := range perClient {
				if i == perClient/2 {
					halfs.Done()
					<-gate
				}
				topic, cmid := topics[(c+i)%len(topics)], fmt.Sprintf("c%d-%d", c, i)
				body := map[string]any{"client_msg_id": cmid, "msg_type": "text", "content": map[string]any{"text": cmid}}
				for attempt := 0; attempt < 100; attempt++ {
					// alternate APIs by message, and move to the other one on a retry
					code, raw, err := apis[(c+i+attempt)%2].do("POST", "/v1/topics/"+topic+"/messages", tok, body)
					var r struct {
						Seq        int64  `json:"seq"`
						ShardMonth string `json:"shard_month"`
					}
					if err == nil && (code == 201 || code == 200) && json.Unmarshal(raw, &r) == nil {
						mu.Lock()
						if prev, ok := acked[cmid]; ok && prev.seq != r.Seq {
							t.Errorf("%s acknowledged as seq %d and %d", cmid, prev.seq, r.Seq)
						}
						acked[cmid] = faultsSent{topic: topic, seq: r.Seq, month: r.ShardMonth}
						mu.Unlock()
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	sendsDone := make(chan struct{})
	go func() { wg.Wait(); close(sendsDone) }()

	// Half-way: kill one persist outright and let systemd restart it; reload
	// the other. Sends go on meanwhile.
	halfs.Wait()
	db := testenv.OpenDB(t, strings.Replace(testenv.DSNTemplate(), "{tenant}", tenant, 1))
	now, err := routing.NewClock(testenv.Redis(t)).Month(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	months := []routing.Month{now.Prev(), now, now.Next()}
	waitFor(t, time.Minute, func() bool { return persistCount(persistStored(t, db, months...)) > 0 })
	procs["persist"].kill9(t)
	reloaded := []string{"persist-2", "api", "api-2", "shardmgr"}
	for _, name := range reloaded {
		procs[name].signal(t, syscall.SIGHUP)
	}
	close(gate)
	for _, name := range reloaded {
		waitLog(t, procs[name], 1, "configuration reloaded")
	}
	procs["persist"] = inst["persist"].start(t)
	// Three quarters in: an API dies mid-request; its clients retry on the
	// other one, and systemd brings it back.
	waitFor(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= clients*perClient*3/4
	})
	procs["api-2"].kill9(t)
	procs["api-2"] = inst["api-2"].start(t)
	waitReadyz(t, procs["persist"], inst["persist"].opsAddr)
	waitReadyz(t, procs["api-2"], inst["api-2"].opsAddr)

	select {
	case <-sendsDone:
	case <-time.After(2 * time.Minute):
		t.Fatalf("sends did not finish")
	}
	if len(acked) != clients*perClient {
		t.Fatalf("acknowledged %d of %d sends", len(acked), clients*perClient)
	}
	// A persist that died while the group was rebalancing stalls the group
	// for up to the rebalance timeout (25 s), on a loaded machine more.
	stored := persistWaitCountIn(t, db, len(acked), 3*time.Minute, months...)
	for cmid, a := range acked {
		if m, ok := stored[a.topic][a.seq]; !ok || m.String() != a.month {
			t.Fatalf("%s acknowledged as %s/%d in %s, stored in %q", cmid, a.topic, a.seq, a.month, m)
		}
	}
	// The same client message never stored under two seqs.
	for _, m := range months {
		table, err := routing.TableFor(m)
		if err != nil {
			t.Fatal(err)
		}
		var rows, distinct int
		err = db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT from_user, client_msg_id) FROM "+table.Quoted()).Scan(&rows, &distinct)
		if err != nil && !strings.Contains(err.Error(), "1146") {
			t.Fatal(err)
		}
		if rows != distinct {
			t.Fatalf("%s: %d rows but %d distinct client messages", table.Name(), rows, distinct)
		}
	}

	// systemctl stop: SIGTERM to every instance; each drains and exits 0.
	for _, s := range specs {
		procs[s.name].signal(t, syscall.SIGTERM)
	}
	for _, s := range specs {
		p := procs[s.name]
		if err := p.wait(t, 30*time.Second); err != nil {
			t.Fatalf("%s did not stop cleanly on SIGTERM: %v\n%s", s.name, err, p.out.String())
		}
		if !strings.Contains(p.out.String(), "imshard stopped") {
			t.Fatalf("%s: no clean-stop line\n%s", s.name, p.out.String())
		}
	}
}
