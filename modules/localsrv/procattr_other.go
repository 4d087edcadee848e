//go:build unix && !linux

package localsrv

import "syscall"

// sysProcAttr puts a child in its own process group so a stop can kill the
// whole group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
