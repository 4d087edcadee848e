package cmd

import (
	"fmt"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

func newConfigCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Inspect the configuration",
		Example: "  imshard config check --config /etc/imshard/imshard.yaml",
	}
	var out outputOptions
	check := &cobra.Command{
		Use:     "check [--output=json]",
		Short:   "Validate the configuration and print the effective values (secrets masked)",
		Example: "  imshard config check\n  IMSHARD_SHARD_AUTO_ADVANCE=false imshard config check --config /etc/imshard/imshard.yaml\n  imshard config check --output=json",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			cfg, err := g.load(nil)
			if err != nil {
				return err
			}
			masked, err := cfg.Masked()
			if err != nil {
				return err
			}
			if !out.json() {
				_, err = g.stdout.Write(masked)
				return err
			}
			// the same keys and values as the YAML, which is what a
			// configuration file holds
			var doc map[string]any
			if err := yaml.Unmarshal(masked, &doc); err != nil {
				return fmt.Errorf("config check: %w", err)
			}
			return writeJSON(g.stdout, doc)
		},
	}
	out.bind(check)
	c.AddCommand(check)
	return c
}
