package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// The imshard binary, built once per test run for the tests that drive it
// as operators and systemd do: separate processes, signals, exit codes.
var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// imshardBinary builds ./ (the repo root) once and returns the binary path.
func imshardBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "imshard-bin")
		if binErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		binPath = filepath.Join(binDir, "imshard")
		// with the fault tests' hooks (modules/persist/crash_hook.go)
		cmd := exec.Command("go", "build", "-tags", "imshard_testhooks", "-o", binPath, ".")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = &buildError{out: string(out), err: err}
		}
	})
	if binErr != nil {
		t.Fatalf("build imshard: %v", binErr)
	}
	return binPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }
