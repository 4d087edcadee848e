//go:build linux

package testenv

import "syscall"

// sysProcAttr puts a child in its own process group (so cleanup can kill the
// whole group) and has the kernel kill it if the test binary dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
