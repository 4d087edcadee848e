package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/move"
	"github.com/imshard/imshard/modules/tenantdb"
)

func newTenantCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "tenant", Short: "Operate on one tenant's placement: move it to another MySQL server",
		Example: "  imshard tenant move --tenant=acme --to='imshard:pw@tcp(db2:3306)/im_acme'\n  imshard tenant move status --tenant=acme",
	}
	c.AddCommand(newTenantMoveCmd(g))
	return c
}

// tenantMove runs fn with the tenant's current placement, the mover's
// options and the app (its placement store).
func (g *globals) tenantMove(tenant string, fn func(ctx context.Context, at tenantdb.Placement, o move.Options, a *app.App) error) error {
	return g.withTools(false, func(ctx context.Context, cfg *config.Config, a *app.App) error {
		if _, err := tenantsFor(cfg, tenant); err != nil {
			return err
		}
		at, err := a.Pools().Placement(tenant)
		if err != nil {
			return err
		}
		tlsCfg, err := cfg.MySQL.TLS.Client("mysql.tls")
		if err != nil {
			return err
		}
		// each step, and each part of the verification and the switch, as
		// it begins: what an operator (and `bench move`) watches the mover by
		hook := func(step string) error {
			fmt.Fprintf(g.stdout, "%s%s at %s\n", reachedPrefix(tenant), step, time.Now().UTC().Format(time.RFC3339Nano))
			return nil
		}
		return fn(ctx, at, move.Options{TLS: tlsCfg, StepHook: hook}, a)
	})
}

// reachedPrefix begins the line a mover of tenant prints as it reaches a
// step or a part of one ("tenant T: reached copy at <RFC 3339 time>").
func reachedPrefix(tenant string) string { return "tenant " + tenant + ": reached " }

// switchWorkFormat is the line a mover that switched prints at its end,
// after "tenant T: ".
const switchWorkFormat = "switch took %d ms; behind the fence %d marked rows copied and verified, %d unverified chunks compared, %d of them copied\n"

func newTenantMoveCmd(g *globals) *cobra.Command {
	var tenant, to string
	var yes bool
	var mf moverFlags
	c := &cobra.Command{
		Use:   "move --tenant=T --to=DSN [--yes]",
		Short: "Move a live tenant to another MySQL server (plan, copy, catch up, switch behind the fence)",
		Long: `Plans the move (the target reachable, its database empty or absent, the same
schema version), copies every table in primary key chunks, each checksummed
(row count, CRC-64 of its rows) over the rows its copy reads, catches up on the chunks that changed, then switches:
raises the source's fence to the next epoch (writers of the old placement are
refused from then on: persist parks, changes answer 409 tenant_moving), copies
what is left, verifies every table (per topic for month tables), raises the
target's fence and writes the placement record to every placement server.
Asks on a terminal; --yes in scripts. Run again (or "resume") after a crash:
every step can be re-run. One move of a tenant at a time: refused while the
last one is under way, or done and not finished. See docs/operations.md,
"Moving a tenant".`,
		Example: "  imshard tenant move --tenant=acme --to='imshard:pw@tcp(db2:3306)/im_acme' --yes",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if tenant == "" || to == "" {
				return usagef("--tenant and --to are required")
			}
			if err := mf.validate(); err != nil {
				return err
			}
			return g.tenantMove(tenant, func(ctx context.Context, at tenantdb.Placement, o move.Options, a *app.App) error {
				if !yes {
					ok, err := askMove(c.InOrStdin(), g.stdout, fmt.Sprintf("Move tenant %s (epoch %d) to %s? [y/N] ", tenant, at.Epoch, dsnServer(to)))
					if err != nil {
						return err
					}
					if !ok {
						return errors.New("not confirmed: nothing changed")
					}
				}
				mf.apply(&o)
				m, err := move.Begin(ctx, tenant, at, to, a.PlacementStore(), o)
				if err != nil {
					return err
				}
				defer m.Close()
				return runMove(ctx, g.stdout, tenant, m)
			})
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&to, "to", "", "the target database's DSN, as mysql.dsn_template would name it (required)")
	c.Flags().BoolVar(&yes, "yes", false, "skip the prompt (scripts)")
	mf.bind(c)
	c.AddCommand(newTenantMoveStatusCmd(g), newTenantMovePauseCmd(g, true), newTenantMovePauseCmd(g, false),
		newTenantMoveCancelCmd(g), newTenantMoveReverseCmd(g), newTenantMoveFinishCmd(g))
	return c
}

func runMove(ctx context.Context, w io.Writer, tenant string, m *move.Mover) error {
	fmt.Fprintf(w, "tenant %s: move at step %s\n", tenant, m.State().Step)
	err := m.Run(ctx)
	if errors.Is(err, move.ErrCancelled) {
		fmt.Fprintf(w, "tenant %s: the move was cancelled\n", tenant)
		return nil
	}
	if err != nil {
		return err
	}
	if st, work := m.State(), m.Work(); st.SwitchMS > 0 {
		fmt.Fprintf(w, "tenant %s: "+switchWorkFormat, tenant, st.SwitchMS, work.Keys, work.Compared, work.Chunks)
	}
	fmt.Fprintf(w, "tenant %s: moved (step %s); check it, then `imshard tenant move finish --tenant=%s` drops the source copy\n", tenant, m.State().Step, tenant)
	return nil
}

// askMove asks on a terminal; without one it refuses (scripts pass --yes).
func askMove(in io.Reader, out io.Writer, question string) (bool, error) {
	f, ok := in.(*os.File)
	if !ok || !isatty.IsTerminal(f.Fd()) {
		return false, usagef("not a terminal: confirm the move with --yes")
	}
	return confirmLine(in, out, question)
}

func dsnServer(dsn string) string {
	st := move.State{Peer: dsn}
	return st.Server()
}

// moverFlags are the flags of the commands that run a mover (move, resume,
// reverse): chunk size and the switch's lag limit.
type moverFlags struct {
	chunkRows, maxLag int
}

func (f *moverFlags) bind(c *cobra.Command) {
	c.Flags().IntVar(&f.chunkRows, "chunk-rows", 2000, "rows per copied and checksummed chunk")
	c.Flags().IntVar(&f.maxLag, "max-lag-chunks", move.DefaultMaxSwitchLag,
		"the most chunks the last catch-up round before the switch may find changed; more refuses the switch (back to catch-up)")
}

func (f *moverFlags) validate() error {
	if f.chunkRows < 1 {
		return usagef("--chunk-rows: want at least 1, got %d", f.chunkRows)
	}
	if f.maxLag < 1 {
		return usagef("--max-lag-chunks: want at least 1, got %d", f.maxLag)
	}
	return nil
}

func (f *moverFlags) apply(o *move.Options) {
	o.ChunkRows, o.MaxSwitchLag = f.chunkRows, f.maxLag
}

func tenantFlag(c *cobra.Command, tenant *string) {
	c.Flags().StringVar(tenant, "tenant", "", "tenant id (required)")
	_ = c.MarkFlagRequired("tenant")
}

func newTenantMoveStatusCmd(g *globals) *cobra.Command {
	var tenant string
	var out outputOptions
	c := &cobra.Command{
		Use:     "status --tenant=T [--output=json]",
		Short:   "Print the tenant's move: step, tables, rows and bytes copied, rate, ETA, lag (chunks to copy again)",
		Example: "  imshard tenant move status --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			return g.tenantMove(tenant, func(ctx context.Context, at tenantdb.Placement, o move.Options, _ *app.App) error {
				st, err := move.ReadState(ctx, at.DSN, o.TLS)
				if errors.Is(err, move.ErrNoMove) {
					fmt.Fprintf(g.stdout, "tenant %s: no move (epoch %d)\n", tenant, at.Epoch)
					return nil
				}
				if err != nil {
					return err
				}
				p := moveProgress(st)
				if out.json() {
					return writeJSON(g.stdout, map[string]any{"tenant": tenant, "epoch": at.Epoch, "move": st, "progress": p})
				}
				printMove(g.stdout, tenant, at, st, p)
				return nil
			})
		},
	}
	tenantFlag(c, &tenant)
	out.bind(c)
	return c
}

// progress is what status derives from the counters: rows per second since
// the move began and the time the chunks still to copy take at that rate.
type progress struct {
	RowsPerSecond float64 `json:"rows_per_second"`
	ETASeconds    float64 `json:"eta_seconds"`
}

func moveProgress(st move.State) progress {
	var p progress
	secs := st.UpdatedAt.Sub(st.StartedAt).Seconds()
	if secs > 0 {
		p.RowsPerSecond = float64(st.RowsCopied) / secs
	}
	copied := st.Chunks - st.Lag
	if p.RowsPerSecond > 0 && copied > 0 {
		p.ETASeconds = float64(st.Lag) * float64(st.RowsCopied) / float64(copied) / p.RowsPerSecond
	}
	return p
}

func printMove(w io.Writer, tenant string, at tenantdb.Placement, st move.State, p progress) {
	paused := ""
	if st.Paused {
		paused = " (paused)"
	}
	kind := "move"
	if st.Reverse {
		kind = "reverse move"
	}
	fmt.Fprintf(w, "tenant %s: %s %s of this database (epoch %d), peer %s: step %s%s\n", tenant, kind, st.Role, at.Epoch, st.PeerServer, st.Step, paused)
	fmt.Fprintf(w, "  tables %d, chunks %d, lag %d chunks to copy\n", st.Tables, st.Chunks, st.Lag)
	fmt.Fprintf(w, "  copied %d rows, %d bytes, %.0f rows/s, ETA %s\n", st.RowsCopied, st.BytesCopied, p.RowsPerSecond,
		(time.Duration(p.ETASeconds) * time.Second).String())
	if st.SwitchMS > 0 {
		fmt.Fprintf(w, "  switch took %d ms\n", st.SwitchMS)
	}
	if st.HalfSwitched() {
		fmt.Fprintf(w, "  the switch is half done (its mover died): `imshard tenant move resume --tenant=%s` completes it; cancel, finish, reverse and a new move are refused until then\n", tenant)
	}
}

func newTenantMovePauseCmd(g *globals, pause bool) *cobra.Command {
	var tenant string
	var mf moverFlags
	use, short := "pause", "Pause the tenant's copy between two chunks (the switch, once begun, completes)"
	if !pause {
		use, short = "resume", "Resume a paused move, or drive a move whose mover died (kill -9) to its end (a half-done switch included)"
	}
	c := &cobra.Command{
		Use:     use + " --tenant=T",
		Short:   short,
		Example: "  imshard tenant move " + use + " --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if !pause {
				if err := mf.validate(); err != nil {
					return err
				}
			}
			return g.tenantMove(tenant, func(ctx context.Context, at tenantdb.Placement, o move.Options, a *app.App) error {
				if err := move.SetPaused(ctx, at.DSN, o.TLS, pause); err != nil {
					return err
				}
				if pause {
					fmt.Fprintf(g.stdout, "tenant %s: move paused\n", tenant)
					return nil
				}
				mf.apply(&o)
				m, err := move.Resume(ctx, tenant, at, a.PlacementStore(), o)
				if errors.Is(err, move.ErrBusy) {
					fmt.Fprintf(g.stdout, "tenant %s: move resumed (its running mover continues)\n", tenant)
					return nil
				}
				if err != nil {
					return err
				}
				defer m.Close()
				return runMove(ctx, g.stdout, tenant, m)
			})
		},
	}
	tenantFlag(c, &tenant)
	if !pause {
		mf.bind(c)
	}
	return c
}

func newTenantMoveCancelCmd(g *globals) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:   "cancel --tenant=T",
		Short: "Cancel the move: before the switch the target copy is dropped; once the fence is raised the switch completes",
		Long: `Before the switch, stops the mover, drops the target's copy and leaves the
source as it was. Once the switch has raised the source's fence, cancel lowers
nothing: it completes the switch, so the tenant ends wholly on the target.
Safe to run again after a crash. Refused (exit 1) while a switch is half done
(the placement names the target, the move's end not recorded): "resume"
completes it.`,
		Example: "  imshard tenant move cancel --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return g.tenantMove(tenant, func(ctx context.Context, at tenantdb.Placement, o move.Options, a *app.App) error {
				st, err := move.ReadState(ctx, at.DSN, o.TLS)
				if err != nil {
					return err
				}
				completed, err := move.Cancel(ctx, tenant, at, a.PlacementStore(), o)
				if err != nil {
					return err
				}
				switch {
				case completed:
					fmt.Fprintf(g.stdout, "tenant %s: the switch had begun; it completed, the tenant is on the target\n", tenant)
				case st.Reverse:
					fmt.Fprintf(g.stdout, "tenant %s: reverse cancelled, the tenant stays where its move put it (move done; finish or reverse later)\n", tenant)
				default:
					fmt.Fprintf(g.stdout, "tenant %s: move cancelled, target copy dropped, the tenant stays on its source\n", tenant)
				}
				return nil
			})
		},
	}
	tenantFlag(c, &tenant)
	return c
}

func newTenantMoveReverseCmd(g *globals) *cobra.Command {
	var tenant string
	var yes bool
	var mf moverFlags
	c := &cobra.Command{
		Use:   "reverse --tenant=T [--yes]",
		Short: "Move a tenant whose move is done back onto the copy its source kept (before finish)",
		Long: `After the switch (step done) and before finish, moves the tenant back to the
move's source with the same steps and guarantees: the source copy must still be
there, answer, be that move's copy and be at the same schema version, or the
reverse is refused and nothing changes. Only the chunks that differ (what was
written on the target since the switch) are copied; then the same fenced switch
in the other direction raises the epoch again. Run again (or "resume") after a
crash; "cancel" before its switch leaves the tenant on the target, the move done.`,
		Example: "  imshard tenant move reverse --tenant=acme --yes",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := mf.validate(); err != nil {
				return err
			}
			return g.tenantMove(tenant, func(ctx context.Context, at tenantdb.Placement, o move.Options, a *app.App) error {
				st, err := move.ReadState(ctx, at.DSN, o.TLS)
				if err != nil {
					return err
				}
				if !yes {
					ok, err := askMove(c.InOrStdin(), g.stdout, fmt.Sprintf("Move tenant %s (epoch %d) back to %s? [y/N] ", tenant, at.Epoch, st.PeerServer))
					if err != nil {
						return err
					}
					if !ok {
						return errors.New("not confirmed: nothing changed")
					}
				}
				mf.apply(&o)
				m, err := move.Reverse(ctx, tenant, at, a.PlacementStore(), o)
				if err != nil {
					return err
				}
				defer m.Close()
				return runMove(ctx, g.stdout, tenant, m)
			})
		},
	}
	tenantFlag(c, &tenant)
	c.Flags().BoolVar(&yes, "yes", false, "skip the prompt (scripts)")
	mf.bind(c)
	return c
}

func newTenantMoveFinishCmd(g *globals) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:     "finish --tenant=T",
		Short:   "Drop the source copy of a move that is done (only then; refused while a switch is half done)",
		Example: "  imshard tenant move finish --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return g.tenantMove(tenant, func(ctx context.Context, at tenantdb.Placement, o move.Options, _ *app.App) error {
				if err := move.Finish(ctx, tenant, at, o); err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "tenant %s: source copy dropped\n", tenant)
				return nil
			})
		},
	}
	tenantFlag(c, &tenant)
	return c
}
