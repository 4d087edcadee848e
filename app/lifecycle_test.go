package app

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/testenv"
)

// TestLifecycleReadyThenDrainsWithoutLeaks starts the shard-manager role on
// the real services, checks readiness, shuts down and verifies /readyz
// turned unready first and no goroutine outlived the stop.
func TestLifecycleReadyThenDrainsWithoutLeaks(t *testing.T) {
	tenant := testenv.NewTenant(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	cfg := localConfig(tenant)
	cfg.HTTP.ShutdownGrace = 5 * time.Second

	a := New(cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx, []string{ShardMgr}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for a.Ready(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %v", a.Ready(context.Background()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := a.Ready(context.Background()); err == nil {
		t.Fatal("a stopped app must not report ready")
	}
}

// fakeService is a module whose Run ends on its own (early) or finishes
// some work after its context ends (late), and which records whether Stop
// came before Run returned.
type fakeService struct {
	early      error         // Run returns this at once when set
	returnsNil bool          // Run returns nil at once
	finishing  time.Duration // work Run still does after its context ends
	returned   atomic.Bool
	raced      atomic.Bool // Stop ran while Run was still under way
}

func (f *fakeService) Run(ctx context.Context) error {
	defer f.returned.Store(true)
	if f.early != nil || f.returnsNil {
		return f.early
	}
	<-ctx.Done()
	time.Sleep(f.finishing) // e.g. a lease renewal in flight
	return nil
}

func (f *fakeService) Stop(context.Context) error {
	if !f.returned.Load() {
		f.raced.Store(true)
	}
	return nil
}

func fakeApp(t *testing.T, svcs map[string]*fakeService, order ...string) *App {
	def := config.Default()
	def.HTTP.ShutdownGrace = 10 * time.Second
	a := New(&def, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	for _, name := range order {
		a.services[name] = svcs[name]
	}
	a.order = order
	return a
}

// runFor runs a until it returns, cancelling its context only when cancel
// is true; it gives up (failing the test) after a minute.
func runFor(t *testing.T, a *App, cancel bool) error {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	if cancel {
		stop()
	}
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
		return nil
	}
}

// TestModuleReturningEarlyStopsTheProcess: a module whose Run returns
// before the process is stopping — with an error or with nil — fails Run,
// and every module is stopped after its Run returned.
func TestModuleReturningEarlyStopsTheProcess(t *testing.T) {
	for _, early := range []*fakeService{{returnsNil: true}, {early: errors.New("broken")}} {
		other := &fakeService{finishing: 50 * time.Millisecond}
		a := fakeApp(t, map[string]*fakeService{"steady": other, "early": early}, "steady", "early")
		err := runFor(t, a, false)
		if err == nil || !strings.Contains(err.Error(), "module early failed") {
			t.Fatalf("Run = %v, want the early module's failure", err)
		}
		if other.raced.Load() || !other.returned.Load() {
			t.Fatalf("steady module: raced=%v returned=%v", other.raced.Load(), other.returned.Load())
		}
	}
}

// TestStopWaitsForRun: on shutdown a module's Stop runs only after its Run
// returned, even when Run still finishes work after its context ends.
func TestStopWaitsForRun(t *testing.T) {
	svcs := map[string]*fakeService{"a": {finishing: 100 * time.Millisecond}, "b": {finishing: 100 * time.Millisecond}}
	a := fakeApp(t, svcs, "a", "b")
	if err := runFor(t, a, true); err != nil {
		t.Fatal(err)
	}
	for name, f := range svcs {
		if f.raced.Load() {
			t.Fatalf("module %s was stopped while its Run was still under way", name)
		}
	}
}

// localConfig is the defaults on the shared MySQL and Redis, with tenant
// alone and both listeners on free ports.
func localConfig(tenant string) *config.Config {
	cfg := config.Default()
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.MySQL.DSNTemplate = testenv.DSNTemplate()
	cfg.Redis.Addrs = []string{testenv.RedisAddr()}
	cfg.Tenants = []config.Tenant{{ID: tenant, JWTSecret: "secret-" + tenant}}
	return &cfg
}
