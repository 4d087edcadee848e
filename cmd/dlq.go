package cmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/modules/persist"
)

func newDLQCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "dlq", Short: "List and replay dead letters and compensation entries (events persist could not store)",
		Example: "  imshard dlq list --tenant=acme\n  imshard dlq replay --tenant=acme --all",
	}
	c.AddCommand(newDLQListCmd(g), newDLQReplayCmd(g))
	return c
}

// withDLQ loads config, starts the clients the tool needs (read-only for a
// command that only looks) and hands it to fn.
func (g *globals) withDLQ(tenant string, readOnly bool, fn func(ctx context.Context, tool *persist.Tool) error) error {
	cfg, err := g.load(nil)
	if err != nil {
		return err
	}
	if _, err := tenantsFor(cfg, tenant); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	a := app.New(cfg, g.logger(cfg))
	a.ReadOnly = readOnly
	defer a.Close()
	tool, err := a.DLQTool(ctx)
	if err != nil {
		return err
	}
	return fn(ctx, tool)
}

type dlqListOptions struct {
	tenant string
	limit  int
	out    outputOptions
}

// deadLetterJSON is one dead letter in `dlq list --output=json`.
type deadLetterJSON struct {
	ID        string  `json:"id"`
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	Tenant    string  `json:"tenant"`
	Topic     string  `json:"topic"`
	Seq       int64   `json:"seq"`
	Month     string  `json:"month"`
	Reason    string  `json:"reason"`
	Error     string  `json:"error"`
	Source    string  `json:"source"`
	FailedAt  *string `json:"failed_at"`
}

// compensationJSON is one compensation entry in `dlq list --output=json`.
type compensationJSON struct {
	ID       string  `json:"id"`
	Tenant   string  `json:"tenant"`
	Topic    string  `json:"topic"`
	Seq      int64   `json:"seq"`
	Month    string  `json:"month"`
	Status   string  `json:"status"`
	Reason   string  `json:"reason"`
	QueuedAt *string `json:"queued_at"`
}

func newDLQListCmd(g *globals) *cobra.Command {
	o := &dlqListOptions{}
	c := &cobra.Command{
		Use:     "list [--tenant=T] [--limit=N] [--output=json]",
		Short:   "List dead-letter records and compensation entries with their reasons (read-only)",
		Example: "  imshard dlq list\n  imshard dlq list --tenant=acme --limit=20\n  imshard dlq list --output=json",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if o.limit < 0 {
				return usagef("--limit must be ≥ 0, got %d", o.limit)
			}
			if err := o.out.validate(); err != nil {
				return err
			}
			return g.withDLQ(o.tenant, true, func(ctx context.Context, tool *persist.Tool) error {
				dls, err := tool.DeadLetters(ctx, o.tenant, o.limit)
				if err != nil {
					return err
				}
				comps, cerr := tool.Compensations(ctx, o.tenant, o.limit)
				if o.out.json() {
					return errors.Join(dlqJSON(g, dls, comps), cerr)
				}
				return errors.Join(printDLQ(g, dls, comps), cerr)
			})
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	c.Flags().IntVar(&o.limit, "limit", 100, "at most this many of each kind (0: all)")
	o.out.bind(c)
	return c
}

func dlqJSON(g *globals, dls []persist.DeadLetter, comps []persist.Compensation) error {
	dj := make([]deadLetterJSON, 0, len(dls))
	for _, d := range dls {
		dj = append(dj, deadLetterJSON{ID: d.ID, Partition: d.Partition, Offset: d.Offset, Tenant: d.Tenant, Topic: d.Topic,
			Seq: d.Seq, Month: d.Month, Reason: d.Reason, Error: d.Error, Source: d.Source, FailedAt: jsonTime(!d.At.IsZero(), d.At)})
	}
	cj := make([]compensationJSON, 0, len(comps))
	for _, c := range comps {
		cj = append(cj, compensationJSON{ID: c.ID, Tenant: c.Tenant, Topic: c.Topic, Seq: c.Seq, Month: c.Month,
			Status: c.Status, Reason: c.Reason, QueuedAt: jsonTime(!c.At.IsZero(), c.At)})
	}
	return writeJSON(g.stdout, map[string]any{"dead_letters": dj, "compensation": cj})
}

func printDLQ(g *globals, dls []persist.DeadLetter, comps []persist.Compensation) error {
	tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DEAD LETTERS (%d)\n", len(dls))
	fmt.Fprintln(tw, "ID\tTENANT\tTOPIC\tSEQ\tMONTH\tREASON\tFAILED_AT\tERROR")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, orDash(d.Tenant), orDash(d.Topic), d.Seq, orDash(d.Month),
			d.Reason, fmtTime(!d.At.IsZero(), d.At), oneLine(d.Error))
	}
	fmt.Fprintf(tw, "\nCOMPENSATION (%d)\n", len(comps))
	fmt.Fprintln(tw, "ID\tTENANT\tTOPIC\tSEQ\tMONTH\tSTATUS\tREASON\tQUEUED_AT")
	for _, c := range comps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", c.ID, c.Tenant, c.Topic, c.Seq, c.Month, c.Status, c.Reason,
			fmtTime(true, c.At))
	}
	return tw.Flush()
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return orDash(s)
}

type dlqReplayOptions struct {
	tenant string
	id     string
	all    bool
	month  string
}

func newDLQReplayCmd(g *globals) *cobra.Command {
	o := &dlqReplayOptions{}
	c := &cobra.Command{
		Use:     "replay [--tenant=T] (--id=ID | --all | --month=YYYYMM)",
		Short:   "Re-inject compensation entries / dead letters into the message topic with their frozen month (idempotent)",
		Example: "  imshard dlq replay --id=dl-3-1187\n  imshard dlq replay --tenant=acme --all\n  imshard dlq replay --tenant=acme --month=202601",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			n := 0
			for _, set := range []bool{o.id != "", o.all, o.month != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return usagef("give exactly one of --id, --all or --month")
			}
			if o.month != "" {
				if o.tenant == "" {
					return usagef("--month needs --tenant")
				}
				if _, err := parseMonthFlag("month", o.month); err != nil {
					return err
				}
			}
			return g.withDLQ(o.tenant, false, func(ctx context.Context, tool *persist.Tool) error {
				rep, err := tool.Replay(ctx, persist.ReplayOptions{Tenant: o.tenant, ID: o.id, All: o.all, Month: o.month})
				fmt.Fprintf(g.stdout, "replayed %d\n", rep.Replayed)
				for _, s := range rep.Skipped {
					fmt.Fprintf(g.stdout, "skipped %s\n", s)
				}
				return err
			})
		},
	}
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	c.Flags().StringVar(&o.id, "id", "", "one entry: its `ID` as imshard dlq list prints it (comp-TENANT-N or dl-PARTITION-OFFSET)")
	c.Flags().BoolVar(&o.all, "all", false, "every pending compensation entry and every dead letter that is not malformed")
	c.Flags().StringVar(&o.month, "month", "", "the late events of one month `YYYYMM` (with --tenant): a sealed month is reopened first and sealed again once they are stored")
	return c
}
