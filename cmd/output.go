package cmd

import (
	"encoding/json"
	"io"
	"time"

	"github.com/spf13/cobra"
)

// outputOptions is --output of the list, status and check commands: text
// for people, or one JSON document on stdout for scripts, whose fields
// docs/operations.md ("Output for scripts") lists and keeps stable.
type outputOptions struct{ format string }

func (o *outputOptions) bind(c *cobra.Command) {
	c.Flags().StringVar(&o.format, "output", "text", "text, or json for scripts (fields: docs/operations.md, \"Output for scripts\")")
}

func (o *outputOptions) validate() error {
	if o.format != "text" && o.format != "json" {
		return usagef("--output: want text or json, got %q", o.format)
	}
	return nil
}

func (o *outputOptions) json() bool { return o.format == "json" }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jsonTime is a time for --output=json: RFC 3339 in UTC, null when unknown.
func jsonTime(ok bool, t time.Time) *string {
	if !ok {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

// tenantError is one tenant the command could not read, in its JSON.
type tenantError struct {
	Tenant string `json:"tenant"`
	Error  string `json:"error"`
}
