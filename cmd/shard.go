package cmd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/shardmgr"
)

func newShardCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "shard", Short: "Create, list, activate and seal month tables",
		Example: "  imshard shard ensure\n  imshard shard list --tenant=acme",
	}
	c.AddCommand(newShardEnsureCmd(g), newShardListCmd(g), newShardActivateCmd(g),
		newShardSealCmd(g, "seal"), newShardSealCmd(g, "unseal"), newShardArchiveCmd(g), newShardRestoreCmd(g))
	return c
}

// withShards loads config, starts the tool modules (read-only for a
// command that only looks) and hands the shard manager to fn; errors from
// fn are failures (exit 1).
func (g *globals) withShards(readOnly bool, fn func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error) error {
	return g.withTools(readOnly, func(ctx context.Context, cfg *config.Config, a *app.App) error {
		return fn(ctx, cfg, a.NewShardManager())
	})
}

// tenantsFor is every configured tenant, or the one named (which must exist).
func tenantsFor(cfg *config.Config, name string) ([]string, error) {
	var ids []string
	for _, t := range cfg.Tenants {
		ids = append(ids, t.ID)
	}
	if name == "" {
		return ids, nil
	}
	if !slices.Contains(ids, name) {
		return nil, usagef("--tenant %q is not configured (configured: %v)", name, ids)
	}
	return []string{name}, nil
}

func parseMonthFlag(flag, v string) (routing.Month, error) {
	m, err := routing.ParseMonth(v)
	if err != nil {
		return routing.Month{}, usagef("--%s: %v", flag, err)
	}
	return m, nil
}

type shardEnsureOptions struct {
	months int
	from   string
	tenant string
}

func newShardEnsureCmd(g *globals) *cobra.Command {
	o := &shardEnsureOptions{}
	c := &cobra.Command{
		Use:     "ensure [--months=N] [--from=YYYYMM] [--tenant=T]",
		Short:   "Create and register the previous, current and next N month tables of every tenant",
		Example: "  imshard shard ensure\n  imshard shard ensure --tenant=acme --months=3 --from=202601",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			opts := shardmgr.Options{MonthsAhead: -1}
			if c.Flags().Changed("months") {
				if o.months < 0 || o.months > 24 {
					return usagef("--months must be 0..24, got %d", o.months)
				}
				opts.MonthsAhead = o.months
			}
			if o.from != "" {
				m, err := parseMonthFlag("from", o.from)
				if err != nil {
					return err
				}
				opts.From = m
			}
			return g.withShards(false, func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error {
				tenants, err := tenantsFor(cfg, o.tenant)
				if err != nil {
					return err
				}
				results, err := mg.Sync(ctx, opts, tenants)
				for _, r := range results {
					status := "ok"
					if r.Err != nil {
						status = "FAILED: " + r.Err.Error()
					}
					fmt.Fprintf(g.stdout, "tenant %s: months %s..%s, created %d %v, active %s, %s\n",
						r.Tenant, first(r.Expected), last(r.Expected), len(r.Created), r.Created, orDash(r.Active.String()), status)
				}
				return err
			})
		},
	}
	c.Flags().IntVar(&o.months, "months", 0, "months after the current one (default shard.months_ahead)")
	c.Flags().StringVar(&o.from, "from", "", "also cover every month from YYYYMM on")
	c.Flags().StringVar(&o.tenant, "tenant", "", "only this tenant")
	return c
}

func first(ms []routing.Month) string {
	if len(ms) == 0 {
		return "-"
	}
	return ms[0].String()
}

func last(ms []routing.Month) string {
	if len(ms) == 0 {
		return "-"
	}
	return ms[len(ms)-1].String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type shardListOptions struct {
	tenant string
	out    outputOptions
}

// shardJSON is one month table in `shard list --output=json`.
type shardJSON struct {
	Tenant       string  `json:"tenant"`
	Month        string  `json:"month"`
	Table        string  `json:"table"`
	Status       string  `json:"status"`
	Exists       bool    `json:"exists"`
	Active       bool    `json:"active"`
	Rows         int64   `json:"rows"`
	MinCreatedAt *string `json:"min_created_at"`
	MaxCreatedAt *string `json:"max_created_at"`
	SealWait     *string `json:"seal_wait"` // why a sealing month past its grace is not sealed yet
	Archive      *string `json:"archive"`   // the archive step reached (with its last error)
}

func newShardListCmd(g *globals) *cobra.Command {
	o := &shardListOptions{}
	c := &cobra.Command{
		Use:   "list [--tenant=T] [--output=json]",
		Short: "List month tables: status, rows, min/max created_at (read-only)",
		Long: `Lists every registered month table of each tenant with its status, whether
it is the active month, its rows and the span of their created_at. It only
reads: a tenant whose database or schema does not exist yet is named with what
is missing (exit 1), never created — the shard manager or ` + "`imshard shard ensure`" + ` does that.`,
		Example: "  imshard shard list --tenant=acme\n  imshard shard list --output=json",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.out.validate(); err != nil {
				return err
			}
			return g.withTools(true, func(ctx context.Context, cfg *config.Config, a *app.App) error {
				mg := a.NewShardManager()
				tenants, err := tenantsFor(cfg, o.tenant)
				if err != nil {
					return err
				}
				rows := []shardJSON{}
				failed := []tenantError{}
				var errs, empty []string
				for _, t := range tenants {
					infos, err := mg.List(ctx, t)
					if err != nil {
						failed = append(failed, tenantError{Tenant: t, Error: err.Error()})
						errs = append(errs, fmt.Sprintf("tenant %s: %v", t, err))
						continue
					}
					if len(infos) == 0 {
						empty = append(empty, t)
					}
					progress, err := a.NewArchiver().Progress(ctx, t)
					if err != nil {
						failed = append(failed, tenantError{Tenant: t, Error: err.Error()})
						errs = append(errs, fmt.Sprintf("tenant %s: %v", t, err))
					}
					for _, in := range infos {
						rows = append(rows, shardJSON{Tenant: t, Month: in.Month.String(), Table: in.Table.Name(),
							Status: string(in.Status), Exists: in.Exists, Active: in.Active, Rows: in.Rows,
							MinCreatedAt: jsonTime(in.MinAt.Valid, in.MinAt.Time), MaxCreatedAt: jsonTime(in.MaxAt.Valid, in.MaxAt.Time),
							SealWait: orNil(in.SealWait), Archive: orNil(archiveText(progress[in.Month]))})
					}
				}
				if o.out.json() {
					if err := writeJSON(g.stdout, map[string]any{"shards": rows, "errors": failed}); err != nil {
						return err
					}
				} else if err := g.printShards(rows, empty); err != nil {
					return err
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

// printShards is the text of `shard list`; empty are the tenants with a
// database but no month table yet.
func (g *globals) printShards(rows []shardJSON, empty []string) error {
	tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tMONTH\tTABLE\tSTATUS\tACTIVE\tROWS\tMIN_CREATED_AT\tMAX_CREATED_AT")
	for _, r := range rows {
		active := ""
		if r.Active {
			active = "*"
		}
		status := r.Status
		switch {
		case !r.Exists && r.Status == string(routing.StatusArchived):
			status += " (table dropped)"
		case !r.Exists:
			status += " (TABLE MISSING)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Tenant, r.Month, r.Table, status, active, r.Rows,
			orDash(deref(r.MinCreatedAt)), orDash(deref(r.MaxCreatedAt)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.SealWait != nil {
			fmt.Fprintf(g.stdout, "tenant %s month %s waits to seal: %s\n", r.Tenant, r.Month, *r.SealWait)
		}
		if r.Archive != nil {
			fmt.Fprintf(g.stdout, "tenant %s month %s archive: %s\n", r.Tenant, r.Month, *r.Archive)
		}
	}
	for _, t := range empty {
		fmt.Fprintf(g.stdout, "tenant %s: no month table yet (the shard manager, or imshard shard ensure --tenant=%s, creates them)\n", t, t)
	}
	return nil
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func fmtTime(ok bool, t time.Time) string {
	if !ok {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

type monthOptions struct {
	tenant string
	month  string
}

func (o *monthOptions) bind(c *cobra.Command) {
	c.Flags().StringVar(&o.tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&o.month, "month", "", "month YYYYMM (required)")
	_ = c.MarkFlagRequired("tenant")
	_ = c.MarkFlagRequired("month")
}

func newShardActivateCmd(g *globals) *cobra.Command {
	return newShardMonthCmd(g, "activate",
		"Move the tenant's active month forward to a writable month (the only way with shard.auto_advance: false)",
		"  imshard shard activate --tenant=acme --month=202612",
		func(mg *shardmgr.Manager) func(context.Context, string, routing.Month) error { return mg.Activate },
		"active month %[2]s")
}

func newShardSealCmd(g *globals, verb string) *cobra.Command {
	short := "Seal a month: no more writes; late events go to the compensation queue"
	op := func(mg *shardmgr.Manager) func(context.Context, string, routing.Month) error { return mg.Seal }
	if verb == "unseal" {
		short = "Reopen a sealed month for late writes (its sealing grace restarts)"
		op = func(mg *shardmgr.Manager) func(context.Context, string, routing.Month) error { return mg.Unseal }
	}
	return newShardMonthCmd(g, verb, short, "  imshard shard "+verb+" --tenant=acme --month=202610", op,
		"month %[2]s %[1]sed")
}

// newShardMonthCmd is a command that applies one shard manager operation
// to one month of one tenant; done formats the line printed after it (%[1]s
// the verb, %[2]s the month).
func newShardMonthCmd(g *globals, verb, short, example string,
	op func(*shardmgr.Manager) func(context.Context, string, routing.Month) error, done string) *cobra.Command {
	o := &monthOptions{}
	c := &cobra.Command{
		Use:     verb + " --tenant=T --month=YYYYMM",
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			m, err := parseMonthFlag("month", o.month)
			if err != nil {
				return err
			}
			return g.withShards(false, func(ctx context.Context, cfg *config.Config, mg *shardmgr.Manager) error {
				if _, err := tenantsFor(cfg, o.tenant); err != nil {
					return err
				}
				if err := op(mg)(ctx, o.tenant, m); err != nil {
					return fmt.Errorf("%s %s for %s: %w", verb, m, o.tenant, err)
				}
				fmt.Fprintf(g.stdout, "tenant %s: %s\n", o.tenant, fmt.Sprintf(done, verb, m))
				return nil
			})
		},
	}
	o.bind(c)
	return c
}
