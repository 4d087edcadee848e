package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/testenv"
)

// TestRedisThroughUnixSocket: one "unix:/path" address reaches a Redis on
// this machine through its socket (a private redis-server, never the
// shared one).
func TestRedisThroughUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "rs") // socket paths are short: not t.TempDir
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	testenv.StartRedis(t, "--unixsocket", sock, "--unixsocketperm", "700")
	rdb, err := NewRedis(config.Redis{Addrs: []string{"unix:" + sock}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Do(ctx, rdb.B().Set().Key("k").Value("through the socket").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.Do(ctx, rdb.B().Get().Key("k").Build()).ToString()
	if err != nil || got != "through the socket" {
		t.Fatalf("GET through the socket: %q %v", got, err)
	}
	if _, err := NewRedis(config.Redis{Addrs: []string{"unix:" + filepath.Join(dir, "none.sock")}, DialTimeout: time.Second}); err == nil {
		t.Fatal("a socket nobody listens on connected")
	}
}
