//go:build linux

package localsrv

import "syscall"

// sysProcAttr puts a child in its own process group (so a stop can kill the
// whole group) and has the kernel kill it if its parent dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
