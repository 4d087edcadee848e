//go:build unix

package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

const mariaDBReadyTimeout = 90 * time.Second

var mariaDBPortInUse = []string{"Address already in use", "Do you already have another server running on port"}

// MariaDB is a private mariadbd with its own temp datadir and port, for fault
// tests (clean stop, kill -9, restart). root has an empty password. It never
// touches the shared server. Stop, Kill and Start must be called from the
// test goroutine (they may call t.Fatalf).
type MariaDB struct {
	Addr        string // 127.0.0.1:port
	DSNTemplate string // "root@tcp(Addr)/imshard_{tenant}?parseTime=true&loc=UTC"
	AdminDSN    string // "root@tcp(Addr)/?parseTime=true&loc=UTC&multiStatements=false"
	DataDir     string

	t testing.TB
	p *proc
}

// StartMariaDB initialises a temp datadir with mariadb-install-db, starts
// mariadbd on a free 127.0.0.1 port with extraArgs added (e.g. --ssl-cert=…)
// and waits until root can log in over TCP. It is killed and its datadir
// removed on cleanup.
func StartMariaDB(t testing.TB, extraArgs ...string) *MariaDB {
	t.Helper()
	begin := time.Now()
	installer, err := lookBin("mariadb-install-db", "mysql_install_db")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	server, err := lookBin("mariadbd", "mysqld")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	dir := shortTempDir(t)
	m := &MariaDB{DataDir: filepath.Join(dir, "data"), t: t}
	userArgs := []string(nil)
	if os.Geteuid() == 0 {
		userArgs = []string{"--user=root"} // mariadbd refuses to run as root otherwise
	}
	// Smaller than the defaults: many of these may run at once.
	// Flushing to the OS on commit (not fsync) and no doublewrite buffer keep
	// every committed transaction across a process kill (the page cache
	// survives it), which is what fault tests exercise; only an OS crash could
	// lose data.
	sizing := []string{"--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
		"--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0"}

	installLog := filepath.Join(dir, "install.log")
	ctx, cancel := context.WithTimeout(context.Background(), mariaDBReadyTimeout)
	defer cancel()
	// Own tmpdir: concurrent bootstraps sharing /tmp collide on temp table
	// files ("Unknown table 'mysql.tmp_user_sys'").
	tmpDir := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmpDir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	args := append([]string{"--no-defaults", "--auth-root-authentication-method=normal",
		"--datadir=" + m.DataDir, "--tmpdir=" + tmpDir, "--skip-test-db"}, userArgs...)
	args = append(args, sizing...)
	install := exec.CommandContext(ctx, installer, args...)
	// On timeout kill the whole group (the script and its bootstrap mariadbd).
	install.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	install.Cancel = func() error { return syscall.Kill(-install.Process.Pid, syscall.SIGKILL) }
	install.WaitDelay = 5 * time.Second
	out, err := install.CombinedOutput()
	_ = os.WriteFile(installLog, out, 0o644)
	if err != nil {
		t.Fatalf("testenv: %s %v: %v\nlog %s:\n%s", installer, args, err, installLog, fileExcerpt(installLog))
	}

	t.Cleanup(func() {
		if m.p != nil {
			if err := m.p.stop(syscall.SIGKILL, 10*time.Second); err != nil {
				t.Errorf("testenv: %v", err)
			}
		}
	})
	for attempt := 1; ; attempt++ {
		port := FreePort(t)
		m.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		m.DSNTemplate = dsnTemplate("root", "", "tcp", m.Addr)
		m.AdminDSN = "root@tcp(" + m.Addr + ")/" + adminDSNParams
		args := []string{"--no-defaults",
			"--datadir=" + m.DataDir, "--tmpdir=" + tmpDir, "--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
			"--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
			"--skip-log-bin", "--skip-name-resolve", // with --no-defaults and no --log-error, errors go to stderr (captured)
			"--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
		}
		args = append(append(append(args, userArgs...), sizing...), extraArgs...)
		m.p = &proc{name: "mariadbd " + m.Addr, bin: server, args: args, logPath: filepath.Join(dir, "mariadbd.log")}
		if err := m.p.start(); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		err := m.waitReady(begin.Add(mariaDBReadyTimeout))
		if err == nil {
			return m
		}
		if attempt < portAttempts && m.p.logContains(mariaDBPortInUse...) {
			_ = m.p.stop(syscall.SIGKILL, 10*time.Second)
			continue
		}
		t.Fatalf("testenv: %v\nlog %s:\n%s", err, m.p.logPath, m.p.logExcerpt())
	}
}

// waitReady waits until root can log in over TCP and run a query.
func (m *MariaDB) waitReady(deadline time.Time) error {
	db, err := sql.Open("mysql", m.AdminDSN+"&timeout=2s")
	if err != nil {
		return err
	}
	defer db.Close()
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var one int
		last = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-m.p.exited():
			return fmt.Errorf("%s exited before accepting connections (last error: %v)", m.p.name, last)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready for root over TCP in time: %v", m.p.name, last)
		}
	}
}

// Stop shuts mariadbd down cleanly (SIGTERM) and waits for it to exit.
func (m *MariaDB) Stop() {
	m.t.Helper()
	if err := m.p.stop(syscall.SIGTERM, 60*time.Second); err != nil {
		m.t.Fatalf("testenv: stop: %v\nlog %s:\n%s", err, m.p.logPath, m.p.logExcerpt())
	}
}

// Kill kills mariadbd with SIGKILL and waits for it to exit.
func (m *MariaDB) Kill() {
	m.t.Helper()
	if err := m.p.stop(syscall.SIGKILL, 10*time.Second); err != nil {
		m.t.Fatalf("testenv: kill: %v", err)
	}
}

// Start starts mariadbd again on the same datadir and port and waits until
// root can log in (after a Kill this includes crash recovery).
func (m *MariaDB) Start() {
	m.t.Helper()
	if err := m.p.start(); err != nil {
		m.t.Fatalf("testenv: restart: %v", err)
	}
	if err := m.waitReady(time.Now().Add(mariaDBReadyTimeout)); err != nil {
		m.t.Fatalf("testenv: restart: %v\nlog %s:\n%s", err, m.p.logPath, m.p.logExcerpt())
	}
}
