// Package cmd holds the cobra commands of imshard: each parses its flags,
// loads the configuration and calls app or one exported module function. No
// business logic lives here.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
)

// Exit codes (README, "Commands").
const (
	ExitOK      = 0
	ExitFailure = 1 // the command failed; `route check`: it found a difference
	ExitUsage   = 2 // bad usage or bad configuration
	// ExitUnchecked: a check (`route check`) could not be made — a store
	// did not answer — so finding no difference proves nothing.
	ExitUnchecked = 3
)

// UsageError marks bad usage or bad configuration: exit code 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// UncheckedError marks a check that could not be made: exit code 3.
type UncheckedError struct{ Err error }

func (e *UncheckedError) Error() string { return "could not check: " + e.Err.Error() }
func (e *UncheckedError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// globals are the options every command shares.
type globals struct {
	configPath string
	// logLevel is --log-level: log.level for the long-running commands;
	// the one-shot ones log warnings and errors only unless it is given
	logLevel *pflag.Flag
	stdout   io.Writer
	stderr   io.Writer
	env      []string
}

// NewRoot builds the command tree; tests call it with their own writers/env.
func NewRoot(stdout, stderr io.Writer, env []string) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr, env: env}
	root := &cobra.Command{
		Use:   "imshard",
		Short: "Month-sharded group-message storage for a multi-tenant IM backend",
		Example: `  imshard all --config config.example.yaml           # every role in one process, on local defaults
  imshard token --tenant=demo --sub=1 --role=service  # a token for curl
  imshard shard list --output=json                    # month tables of every tenant, for a script`,
		Version:       Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(versionLine())
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.configPath, "config", "", "YAML config file (default ./imshard.yaml if present, else built-in local defaults)")
	root.PersistentFlags().String("log-level", "", "trace | debug | info | warn | error (default: log.level for all, serve, persist and devkafka; warn for every other command)")
	g.logLevel = root.PersistentFlags().Lookup("log-level")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(
		newAllCmd(g),
		newServeCmd(g),
		newPersistCmd(g),
		newDLQCmd(g),
		newShardCmd(g),
		newRetentionCmd(g),
		newRouteCmd(g),
		newConfigCmd(g),
		newDevKafkaCmd(g),
		newTokenCmd(g),
		newVersionCmd(g),
		newBenchCmd(g),
		newMigrateCmd(g),
		newWatchCmd(g),
		newTenantCmd(g),
	)
	refuseUnknownSubcommands(root)
	return root
}

// Execute runs the CLI and returns the process exit code.
func Execute() int {
	root := NewRoot(os.Stdout, os.Stderr, nil)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(os.Stderr, "imshard:", err)
	return ExitCode(err)
}

// ExitCode maps an error from a command to the process exit code.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *UsageError
	var ke *config.KeyError
	if errors.As(err, &ue) || errors.As(err, &ke) {
		return ExitUsage
	}
	var ce *UncheckedError
	if errors.As(err, &ce) {
		return ExitUnchecked
	}
	if isCobraUsage(err) {
		return ExitUsage
	}
	return ExitFailure
}

// isCobraUsage recognises cobra's own argument errors (unknown command,
// wrong number of arguments), which it returns as plain errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "accepts ", "requires at least", "invalid argument", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// load reads and validates the configuration, the same way for every
// command and role; flags maps config keys to this command's flags that
// override them.
func (g *globals) load(flags map[string]*pflag.Flag) (*config.Config, error) {
	if err := g.checkLogLevel(); err != nil {
		return nil, err
	}
	cfg, err := config.Load(config.LoadOptions{Path: g.configPath, Env: g.env, Flags: flags})
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	if err := cfg.Validate(); err != nil {
		return nil, &UsageError{Err: err}
	}
	return cfg, nil
}

// serverLogger is the logger of a long-running command: log.level (which
// --log-level overrides through the flags its load was given).
func (g *globals) serverLogger(cfg *config.Config) zerolog.Logger {
	return app.NewLogger(cfg.Log, g.stderr)
}

// logger is the logger of a one-shot command: what it did goes to stdout,
// so its log holds only warnings and errors unless --log-level asks for
// more (log.level is the servers' setting).
func (g *globals) logger(cfg *config.Config) zerolog.Logger {
	c := cfg.Log
	c.Level = zerolog.WarnLevel.String()
	if g.logLevel.Changed {
		c.Level = g.logLevel.Value.String()
	}
	return app.NewLogger(c, g.stderr)
}

// serverFlags adds --log-level to the flags a long-running command maps
// onto configuration keys.
func (g *globals) serverFlags(flags map[string]*pflag.Flag) map[string]*pflag.Flag {
	out := map[string]*pflag.Flag{"log.level": g.logLevel}
	for k, f := range flags {
		out[k] = f
	}
	return out
}

// withTools loads the configuration, starts the clients and the routing
// core (no servers, no loops) and hands them to fn, for the one-shot
// operator commands; Ctrl-C cancels fn's context. readOnly commands never
// create what they find missing (app.App.ReadOnly).
func (g *globals) withTools(readOnly bool, fn func(ctx context.Context, cfg *config.Config, a *app.App) error) error {
	cfg, err := g.load(nil)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	a := app.New(cfg, g.logger(cfg))
	a.ReadOnly = readOnly
	if err := a.StartTools(ctx); err != nil {
		return err
	}
	defer a.Close()
	return fn(ctx, cfg, a)
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

var logLevels = []string{"trace", "debug", "info", "warn", "error"}

// checkLogLevel refuses a --log-level a one-shot command cannot apply (the
// long-running ones check it as log.level).
func (g *globals) checkLogLevel() error {
	if !g.logLevel.Changed {
		return nil
	}
	if v := g.logLevel.Value.String(); !slices.Contains(logLevels, v) {
		return usagef("--log-level: want one of %s, got %q", strings.Join(logLevels, ", "), v)
	}
	return nil
}
