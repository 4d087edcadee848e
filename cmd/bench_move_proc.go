package cmd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/move"
)

// moverProcess runs a move the way an operator does: this executable's
// `tenant move --yes` in a process of its own (only the servers are
// shared with the bench's roles and load), watched by the lines it prints
// as it reaches each step and by `tenant move status`; a mover that exits
// with an error is continued by `tenant move resume`, as the runbook says.
type moverProcess struct {
	g                  *globals
	tenant, secret, to string
	chunkRows          int
	// dir holds the tenants file naming the bench's own tenant, which the
	// configuration file does not (benchTenant adds it in memory)
	dir string
}

// moverAttempts bounds the mover processes of one move: the first and the
// resumes after it (a switch its pre-checks refused goes back to catch-up).
const moverAttempts = 3

// moverStatusEvery is how often the bench runs `tenant move status` while
// the mover runs, and logs what it says.
const moverStatusEvery = 15 * time.Second

func (p *moverProcess) run(ctx context.Context, mark func(string)) (bench.MoveSwitch, error) {
	var sw bench.MoveSwitch
	dir, err := os.MkdirTemp("", "imshard-move-bench")
	if err != nil {
		return sw, err
	}
	defer os.RemoveAll(dir)
	p.dir = dir
	tenants, err := json.Marshal([]map[string]string{{"id": p.tenant, "jwt_secret": p.secret}})
	if err != nil {
		return sw, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tenants.json"), tenants, 0o600); err != nil {
		return sw, err
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go p.watch(wctx)
	chunk := "--chunk-rows=" + strconv.Itoa(p.chunkRows)
	args := []string{"tenant", "move", "--tenant=" + p.tenant, "--to=" + p.to, "--yes", chunk}
	var errs []error
	for range moverAttempts {
		err := p.mover(ctx, args, mark, &sw)
		if err == nil {
			break
		}
		if errs = append(errs, err); ctx.Err() != nil {
			return sw, errors.Join(errs...)
		}
		fmt.Fprintf(p.g.stderr, "bench: the mover ended with %v; resuming it\n", err)
		args = []string{"tenant", "move", "resume", "--tenant=" + p.tenant, chunk}
	}
	st, err := p.status(ctx)
	if err != nil {
		return sw, errors.Join(append(errs, err)...)
	}
	if st.Move.Step != move.StepDone {
		return sw, errors.Join(append(errs, fmt.Errorf("bench: the move is at step %s after %d mover processes", st.Move.Step, moverAttempts))...)
	}
	sw.MS = st.Move.SwitchMS
	return sw, nil
}

// command is this executable with the configuration the bench read and
// the tenants file naming its tenant.
func (p *moverProcess) command(ctx context.Context, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if p.g.configPath != "" {
		args = append([]string{"--config", p.g.configPath}, args...)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	env := p.g.env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(env[:len(env):len(env)], "IMSHARD_TENANTS_FILE="+filepath.Join(p.dir, "tenants.json"))
	cmd.Stderr = p.g.stderr
	// a bench interrupted stops its mover as an operator would (the move
	// is resumable; the bench drops it anyway)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	return cmd, nil
}

// mover runs one mover process, marking each step it reaches as its line
// arrives and reading the switch's work from its last lines.
func (p *moverProcess) mover(ctx context.Context, args []string, mark func(string), sw *bench.MoveSwitch) error {
	cmd, err := p.command(ctx, args...)
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	reached := reachedPrefix(p.tenant)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, reached); ok {
			step, _, _ := strings.Cut(rest, " ")
			mark(step)
			continue
		}
		var ms int64
		if rest, ok := strings.CutPrefix(line, "tenant "+p.tenant+": "); ok {
			if n, _ := fmt.Sscanf(rest+"\n", switchWorkFormat, &ms, &sw.FencedKeys, &sw.Compared, &sw.Chunks); n == 4 {
				continue
			}
		}
		fmt.Fprintf(p.g.stderr, "bench: mover: %s\n", line)
	}
	return errors.Join(sc.Err(), cmd.Wait())
}

// moveStatus is the part of `tenant move status --output=json` the bench
// reads.
type moveStatus struct {
	Move struct {
		Step       string `json:"step"`
		SwitchMS   int64  `json:"switch_ms"`
		RowsCopied int64  `json:"rows_copied"`
		Chunks     int64  `json:"chunks"`
		Lag        int64  `json:"lag_chunks"`
	} `json:"move"`
	Progress struct {
		RowsPerSecond float64 `json:"rows_per_second"`
		ETASeconds    float64 `json:"eta_seconds"`
	} `json:"progress"`
}

func (p *moverProcess) status(ctx context.Context) (moveStatus, error) {
	var st moveStatus
	cmd, err := p.command(ctx, "tenant", "move", "status", "--tenant="+p.tenant, "--output=json")
	if err != nil {
		return st, err
	}
	out, err := cmd.Output()
	if err != nil {
		return st, fmt.Errorf("bench: tenant move status: %w", err)
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("bench: tenant move status: %w", err)
	}
	return st, nil
}

// watch logs the move's status every moverStatusEvery until ctx ends.
func (p *moverProcess) watch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(moverStatusEvery):
		}
		st, err := p.status(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			fmt.Fprintf(p.g.stderr, "bench: %v\n", err)
			continue
		}
		fmt.Fprintf(p.g.stderr, "bench: move status: step %s, %d rows copied, %.0f rows/s, %d chunks, lag %d, ETA %.0f s\n",
			st.Move.Step, st.Move.RowsCopied, st.Progress.RowsPerSecond, st.Move.Chunks, st.Move.Lag, st.Progress.ETASeconds)
	}
}
