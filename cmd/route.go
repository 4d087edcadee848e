package cmd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
)

func newRouteCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "route", Short: "Check and rebuild Redis topic routes against the MySQL mirror and the month tables",
		Example: "  imshard route check --tenant=acme\n  imshard route rebuild --tenant=acme --all",
	}
	c.AddCommand(newRouteCheckCmd(g), newRouteRebuildCmd(g), newRouteRestoreCmd(g))
	return c
}

// withRouteCheck loads config, starts the tool modules (read-only for a
// check that fixes nothing) and hands the route checker to fn.
func (g *globals) withRouteCheck(readOnly bool, fn func(ctx context.Context, cfg *config.Config, rc *routecheck.Checker) error) error {
	return g.withTools(readOnly, func(ctx context.Context, cfg *config.Config, a *app.App) error {
		return fn(ctx, cfg, a.NewRouteCheck())
	})
}

type routeCheckOptions struct {
	tenant string
	topic  string
	fix    bool
	out    outputOptions
}

// routeCheckJSON is one tenant's result in `route check --output=json`.
type routeCheckJSON struct {
	Tenant        string                  `json:"tenant"`
	TopicsChecked int                     `json:"topics_checked"`
	Differences   []routecheck.Difference `json:"differences"`
	Fixed         int                     `json:"fixed"`
	Migration     string                  `json:"migration"`
	LegacyTopics  int                     `json:"legacy_topics"`
	Error         string                  `json:"error,omitempty"`
}

// errDifferences makes `route check` exit 1 when it found a difference it
// was not asked to fix (and could check everything it was asked to).
var errDifferences = errors.New("route differences found (run with --fix to rewrite the mirror and Redis from the month tables)")

func newRouteCheckCmd(g *globals) *cobra.Command {
	o := &routeCheckOptions{}
	c := &cobra.Command{
		Use:   "check [--tenant=T] [--topic=X] [--fix] [--output=json]",
		Short: "Compare Redis routes, the MySQL mirror and the actual seq ranges of the month tables; print every difference",
		Long: `Without --fix it only reads: a tenant whose database does not exist yet is
named as such (exit 3, could not check), never created.`,
		Example: "  imshard route check                         # every tenant; exit 1: differences, 3: could not check\n  imshard route check --tenant=acme --topic=room-42 --fix\n  imshard route check --output=json",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			if o.topic != "" {
				if err := routing.ValidTopic(o.topic); err != nil {
					return usagef("--topic: %v", err)
				}
			}
			err := g.withRouteCheck(!o.fix, func(ctx context.Context, cfg *config.Config, rc *routecheck.Checker) error {
				tenants, err := tenantsFor(cfg, o.tenant)
				if err != nil {
					return err
				}
				var topics []string
				if o.topic != "" {
					topics = []string{o.topic}
				}
				found := 0
				var errs []error
				results := []routeCheckJSON{}
				for _, t := range tenants {
					res, err := rc.Check(ctx, t, topics, o.fix, func(d routecheck.Difference) {
						if !o.out.json() {
							fmt.Fprintf(g.stdout, "tenant %s: %s\n", t, d)
						}
					})
					found += len(res.Differences)
					r := routeCheckJSON{Tenant: t, TopicsChecked: res.Topics, Differences: res.Differences, Fixed: res.Fixed,
						Migration: string(res.Migration), LegacyTopics: res.Legacy}
					if r.Differences == nil {
						r.Differences = []routecheck.Difference{}
					}
					if r.Migration == "" {
						r.Migration = "none"
					}
					if err != nil {
						r.Error = err.Error()
						errs = append(errs, fmt.Errorf("tenant %s: %w", t, err))
					}
					results = append(results, r)
					if o.out.json() {
						continue
					}
					if res.Migration != routing.MigrationNone && res.Migration != routing.MigrationFinished {
						fmt.Fprintf(g.stdout, "tenant %s: migrating from the legacy table (state %s): %d topics hold copied legacy rows "+
							"(seqs up to their cutover_seq) the route mirror takes after the copy; reported as legacy, not compared\n",
							t, res.Migration, res.Legacy)
					}
					fmt.Fprintf(g.stdout, "tenant %s: %d topics checked, %d differences, %d topics fixed\n",
						t, res.Topics, len(res.Differences), res.Fixed)
				}
				if o.out.json() {
					if err := writeJSON(g.stdout, map[string]any{"tenants": results}); err != nil {
						return err
					}
				}
				if len(errs) > 0 {
					return &UncheckedError{Err: errors.Join(errs...)}
				}
				if found > 0 && !o.fix {
					return errDifferences
				}
				return nil
			})
			var ue *UsageError
			var ke *config.KeyError
			if err == nil || errors.Is(err, errDifferences) || errors.As(err, &ue) || errors.As(err, &ke) {
				return err
			}
			// the stores did not answer, at start or during the check
			var ce *UncheckedError
			if !errors.As(err, &ce) {
				err = &UncheckedError{Err: err}
			}
			return err
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	c.Flags().StringVar(&o.topic, "topic", "", "only this topic")
	c.Flags().BoolVar(&o.fix, "fix", false, "rewrite the mirror and the Redis route of each differing topic from the month tables")
	o.out.bind(c)
	return c
}

type routeRebuildOptions struct {
	tenant string
	topic  string
	all    bool
}

func newRouteRebuildCmd(g *globals) *cobra.Command {
	o := &routeRebuildOptions{}
	c := &cobra.Command{
		Use:     "rebuild --tenant=T (--topic=X | --all)",
		Short:   "Rebuild Redis topic routes from the MySQL mirror",
		Example: "  imshard route rebuild --tenant=acme --all\n  imshard route rebuild --tenant=acme --topic=room-42",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if (o.topic == "") == !o.all {
				return usagef("give exactly one of --topic or --all")
			}
			var topics []string
			if o.topic != "" {
				if err := routing.ValidTopic(o.topic); err != nil {
					return usagef("--topic: %v", err)
				}
				topics = []string{o.topic}
			}
			return g.withRouteCheck(false, func(ctx context.Context, cfg *config.Config, rc *routecheck.Checker) error {
				if _, err := tenantsFor(cfg, o.tenant); err != nil {
					return err
				}
				last := 0
				err := rc.Rebuild(ctx, o.tenant, topics, func(done, total int) {
					// about twenty progress lines however many topics
					if step := max(1, total/20); done == total || done-last >= step {
						fmt.Fprintf(g.stdout, "tenant %s: rebuilt %d/%d topics\n", o.tenant, done, total)
						last = done
					}
				})
				if err != nil {
					return fmt.Errorf("rebuild routes of %s: %w", o.tenant, err)
				}
				if last == 0 {
					fmt.Fprintf(g.stdout, "tenant %s: the mirror holds no topic\n", o.tenant)
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&o.topic, "topic", "", "only this topic")
	c.Flags().BoolVar(&o.all, "all", false, "every topic of the mirror")
	_ = c.MarkFlagRequired("tenant")
	return c
}

type routeRestoreOptions struct {
	tenant     string
	kafkaSince string
	seqMargin  int64
}

func newRouteRestoreCmd(g *globals) *cobra.Command {
	o := &routeRestoreOptions{seqMargin: -1}
	c := &cobra.Command{
		Use:     "restore --tenant=T [--kafka-since=TIME] [--seq-margin=N]",
		Short:   "After restoring a tenant database from a dump: raise every topic's seq reservation above the dump and Kafka, rebuild the tenant's Redis state",
		Example: "  imshard route restore --tenant=acme --kafka-since=2026-03-01T02:00:00Z",
		Long: `Run with the tenant's database restored and no process serving the tenant.
Every topic's durable seq reservation is raised to the highest seq the dump or
the tenant's events in kafka.topic (read from --kafka-since, default: the whole
retention) hold for it, plus --seq-margin (default send.seq_reserve_step); then
the tenant's Redis keys are dropped and the active month, the ready months and
the topic routes are rebuilt from MySQL. Running it twice is harmless.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if c.Flags().Changed("seq-margin") && o.seqMargin < 0 {
				return usagef("--seq-margin must be at least 0, got %d", o.seqMargin)
			}
			var since time.Time
			if o.kafkaSince != "" {
				t, err := time.Parse(time.RFC3339, o.kafkaSince)
				if err != nil {
					return usagef("--kafka-since: want an RFC 3339 time such as 2026-03-01T02:00:00Z, got %q", o.kafkaSince)
				}
				since = t
			}
			cfg, err := g.load(nil)
			if err != nil {
				return err
			}
			if _, err := tenantsFor(cfg, o.tenant); err != nil {
				return err
			}
			margin := o.seqMargin
			if margin < 0 {
				margin = cfg.Send.SeqReserveStep
			}
			ctx, stop := signalContext()
			defer stop()
			a := app.New(cfg, g.logger(cfg))
			defer a.Close()
			_, err = a.RestoreTenant(ctx, o.tenant, app.RestoreOptions{KafkaSince: since, SeqMargin: margin,
				Progress: func(format string, args ...any) {
					fmt.Fprintf(g.stdout, "tenant %s: %s\n", o.tenant, fmt.Sprintf(format, args...))
				}})
			if err != nil {
				return fmt.Errorf("restore %s: %w", o.tenant, err)
			}
			return nil
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&o.kafkaSince, "kafka-since", "", "read the tenant's events from this time (RFC 3339; at or before the dump's start) instead of the topic's start")
	c.Flags().Int64Var(&o.seqMargin, "seq-margin", -1, "added above the highest seq found per topic (default send.seq_reserve_step)")
	_ = c.MarkFlagRequired("tenant")
	return c
}
