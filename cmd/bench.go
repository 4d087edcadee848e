package cmd

import "github.com/spf13/cobra"

// newBenchCmd is the parent of the benchmarks; each measures a path beside
// its raw limit on the same services in the same run (DESIGN "Performance").
func newBenchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "Measure a path beside its raw limit on the same services"}
	c.AddCommand(newBenchSendCmd(g), newBenchQueryCmd(g), newBenchPersistCmd(g))
	return c
}
