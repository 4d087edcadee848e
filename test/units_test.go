package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
)

// maxExposure is the highest `systemd-analyze security` exposure a shipped
// unit may have (0 = fully sandboxed, 10 = not at all).
const maxExposure = 2.0

var exposureLine = regexp.MustCompile(`Overall exposure level for (\S+): ([0-9.]+)`)

// TestShippedUnitsVerifyAndAreSandboxed checks that the unit's stop timeout
// outlasts the default drain, then docs/systemd with systemd's own tools on a temporary root holding the unit, a built binary where
// ExecStart expects it and the env files: `systemd-analyze verify` must
// report nothing for an instance of every env file, and `systemd-analyze
// security` must score each at most maxExposure.
func TestShippedUnitsVerifyAndAreSandboxed(t *testing.T) {
	t.Parallel()
	unit := readShippedUnit(t)
	def := config.Default()
	stop, err := time.ParseDuration(unit.stopAfter + "s")
	if err != nil || stop <= def.HTTP.ShutdownDelay+def.HTTP.ShutdownGrace {
		t.Fatalf("TimeoutStopSec=%s must be a number of seconds above http.shutdown_delay + http.shutdown_grace (%v)",
			unit.stopAfter, def.HTTP.ShutdownDelay+def.HTTP.ShutdownGrace)
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed and test/services.sh could not install it (apt-get install systemd): the units in docs/systemd were NOT verified")
	}
	root := t.TempDir()
	mkdir := func(dir string) string {
		t.Helper()
		p := filepath.Join(root, dir)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cp := func(src, dst string) {
		t.Helper()
		if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp %s %s: %v\n%s", src, dst, err, out)
		}
	}
	// systemd's own units (the targets the unit orders itself after) and
	// the tools the unit runs.
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(hostUnits); err != nil {
		hostUnits = "/lib/systemd/system"
	}
	cp(hostUnits, mkdir("usr/lib/systemd"))
	unitDir := mkdir("etc/systemd/system")
	cp(filepath.Join(systemdDir(), "imshard@.service"), unitDir)
	binDir := mkdir(strings.TrimPrefix(filepath.Dir(unitBinary), "/"))
	cp(imshardBinary(t), filepath.Join(binDir, filepath.Base(unitBinary)))
	reload := unit.execReload[0]
	if !filepath.IsAbs(reload) {
		t.Fatalf("ExecReload=%s: want an absolute path", reload)
	}
	cp(reload, filepath.Join(mkdir(strings.TrimPrefix(filepath.Dir(reload), "/")), filepath.Base(reload)))
	etc := mkdir(strings.TrimPrefix(unitEtc, "/"))
	envs, err := filepath.Glob(filepath.Join(systemdDir(), "*.env"))
	if err != nil || len(envs) == 0 {
		t.Fatalf("no env files in docs/systemd: %v", err)
	}
	var instances []string
	for _, e := range envs {
		cp(e, etc)
		instances = append(instances, "imshard@"+strings.TrimSuffix(filepath.Base(e), ".env")+".service")
	}

	out, err := exec.Command(analyze, append([]string{"verify", "--root=" + root}, instances...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify %v: %v\n%s", instances, err, out)
	}
	for _, in := range instances {
		out, err := exec.Command(analyze, "security", "--offline=true", "--root="+root,
			"--threshold="+strconv.Itoa(int(maxExposure*10)), in).CombinedOutput()
		m := exposureLine.FindSubmatch(out)
		if m == nil {
			t.Fatalf("systemd-analyze security %s: no exposure level (%v)\n%s", in, err, out)
		}
		score, perr := strconv.ParseFloat(string(m[2]), 64)
		if perr != nil || score > maxExposure || err != nil {
			t.Fatalf("%s: exposure %s, want at most %.1f (%v)\n%s", in, m[2], maxExposure, err, out)
		}
		t.Logf("%s: exposure %.1f", in, score)
	}
}
