//go:build unix

package localsrv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child server process (redis-server, mariadbd) that can be stopped
// and started again with the same arguments. Its stdout and stderr are
// appended to LogPath.
type Proc struct {
	Name    string
	Bin     string
	Args    []string
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current process has exited
}

// Start launches the process. It must not be running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s is already running (pid %d)", p.Name, p.cmd.Process.Pid)
		}
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== localsrv %s: starting %s %s\n", time.Now().Format(time.RFC3339Nano), p.Bin, quoteArgs(p.Args))
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	// Start and Wait on one goroutine locked to its OS thread: Pdeathsig fires
	// when the thread that forked the child exits, so that thread must live
	// exactly as long as the child.
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(done)
		defer f.Close()
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("start %s: %w", p.Bin, err)
			return
		}
		started <- nil
		err := cmd.Wait()
		fmt.Fprintf(f, "=== localsrv %s: %s exited: %v\n", time.Now().Format(time.RFC3339Nano), p.Name, err)
	}()
	if err := <-started; err != nil {
		return err
	}
	p.cmd, p.done = cmd, done
	return nil
}

// Exited returns a channel closed once the current process has exited
// (already closed if it was never started).
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// Stop sends sig to the process group and waits for the process to exit; if
// it has not exited after grace, it is killed with SIGKILL. Stopping a process
// that is not running is a no-op.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	pid := cmd.Process.Pid
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = cmd.Process.Signal(sig)
	}
	select {
	case <-done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-done:
		if sig == syscall.SIGKILL {
			return nil
		}
		return fmt.Errorf("%s did not exit within %v after %v; killed it", p.Name, grace, sig)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit even after SIGKILL", p.Name, pid)
	}
}

// LogExcerpt returns, indented for failure messages, the error-looking lines
// of the process log followed by its last lines.
func (p *Proc) LogExcerpt() string { return FileExcerpt(p.LogPath) }

var errorWords = []string{"ERROR", "Error", "error", "FATAL", "Could not", "Can't", "Aborting", "exited"}

// FileExcerpt returns up to 15 error-looking lines of the file and then its
// last 15 lines, indented.
func FileExcerpt(path string) string {
	b, err := readTail(path, 256<<10)
	if err != nil {
		return fmt.Sprintf("\t(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	var errs []string
	for _, l := range lines {
		for _, w := range errorWords {
			if strings.Contains(l, w) {
				errs = append(errs, l)
				break
			}
		}
	}
	if len(errs) > 15 {
		errs = errs[:15]
	}
	tail := lines
	if len(tail) > 15 {
		tail = tail[len(tail)-15:]
	}
	var out strings.Builder
	if len(errs) > 0 {
		out.WriteString("\t[error lines]\n\t" + strings.Join(errs, "\n\t") + "\n\t[last lines]\n")
	}
	out.WriteString("\t" + strings.Join(tail, "\n\t"))
	return out.String()
}

func readTail(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	return io.ReadAll(f)
}

// LogContains reports whether the log contains any of the substrings (used to
// detect a lost race for a free port).
func (p *Proc) LogContains(subs ...string) bool {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return false
	}
	for _, s := range subs {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// LookBin finds the first of names on PATH or in /usr/sbin, /usr/bin,
// /usr/local/bin.
func LookBin(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, d := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"} {
			p := d + "/" + n
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("none of %s found on PATH or in /usr/sbin, /usr/bin (run `bash test/services.sh` to install them)", strings.Join(names, ", "))
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}
