package app

import (
	"context"
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

	def := config.Default()
	cfg := &def
	cfg.HTTP.Addr, cfg.Metrics.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.MySQL.DSNTemplate = testenv.DSNTemplate()
	cfg.Redis.Addrs = []string{testenv.RedisAddr()}
	cfg.Tenants = []config.Tenant{{ID: tenant, JWTSecret: "secret-" + tenant}}
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
