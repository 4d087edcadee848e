package cmd

import (
	"github.com/spf13/cobra"
)

func newConfigCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Inspect the configuration",
		Example: "  imshard config check --config /etc/imshard/imshard.yaml",
	}
	c.AddCommand(&cobra.Command{
		Use:     "check",
		Short:   "Validate the configuration and print the effective values (secrets masked)",
		Example: "  imshard config check\n  IMSHARD_SHARD_AUTO_ADVANCE=false imshard config check --config /etc/imshard/imshard.yaml",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := g.load(nil)
			if err != nil {
				return err
			}
			out, err := cfg.Masked()
			if err != nil {
				return err
			}
			_, err = g.stdout.Write(out)
			return err
		},
	})
	return c
}
