package cmd

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
)

// serveOptions are the options of the long-running commands.
type serveOptions struct {
	roles       string
	httpAddr    string
	metricsAddr string
}

// bind adds the listen-address flags; api is false for a command that
// serves no API (persist), which then offers no API flag.
func (o *serveOptions) bind(c *cobra.Command, api bool) map[string]*pflag.Flag {
	c.Flags().StringVar(&o.metricsAddr, "metrics-addr", "", "/metrics, /healthz, /readyz listen address (overrides metrics.addr)")
	flags := map[string]*pflag.Flag{"metrics.addr": c.Flags().Lookup("metrics-addr")}
	if api {
		c.Flags().StringVar(&o.httpAddr, "http-addr", "", "API listen address (overrides http.addr)")
		flags["http.addr"] = c.Flags().Lookup("http-addr")
	}
	return flags
}

func newAllCmd(g *globals) *cobra.Command {
	o := &serveOptions{}
	c := &cobra.Command{
		Use:     "all",
		Short:   "Run every role in one process (small deployments, demos, tests)",
		Example: "  imshard all --config config.example.yaml",
		Args:    cobra.NoArgs,
	}
	flags := o.bind(c, true)
	c.RunE = func(c *cobra.Command, _ []string) error { return g.serve(flags, []string{app.All}) }
	return c
}

func newServeCmd(g *globals) *cobra.Command {
	o := &serveOptions{}
	c := &cobra.Command{
		Use:     "serve --roles=ROLE[,ROLE…]",
		Short:   "Run the named roles (" + joinRoles() + ")",
		Example: "  imshard serve --roles=send,query --http-addr=:8080 --metrics-addr=:9090\n  imshard serve --roles=shardmgr --metrics-addr=:9092",
		Args:    cobra.NoArgs,
	}
	flags := o.bind(c, true)
	c.Flags().StringVar(&o.roles, "roles", "", "comma-separated roles to run: "+joinRoles()+", or all")
	c.RunE = func(c *cobra.Command, _ []string) error {
		roles, err := app.ParseRoles(o.roles)
		if err != nil {
			return &UsageError{Err: err}
		}
		return g.serve(flags, roles)
	}
	return c
}

func joinRoles() string {
	out := ""
	for i, r := range app.Roles() {
		if i > 0 {
			out += ", "
		}
		out += r
	}
	return out
}

// serve runs the roles until SIGINT/SIGTERM, then drains and returns nil.
// SIGHUP, from the first instant, re-reads the configuration and applies what
// can change live; it never stops the process.
func (g *globals) serve(flags map[string]*pflag.Flag, roles []string) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	flags = g.serverFlags(flags)
	// one load for the start and every reload, so a reload refuses exactly
	// what a start would
	load := func() (*config.Config, error) {
		cfg, err := g.load(flags)
		if err != nil {
			return nil, err
		}
		if err := cfg.ValidateServe(roles...); err != nil {
			return nil, &UsageError{Err: err}
		}
		return cfg, nil
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	log := g.serverLogger(cfg)
	ctx, stop := serveContext()
	defer stop()
	a := app.New(cfg, log)
	a.ReloadOn(hup, load)
	if err := a.Start(ctx, roles); err != nil {
		return err
	}
	log.Info().Strs("roles", roles).Strs("modules", a.Modules()).Msg("imshard started")
	if err := a.Run(ctx); err != nil {
		return err
	}
	log.Info().Msg("imshard stopped")
	return nil
}

// serveContext ends on SIGTERM — a service manager's stop, which drains
// through http.shutdown_delay — or on SIGINT, a Ctrl-C at a terminal, with
// app.ErrStopNow: no load balancer is waiting there, so the process stops
// at once.
func serveContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			if s == os.Interrupt {
				cancel(app.ErrStopNow)
			} else {
				cancel(nil)
			}
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sig)
		close(done)
		cancel(nil)
	}
}
