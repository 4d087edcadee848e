package cmd

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is set at build time (-ldflags "-X github.com/imshard/imshard/cmd.Version=…").
var Version = "dev"

// versionLine is what `imshard version` and `imshard --version` print:
// the stamped version, the commit when the build recorded one, and Go's.
func versionLine() string {
	rev := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				rev = " " + s.Value
			}
		}
	}
	return fmt.Sprintf("imshard %s%s %s\n", Version, rev, runtime.Version())
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version",
		Example: "  imshard version",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(g.stdout, versionLine())
			return err
		},
	}
}
