package test

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/imshard/imshard/cmd"
	"github.com/imshard/imshard/test/testenv"
)

// TestVersionFlagAndCommandAgree: `imshard --version` and `imshard version`
// print the same line, naming the version the build stamped.
func TestVersionFlagAndCommandAgree(t *testing.T) {
	code, flag := runCLI(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(flag, "imshard ") {
		t.Fatalf("--version: exit %d %q", code, flag)
	}
	code, sub := runCLI(t, nil, "version")
	if code != 0 || sub != flag {
		t.Fatalf("version: exit %d %q, want %q", code, sub, flag)
	}
}

// TestEveryCommandHasAnExample: each command's --help shows how to call it,
// and no flag's placeholder is a stray backquoted word of its help text.
func TestEveryCommandHasAnExample(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		n++
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%q has no Example", c.CommandPath())
		}
		if !strings.Contains(c.Example, "imshard") {
			t.Errorf("%q: the Example does not show an imshard command line: %q", c.CommandPath(), c.Example)
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.Contains(name, " ") {
				t.Errorf("%q --%s shows the placeholder %q", c.CommandPath(), f.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.NewRoot(io.Discard, io.Discard, nil))
	if n < 10 {
		t.Fatalf("walked only %d commands", n)
	}
}

// TestRouteCheckExitCodes: `route check` tells a difference (1, see
// TestRouteCheckAndRebuildCommands) from bad usage (2) and from a check it
// could not make because a store did not answer (3): "no difference" must
// never be read into a check that did not run.
func TestRouteCheckExitCodes(t *testing.T) {
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	closed := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	for _, c := range []struct {
		name string
		env  []string
		args []string
		code int
		says string
	}{
		{"unknown tenant", nil, []string{"--tenant", "nosuch"}, 2, `"nosuch" is not configured`},
		{"bad topic", nil, []string{"--topic", "a b"}, 2, "--topic"},
		{"Redis down", []string{"IMSHARD_REDIS_ADDRS=" + closed}, nil, 3, "could not check"},
		{"MySQL down", []string{"IMSHARD_MYSQL_DSN_TEMPLATE=root@tcp(" + closed + ")/imshard_{tenant}"}, nil, 3, "could not check"},
	} {
		code, out := runCLI(t, c.env, append([]string{"--config", cfg, "route", "check"}, c.args...)...)
		if code != c.code || !strings.Contains(out, c.says) {
			t.Errorf("%s: exit %d, want %d saying %q\n%s", c.name, code, c.code, c.says, out)
		}
	}
}
