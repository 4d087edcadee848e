//go:build unix

// Package localsrv runs private servers as child processes — a mariadbd on
// a data directory and loopback port of its own, a redis-server — for the
// tests that stop, kill and restart them and for a benchmark that needs a
// second MySQL server. Nothing here touches a shared server.
package localsrv

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
	"time"

	_ "github.com/go-sql-driver/mysql" // the readiness check's driver
)

// MariaDBReadyTimeout bounds the data directory's initialisation and the
// server's start together.
const MariaDBReadyTimeout = 90 * time.Second

// PortAttempts is how many free ports a start tries: another process can
// take a port between the check and the server's bind.
const PortAttempts = 5

var mariaDBPortInUse = []string{"Address already in use", "Do you already have another server running on port"}

// MariaDB is a private mariadbd on DataDir and Addr (127.0.0.1:port); root
// has an empty password.
type MariaDB struct {
	Addr    string
	DataDir string
	Proc    *Proc
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartMariaDB initialises dir/data with mariadb-install-db, starts
// mariadbd on a free 127.0.0.1 port with extraArgs added (e.g. --ssl-cert=…)
// and waits until root can log in over TCP. dir must be short (the server's
// unix socket lives there) and is the caller's to remove after Stop. On an
// error nothing is left running.
func StartMariaDB(dir string, extraArgs ...string) (*MariaDB, error) {
	begin := time.Now()
	installer, err := LookBin("mariadb-install-db", "mysql_install_db")
	if err != nil {
		return nil, err
	}
	server, err := LookBin("mariadbd", "mysqld")
	if err != nil {
		return nil, err
	}
	m := &MariaDB{DataDir: filepath.Join(dir, "data")}
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
	ctx, cancel := context.WithTimeout(context.Background(), MariaDBReadyTimeout)
	defer cancel()
	// Own tmpdir: concurrent bootstraps sharing /tmp collide on temp table
	// files ("Unknown table 'mysql.tmp_user_sys'").
	tmpDir := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmpDir, 0o755); err != nil {
		return nil, err
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
		return nil, fmt.Errorf("%s %v: %v\nlog %s:\n%s", installer, args, err, installLog, FileExcerpt(installLog))
	}
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		m.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		args := []string{"--no-defaults",
			"--datadir=" + m.DataDir, "--tmpdir=" + tmpDir, "--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
			"--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
			"--skip-log-bin", "--skip-name-resolve", // with --no-defaults and no --log-error, errors go to stderr (captured)
			"--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
		}
		args = append(append(append(args, userArgs...), sizing...), extraArgs...)
		m.Proc = &Proc{Name: "mariadbd " + m.Addr, Bin: server, Args: args, LogPath: filepath.Join(dir, "mariadbd.log")}
		if err := m.Proc.Start(); err != nil {
			return nil, err
		}
		err = m.WaitReady(begin.Add(MariaDBReadyTimeout))
		if err == nil {
			return m, nil
		}
		_ = m.Proc.Stop(syscall.SIGKILL, 10*time.Second)
		if attempt < PortAttempts && m.Proc.LogContains(mariaDBPortInUse...) {
			continue
		}
		return nil, fmt.Errorf("%v\nlog %s:\n%s", err, m.Proc.LogPath, m.Proc.LogExcerpt())
	}
}

// WaitReady waits until root can log in over TCP and run a query.
func (m *MariaDB) WaitReady(deadline time.Time) error {
	db, err := sql.Open("mysql", "root@tcp("+m.Addr+")/?timeout=2s")
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
		case <-m.Proc.Exited():
			return fmt.Errorf("%s exited before accepting connections (last error: %v)", m.Proc.Name, last)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready for root over TCP in time: %v", m.Proc.Name, last)
		}
	}
}
