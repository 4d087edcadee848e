package cmd

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
)

func newShardRestoreCmd(g *globals) *cobra.Command {
	o := &monthOptions{}
	c := &cobra.Command{
		Use:   "restore --tenant=T --month=YYYYMM",
		Short: "Bring an archived month back into MySQL from its archive, verify it and set it back to sealed",
		Long: `Creates the month table if it is gone, writes back from the archive every row it lacks,
compares the table with the archive topic by topic, and only then sets the month back to
sealed (its messages can be changed again) and forgets its archive run, in one transaction.
The archive objects stay. A run killed half-way is run again; nothing is deleted before the
table is verified. A month that is not archived is refused.`,
		Example: "  imshard shard restore --tenant=acme --month=202601",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			m, err := parseMonthFlag("month", o.month)
			if err != nil {
				return err
			}
			return g.withTools(false, func(ctx context.Context, cfg *config.Config, a *app.App) error {
				if _, err := tenantsFor(cfg, o.tenant); err != nil {
					return err
				}
				rep, err := a.NewArchiver().Restore(ctx, o.tenant, m)
				if err != nil {
					return fmt.Errorf("restore %s for %s: %w", m, o.tenant, err)
				}
				fmt.Fprintf(g.stdout, "tenant %s: month %s restored and sealed: %d rows, %d written back from the archive\n",
					o.tenant, m, rep.Rows, rep.Restored)
				return nil
			})
		},
	}
	o.bind(c)
	return c
}
