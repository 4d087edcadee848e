package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// TestMigrationPlanShutsTheGateForAProcessStillSeeingNoMigration: a
// process whose copy of the migration state lags behind `plan` (held at
// "none" by the test hook routing.MigrationPinnedEnv, as a copy between
// two refreshes is) has its sends and changes refused by the gate in Redis
// as soon as the plan returned — no waiting in the command or the test —
// so it cannot issue a seq the legacy writers also issue; with the gate
// lost from Redis it is rebuilt from MySQL and still refuses; `start`
// opens it, and the same process's next send gets a seq above the
// topic's cutover_seq.
func TestMigrationPlanShutsTheGateForAProcessStillSeeingNoMigration(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Roles: []string{app.Query}})
	ctx := context.Background()
	now := env.Now()
	env.Activate(now)
	const perTopic = 5 // every legacy topic's cutover_seq
	migLegacy(t, env.DB, now.Add(-migMonths), 2, perTopic)
	migGroups(t, env.DB, 0, 2)

	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := tenantConfig(t, env.Tenant, fmt.Sprintf("http: {addr: %q}\nmetrics: {addr: \"127.0.0.1:%d\"}\nkafka: {data_dir: %q}\nshard: {auto_advance: false}\n",
		api, testenv.FreePort(t), t.TempDir()))
	proc := faultsStart(t, []string{routing.MigrationPinnedEnv + "=1"}, "all", "--config", cfg)
	lag := faultsClient(t, "http://"+api, env.Secret, env.Tenant)
	waitFor(t, 30*time.Second, lag.ready)
	lag.group(t, "gate-own", 77, rpMember, rpMember+1)
	tok := lag.token(t, rpMember, "")
	send := func(topic, id string) (int, int64, string) {
		t.Helper()
		code, body, err := lag.do("POST", "/v1/topics/"+topic+"/messages", tok,
			map[string]any{"client_msg_id": id, "msg_type": "text", "content": map[string]any{"text": id}})
		if err != nil {
			t.Fatalf("send %s: %v\n%s", id, err, proc.out.String())
		}
		var r struct{ Seq int64 }
		_ = json.Unmarshal(body, &r)
		return code, r.Seq, string(body)
	}
	pending := func(what string, code int, body string) {
		t.Helper()
		if code != 503 || !strings.Contains(body, `"migration":"pending"`) || !strings.Contains(body, `"state":"planned"`) {
			t.Fatalf("%s from a process still seeing no migration, after plan: %d %s", what, code, body)
		}
	}

	// the process reads "no migration" with its first send, and keeps it
	code, own, body := send("gate-own", "before-plan")
	if code != 201 {
		t.Fatalf("send before plan: %d %s", code, body)
	}
	mg := env.App.NewMigrator()
	if _, err := mg.Plan(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	code, _, body = send(migTopic(1), "after-plan")
	pending("a send", code, body)
	code, out, err := lag.do("POST", chSeqPath("gate-own", own)+"/recall", tok, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	pending("a recall", code, string(out))

	// Redis lost the gate: rebuilt from MySQL, never taken as open
	keys := env.Keys()
	if err := env.Redis.Do(ctx, env.Redis.B().Del().Key(keys.MigrationGate()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	code, _, body = send(migTopic(1), "after-loss")
	pending("a send with the gate lost", code, body)
	if v, err := env.Redis.Do(ctx, env.Redis.B().Get().Key(keys.MigrationGate()).Build()).ToString(); err != nil || !strings.HasSuffix(v, ":11:planned") {
		t.Fatalf("gate after the rebuild: %q %v", v, err)
	}

	// start opens the gate: the same process sends again, above cutover_seq
	if _, err := mg.Start(ctx, env.Tenant, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	code, seq, body := send(migTopic(1), "after-start")
	if code != 201 || seq != perTopic+1 {
		t.Fatalf("send after start: %d %s, want seq %d", code, body, perTopic+1)
	}
}
