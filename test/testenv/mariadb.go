//go:build unix

package testenv

import (
	"syscall"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/localsrv"
)

// MariaDB is a private mariadbd with its own temp datadir and port, for fault
// tests (clean stop, kill -9, restart). root has an empty password. It never
// touches the shared server. Stop, Kill and Start must be called from the
// test goroutine (they may call t.Fatalf).
type MariaDB struct {
	Addr        string // 127.0.0.1:port
	DSNTemplate string // "root@tcp(Addr)/imshard_{tenant}?parseTime=true&loc=UTC"
	AdminDSN    string // "root@tcp(Addr)/?parseTime=true&loc=UTC&multiStatements=false"
	DataDir     string

	t   testing.TB
	srv *localsrv.MariaDB
}

// StartMariaDB starts a private mariadbd (localsrv.StartMariaDB) in a short
// temp dir with extraArgs added (e.g. --ssl-cert=…). It is killed and its
// datadir removed on cleanup.
func StartMariaDB(t testing.TB, extraArgs ...string) *MariaDB {
	t.Helper()
	dir := shortTempDir(t)
	srv, err := localsrv.StartMariaDB(dir, extraArgs...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	m := &MariaDB{Addr: srv.Addr, DataDir: srv.DataDir, DSNTemplate: dsnTemplate("root", "", "tcp", srv.Addr),
		AdminDSN: "root@tcp(" + srv.Addr + ")/" + adminDSNParams, t: t, srv: srv}
	t.Cleanup(func() {
		if err := srv.Proc.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return m
}

// Stop shuts mariadbd down cleanly (SIGTERM) and waits for it to exit.
func (m *MariaDB) Stop() {
	m.t.Helper()
	if err := m.srv.Proc.Stop(syscall.SIGTERM, 60*time.Second); err != nil {
		m.t.Fatalf("testenv: stop: %v\nlog %s:\n%s", err, m.srv.Proc.LogPath, m.srv.Proc.LogExcerpt())
	}
}

// Kill kills mariadbd with SIGKILL and waits for it to exit.
func (m *MariaDB) Kill() {
	m.t.Helper()
	if err := m.srv.Proc.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		m.t.Fatalf("testenv: kill: %v", err)
	}
}

// Start starts mariadbd again on the same datadir and port and waits until
// root can log in (after a Kill this includes crash recovery).
func (m *MariaDB) Start() {
	m.t.Helper()
	if err := m.srv.Proc.Start(); err != nil {
		m.t.Fatalf("testenv: restart: %v", err)
	}
	if err := m.srv.WaitReady(time.Now().Add(localsrv.MariaDBReadyTimeout)); err != nil {
		m.t.Fatalf("testenv: restart: %v\nlog %s:\n%s", err, m.srv.Proc.LogPath, m.srv.Proc.LogExcerpt())
	}
}
