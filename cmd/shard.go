package cmd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
)

func newShardCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "shard", Short: "Create, list, activate and seal month tables",
		Example: "  imshard shard ensure\n  imshard shard list --tenant=acme",
	}
	c.AddCommand(newShardEnsureCmd(g), newShardListCmd(g), newShardActivateCmd(g),
		newShardSealCmd(g, "seal"), newShardSealCmd(g, "unseal"))
	return c
}

// withShards loads config, starts the tool modules and hands the shard
// manager to fn; errors from fn are failures (exit 1).
func (g *globals) withShards(fn func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error) error {
	return g.withTools("shardmgr", func(ctx context.Context, cfg *config.Config, a *app.App) error {
		return fn(ctx, cfg, a.NewShardManager())
	})
}

// tenantsFor is every configured tenant, or the one named (which must exist).
func tenantsFor(cfg *config.Config, name string) ([]string, error) {
	var ids []string
	for _, t := range cfg.Tenants {
		ids = append(ids, t.ID)
	}
	if name == "" {
		return ids, nil
	}
	if !slices.Contains(ids, name) {
		return nil, usagef("--tenant %q is not configured (configured: %v)", name, ids)
	}
	return []string{name}, nil
}

func parseMonthFlag(flag, v string) (routing.Month, error) {
	m, err := routing.ParseMonth(v)
	if err != nil {
		return routing.Month{}, usagef("--%s: %v", flag, err)
	}
	return m, nil
}

type shardEnsureOptions struct {
	months int
	from   string
	tenant string
}

func newShardEnsureCmd(g *globals) *cobra.Command {
	o := &shardEnsureOptions{}
	c := &cobra.Command{
		Use:     "ensure [--months=N] [--from=YYYYMM] [--tenant=T]",
		Short:   "Create and register the previous, current and next N month tables of every tenant",
		Example: "  imshard shard ensure\n  imshard shard ensure --tenant=acme --months=3 --from=202601",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			opts := shardmgr.Options{MonthsAhead: -1}
			if c.Flags().Changed("months") {
				if o.months < 0 || o.months > 24 {
					return usagef("--months must be 0..24, got %d", o.months)
				}
				opts.MonthsAhead = o.months
			}
			if o.from != "" {
				m, err := parseMonthFlag("from", o.from)
				if err != nil {
					return err
				}
				opts.From = m
			}
			return g.withShards(func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error {
				tenants, err := tenantsFor(cfg, o.tenant)
				if err != nil {
					return err
				}
				results, err := mg.Sync(ctx, opts, tenants)
				for _, r := range results {
					status := "ok"
					if r.Err != nil {
						status = "FAILED: " + r.Err.Error()
					}
					fmt.Fprintf(g.stdout, "tenant %s: months %s..%s, created %d %v, active %s, %s\n",
						r.Tenant, first(r.Expected), last(r.Expected), len(r.Created), r.Created, orDash(r.Active.String()), status)
				}
				return err
			})
		},
	}
	c.Flags().IntVar(&o.months, "months", 0, "months after the current one (default shard.months_ahead)")
	c.Flags().StringVar(&o.from, "from", "", "also cover every month from YYYYMM on")
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	return c
}

func first(ms []routing.Month) string {
	if len(ms) == 0 {
		return "-"
	}
	return ms[0].String()
}

func last(ms []routing.Month) string {
	if len(ms) == 0 {
		return "-"
	}
	return ms[len(ms)-1].String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newShardListCmd(g *globals) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:     "list [--tenant=T]",
		Short:   "List month tables: status, rows, min/max created_at",
		Example: "  imshard shard list --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return g.withShards(func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error {
				tenants, err := tenantsFor(cfg, tenant)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TENANT\tMONTH\tTABLE\tSTATUS\tACTIVE\tROWS\tMIN_CREATED_AT\tMAX_CREATED_AT")
				var errs []error
				for _, t := range tenants {
					infos, err := mg.List(ctx, t)
					if err != nil {
						errs = append(errs, fmt.Errorf("tenant %s: %w", t, err))
						continue
					}
					for _, in := range infos {
						active := ""
						if in.Active {
							active = "*"
						}
						status := string(in.Status)
						if !in.Exists {
							status += " (TABLE MISSING)"
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", t, in.Month, in.Table.Name(), status, active,
							in.Rows, fmtTime(in.MinAt.Valid, in.MinAt.Time), fmtTime(in.MaxAt.Valid, in.MaxAt.Time))
					}
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				return errors.Join(errs...)
			})
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	return c
}

func fmtTime(ok bool, t time.Time) string {
	if !ok {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

type monthOptions struct {
	tenant string
	month  string
}

func (o *monthOptions) bind(c *cobra.Command) {
	c.Flags().StringVar(&o.tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&o.month, "month", "", "month YYYYMM (required)")
	_ = c.MarkFlagRequired("tenant")
	_ = c.MarkFlagRequired("month")
}

func newShardActivateCmd(g *globals) *cobra.Command {
	return newShardMonthCmd(g, "activate",
		"Move the tenant's active month forward to a writable month (the only way with shard.auto_advance: false)",
		"  imshard shard activate --tenant=acme --month=202612",
		func(mg *shardmgr.Manager) func(context.Context, string, routing.Month) error { return mg.Activate },
		"active month %[2]s")
}

func newShardSealCmd(g *globals, verb string) *cobra.Command {
	short := "Seal a month: no more writes; late events go to the compensation queue"
	op := func(mg *shardmgr.Manager) func(context.Context, string, routing.Month) error { return mg.Seal }
	if verb == "unseal" {
		short = "Reopen a sealed month for late writes (its sealing grace restarts)"
		op = func(mg *shardmgr.Manager) func(context.Context, string, routing.Month) error { return mg.Unseal }
	}
	return newShardMonthCmd(g, verb, short, "  imshard shard "+verb+" --tenant=acme --month=202610", op,
		"month %[2]s %[1]sed")
}

// newShardMonthCmd is a command that applies one shard manager operation
// to one month of one tenant; done formats the line printed after it (%[1]s
// the verb, %[2]s the month).
func newShardMonthCmd(g *globals, verb, short, example string,
	op func(*shardmgr.Manager) func(context.Context, string, routing.Month) error, done string) *cobra.Command {
	o := &monthOptions{}
	c := &cobra.Command{
		Use:     verb + " --tenant=T --month=YYYYMM",
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			m, err := parseMonthFlag("month", o.month)
			if err != nil {
				return err
			}
			return g.withShards(func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error {
				if _, err := tenantsFor(cfg, o.tenant); err != nil {
					return err
				}
				if err := op(mg)(ctx, o.tenant, m); err != nil {
					return fmt.Errorf("%s %s for %s: %w", verb, m, o.tenant, err)
				}
				fmt.Fprintf(g.stdout, "tenant %s: %s\n", o.tenant, fmt.Sprintf(done, verb, m))
				return nil
			})
		},
	}
	o.bind(c)
	return c
}
