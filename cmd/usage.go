package cmd

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// refuseUnknownSubcommands makes every command that only groups others
// (shard, route, …) refuse a word that names none of them, as the root
// does — exit 2 with the nearest names — instead of printing its help and
// exiting 0, which would let a mistyped `imshard route chek` in a script
// pass. Alone it still prints its help.
func refuseUnknownSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if !c.HasSubCommands() || c.Runnable() || !c.HasParent() {
		return // the root checks its own words
	}
	c.SuggestionsMinimumDistance = 2 // as the root's default
	c.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		return usagef("unknown command %q for %q%s", args[0], c.CommandPath(), didYouMean(c.SuggestionsFor(args[0])))
	}
	c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
}

// flagError makes a flag cobra cannot parse a usage error (exit 2) that
// names the command's nearest flags when the name is unknown.
func flagError(c *cobra.Command, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return &UsageError{Err: err}
	}
	var near []string
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Name, name) || strings.HasPrefix(name, f.Name) || levenshtein(name, f.Name) <= 2 {
			near = append(near, "--"+f.Name)
		}
	})
	return &UsageError{Err: fmt.Errorf("%w for %q%s", err, c.CommandPath(), didYouMean(near))}
}

func didYouMean(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return "; did you mean " + strings.Join(names, " or ") + "?"
}

// levenshtein is the edit distance of a and b (cobra's own is unexported).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
