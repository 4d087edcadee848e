package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/retention"
)

func newRetentionCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "retention", Short: "Show and remove history past retention",
		Example: "  imshard retention plan --tenant=acme\n  imshard retention run --tenant=acme",
	}
	c.AddCommand(newRetentionPlanCmd(g), newRetentionRunCmd(g))
	return c
}

type retentionOptions struct {
	tenant string
	out    outputOptions
}

func newRetentionPlanCmd(g *globals) *cobra.Command {
	o := &retentionOptions{}
	c := &cobra.Command{
		Use:   "plan [--tenant=T] [--output=json]",
		Short: "Print exactly what the next retention run removes: months, topics, rows (read-only)",
		Long: `Prints, per tenant, the months a retention run drops whole, the topics it
trims from months that stay (a group whose own retention is shorter), with their
rows, and what past retention it leaves and why. It removes nothing.`,
		Example: "  imshard retention plan --tenant=acme\n  imshard retention plan --output=json",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			return g.withTools(true, func(ctx context.Context, cfg *config.Config, a *app.App) error {
				tenants, err := tenantsFor(cfg, o.tenant)
				if err != nil {
					return err
				}
				plans := []retention.Plan{}
				var errs []string
				for _, t := range tenants {
					p, err := a.Retention().Plan(ctx, t)
					if err != nil {
						errs = append(errs, fmt.Sprintf("tenant %s: %v", t, err))
						continue
					}
					plans = append(plans, p)
				}
				if o.out.json() {
					if err := writeJSON(g.stdout, map[string]any{"plans": plans, "errors": errs}); err != nil {
						return err
					}
				} else {
					for _, p := range plans {
						printPlan(g.stdout, p)
					}
				}
				if len(errs) > 0 {
					return errors.New(strings.Join(errs, "\n"))
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	o.out.bind(c)
	return c
}

func newRetentionRunCmd(g *globals) *cobra.Command {
	o := &retentionOptions{}
	c := &cobra.Command{
		Use:   "run [--tenant=T] [--output=json]",
		Short: "Remove history past retention now (as the shard manager's patrol does)",
		Long: `Plans as "retention plan" does, prints the plan, then removes it: months
dropped whole, topics trimmed in short batches. A run stopped half-way is
finished by the next one.`,
		Example: "  imshard retention run --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			return g.withTools(false, func(ctx context.Context, cfg *config.Config, a *app.App) error {
				tenants, err := tenantsFor(cfg, o.tenant)
				if err != nil {
					return err
				}
				reports := []retention.Report{}
				var errs []string
				for _, t := range tenants {
					rep, err := a.Retention().Run(ctx, t)
					if err != nil {
						errs = append(errs, fmt.Sprintf("tenant %s: %v", t, err))
					}
					reports = append(reports, rep)
				}
				if o.out.json() {
					if err := writeJSON(g.stdout, map[string]any{"reports": reports}); err != nil {
						return err
					}
				} else {
					for _, r := range reports {
						printPlan(g.stdout, r.Plan)
						status := "ok"
						if r.Error != "" {
							status = "FAILED: " + r.Error
						}
						fmt.Fprintf(g.stdout, "tenant %s: removed %d months (%d rows), trimmed %d rows, %s\n",
							r.Plan.Tenant, r.Months, r.RowsDropped, r.RowsTrimmed, status)
						for _, h := range r.HeldSincePlan {
							fmt.Fprintf(g.stdout, "  held since the plan %s %s: %d rows kept: %s\n", h.Month, h.Topic, h.Rows, h.Reason)
						}
					}
				}
				if len(errs) > 0 {
					return errors.New(strings.Join(errs, "\n"))
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	o.out.bind(c)
	return c
}

func printPlan(w io.Writer, p retention.Plan) {
	fmt.Fprintf(w, "tenant %s: now %s, retention_months %d: %d months to drop, %d topic trims, %d rows\n",
		p.Tenant, p.Now, p.RetentionMonths, len(p.Drops), len(p.Trims), p.Rows())
	for _, d := range p.Drops {
		resumed := ""
		if d.Resumed {
			resumed = " (resuming)"
		}
		fmt.Fprintf(w, "  drop %s: %d rows, %d topics%s\n", d.Month, d.Rows, d.Topics, resumed)
	}
	for _, t := range p.Trims {
		fmt.Fprintf(w, "  trim %s %s: %d rows (seq %d..%d, group retention %d)\n", t.Month, t.Topic, t.Rows, t.MinSeq, t.MaxSeq, t.RetentionMonths)
	}
	for _, s := range p.Skipped {
		fmt.Fprintf(w, "  keep %s: %d topics, %d rows past retention: %s\n", s.Month, s.Topics, s.Rows, s.Reason)
	}
	for _, h := range p.Held {
		fmt.Fprintf(w, "  held %s %s: %d rows past retention kept: %s\n", h.Month, h.Topic, h.Rows, h.Reason)
	}
}
