package cmd

import (
	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
)

func newPersistCmd(g *globals) *cobra.Command {
	o := &serveOptions{}
	c := &cobra.Command{
		Use:     "persist",
		Short:   "Run the Kafka → MySQL consumer (role persist)",
		Example: "  imshard persist --config /etc/imshard/imshard.yaml --metrics-addr=:9091",
		Args:    cobra.NoArgs,
	}
	flags := o.bind(c, false)
	c.RunE = func(c *cobra.Command, _ []string) error { return g.serve(flags, []string{app.Persist}) }
	return c
}
