package test

import (
	"strings"
	"testing"
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
