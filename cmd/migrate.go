package cmd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/migrate"
	"github.com/imshard/imshard/modules/routing"
)

func newMigrateCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "migrate",
		Short: "Migrate a live tenant from the legacy single table into month tables",
		Long: `The commands record the operator's intent in the tenant's database; a process
running the migrate role (imshard all, or serve --roles=migrate) does the work —
the backfill, the route rebuild, the verification — and survives restarts.
See docs/migration.md for the states and the order of the steps.`,
		Example: "  imshard migrate plan --tenant=acme\n  imshard migrate start --tenant=acme --yes\n  imshard migrate status --tenant=acme --watch",
	}
	c.AddCommand(
		newMigratePlanCmd(g),
		newMigrateStartCmd(g),
		newMigrateStatusCmd(g),
		newMigrateStepCmd(g, "pause", "Pause the backfill after its current batch", (*migrate.Migrator).Pause),
		newMigrateStepCmd(g, "resume", "Let a paused backfill go on from its last committed batch", (*migrate.Migrator).Resume),
		newMigrateStepCmd(g, "verify", "Run the verification again (the module runs it after the backfill by itself)", (*migrate.Migrator).Verify),
		newMigrateStepCmd(g, "finish", "Stop the dual read and rename the legacy table to im_group_messages_legacy (needs a passed verification)", (*migrate.Migrator).Finish),
		newMigrateStepCmd(g, "abort", "Drop a plan before its cutover: the tenant is served as before, the plan's empty month tables dropped",
			func(mg *migrate.Migrator, ctx context.Context, tenant string) (routing.Migration, error) {
				rep, err := mg.Abort(ctx, tenant)
				if err == nil && len(rep.Dropped)+len(rep.Kept) > 0 {
					fmt.Fprintf(g.stdout, "tenant %s: month tables the plan created: dropped %s; kept %s\n", tenant, months(rep.Dropped), months(rep.Kept))
				}
				return rep.Migration, err
			}),
	)
	return c
}

// withMigrator loads config, starts the tool modules (read-only for a
// command that only looks) and hands the migrator to fn; a refusal is a
// failure (exit 1) that changed nothing.
func (g *globals) withMigrator(tenant string, readOnly bool, fn func(ctx context.Context, cfg *config.Config, mg *migrate.Migrator) error) error {
	return g.withTools(readOnly, func(ctx context.Context, cfg *config.Config, a *app.App) error {
		if tenant != "" {
			if _, err := tenantsFor(cfg, tenant); err != nil {
				return err
			}
		}
		return fn(ctx, cfg, a.NewMigrator())
	})
}

func newMigratePlanCmd(g *globals) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:   "plan --tenant=T",
		Short: "Plan a migration: dual reads begin, sends and changes are refused, month tables are created",
		Long: `Reads the legacy table's month range, creates the month tables of every
legacy month through the next one, records the plan and reports the rows per
month and the topics that still lack a group in imshard. From here on the
tenant's reads include the legacy table and its sends answer 503 until
` + "`migrate start`" + `. It returns once the tenant's write gate in Redis, which
every send and change reads, refuses them: no process takes one after that,
however old its own copy of the state.`,
		Example: "  imshard migrate plan --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return g.withMigrator(tenant, false, func(ctx context.Context, _ *config.Config, mg *migrate.Migrator) error {
				rep, err := mg.Plan(ctx, tenant)
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "MONTH\tLEGACY ROWS")
				for _, m := range rep.Months {
					fmt.Fprintf(w, "%s\t%d\n", m.Month, m.Rows)
				}
				_ = w.Flush()
				fmt.Fprintf(g.stdout, "tenant %s: planned: %d rows, %d topics, months %s..%s (tables created through the next month)\n",
					tenant, rep.Rows, rep.Topics, rep.From, rep.To)
				if len(rep.BadTopics) > 0 {
					fmt.Fprintf(g.stdout, "topics with names imshard refuses (start refuses until they are renamed): %s\n", strings.Join(rep.BadTopics, ", "))
				}
				if len(rep.MissingGroups) > 0 {
					fmt.Fprintf(g.stdout, "topics without a group in imshard (load them with PUT /v1/topics/{topic} and their members; start refuses until then): %s\n",
						strings.Join(rep.MissingGroups, ", "))
				} else {
					fmt.Fprintf(g.stdout, "every topic has a group; next: stop the legacy writers, then imshard migrate start --tenant=%s\n", tenant)
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (required)")
	_ = c.MarkFlagRequired("tenant")
	return c
}

func newMigrateStartCmd(g *globals) *cobra.Command {
	var tenant string
	var yes bool
	c := &cobra.Command{
		Use:   "start --tenant=T [--yes]",
		Short: "Cut over: record cutover seqs, raise seq reservations, open writes; the migrate module backfills",
		Long: `Confirm that the old system no longer writes the legacy table (a prompt on a
terminal, --yes in scripts). The cutover records each topic's cutover_seq and
month ranges, raises the topic's durable seq reservation above it and makes its
Redis counter re-seed from there; then imshard takes the tenant's sends (into
month tables only) and the migrate module starts the backfill.`,
		Example: "  imshard migrate start --tenant=acme --yes",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if !yes {
				ok, err := confirm(c.InOrStdin(), g.stdout, fmt.Sprintf("Are the legacy writers of tenant %s stopped? [y/N] ", tenant))
				if err != nil {
					return err
				}
				if !ok {
					return errors.New("not confirmed: nothing changed")
				}
			}
			return g.withMigrator(tenant, false, func(ctx context.Context, _ *config.Config, mg *migrate.Migrator) error {
				_, err := mg.Start(ctx, tenant, func(format string, args ...any) {
					fmt.Fprintf(g.stdout, "tenant %s: %s\n", tenant, fmt.Sprintf(format, args...))
				})
				return err
			})
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (required)")
	c.Flags().BoolVar(&yes, "yes", false, "the legacy writers are stopped: skip the prompt")
	_ = c.MarkFlagRequired("tenant")
	return c
}

// confirm asks on a terminal; without one it refuses (scripts pass --yes).
func confirm(in io.Reader, out io.Writer, question string) (bool, error) {
	f, ok := in.(*os.File)
	if !ok || !isatty.IsTerminal(f.Fd()) {
		return false, usagef("not a terminal: confirm with --yes that the legacy writers are stopped")
	}
	return confirmLine(in, out, question)
}

// confirmLine asks question and reads a yes or no.
func confirmLine(in io.Reader, out io.Writer, question string) (bool, error) {
	fmt.Fprint(out, question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && line == "" {
		return false, nil
	}
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes", nil
}

func newMigrateStepCmd(g *globals, name, short string, fn func(*migrate.Migrator, context.Context, string) (routing.Migration, error)) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:     name + " --tenant=T",
		Short:   short,
		Example: "  imshard migrate " + name + " --tenant=acme",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return g.withMigrator(tenant, false, func(ctx context.Context, _ *config.Config, mg *migrate.Migrator) error {
				m, err := fn(mg, ctx, tenant)
				if err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "tenant %s: %s\n", tenant, m.State)
				return nil
			})
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (required)")
	_ = c.MarkFlagRequired("tenant")
	return c
}

func newMigrateStatusCmd(g *globals) *cobra.Command {
	var tenant string
	var watch bool
	var every time.Duration
	var out outputOptions
	c := &cobra.Command{
		Use:   "status [--tenant=T] [--watch] [--interval=D] [--output=json]",
		Short: "Show a tenant's migration (every tenant's without --tenant)",
		Long: `Shows the state, the backfill's progress and counts, and the differences the
last verification found. --watch repeats it until the migration is done (a
progress bar with rate and ETA on a terminal, a plain line per interval
otherwise).`,
		Example: "  imshard migrate status\n  imshard migrate status --tenant=acme --watch\n  imshard migrate status --output=json",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if every <= 0 {
				return usagef("--interval must be positive, got %v", every)
			}
			if watch && tenant == "" {
				return usagef("--watch needs --tenant")
			}
			if err := out.validate(); err != nil {
				return err
			}
			if watch && out.json() {
				return usagef("--watch draws for people; a script polls --output=json")
			}
			return g.withMigrator(tenant, true, func(ctx context.Context, cfg *config.Config, mg *migrate.Migrator) error {
				if out.json() {
					return g.migrationsJSON(ctx, cfg, mg, tenant)
				}
				if watch {
					return g.watchMigration(ctx, mg, tenant, every)
				}
				if tenant == "" {
					return g.listMigrations(ctx, cfg, mg)
				}
				st, err := mg.Status(ctx, tenant)
				if err != nil {
					return err
				}
				g.printStatus(st)
				return nil
			})
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "only this tenant, in detail")
	c.Flags().BoolVar(&watch, "watch", false, "repeat until the migration is done, verified or failed")
	c.Flags().DurationVar(&every, "interval", 2*time.Second, "how often --watch refreshes")
	out.bind(c)
	return c
}

// migrationJSON is one tenant in `migrate status --output=json`.
type migrationJSON struct {
	Tenant            string              `json:"tenant"`
	State             string              `json:"state"`
	LegacyRows        int64               `json:"legacy_rows"`
	MinMonth          string              `json:"min_month"`
	MaxMonth          string              `json:"max_month"`
	RowsRead          int64               `json:"rows_read"`
	RowsInserted      int64               `json:"rows_inserted"`
	RowsPresent       int64               `json:"rows_present"`
	RowsSkewed        int64               `json:"rows_skewed"`
	Batches           int64               `json:"batches"`
	BatchFailures     int64               `json:"batch_failures"`
	RoutesDone        bool                `json:"routes_done"`
	VerifyRuns        int                 `json:"verify_runs"`
	VerifyPending     bool                `json:"verify_pending"`
	VerifyDifferences int                 `json:"verify_differences"`
	Differences       []migrationDiffJSON `json:"differences"`
	Locked            bool                `json:"locked"`
	LastError         string              `json:"last_error"`
	PlannedAt         *string             `json:"planned_at"`
	CutoverAt         *string             `json:"cutover_at"`
	UpdatedAt         *string             `json:"updated_at"`
	Error             string              `json:"error,omitempty"`
}

type migrationDiffJSON struct {
	Topic      string `json:"topic"`
	Month      string `json:"month"`
	MinSeq     int64  `json:"min_seq"`
	MaxSeq     int64  `json:"max_seq"`
	LegacyRows int64  `json:"legacy_rows"`
	MonthRows  int64  `json:"month_rows"`
}

// migrationsJSON prints the migration of tenant (every tenant's when
// empty) as one JSON document; a tenant it could not read fails (exit 1).
func (g *globals) migrationsJSON(ctx context.Context, cfg *config.Config, mg *migrate.Migrator, tenant string) error {
	tenants, err := tenantsFor(cfg, tenant)
	if err != nil {
		return err
	}
	out := []migrationJSON{}
	var errs []error
	for _, t := range tenants {
		st, err := mg.Status(ctx, t)
		if err != nil {
			out = append(out, migrationJSON{Tenant: t, State: "unknown", Differences: []migrationDiffJSON{}, Error: err.Error()})
			errs = append(errs, fmt.Errorf("tenant %s: %w", t, err))
			continue
		}
		m := st.Migration
		j := migrationJSON{Tenant: t, State: string(m.State), LegacyRows: m.LegacyRows, MinMonth: m.MinMonth.String(),
			MaxMonth: m.MaxMonth.String(), RowsRead: m.RowsRead, RowsInserted: m.RowsInserted, RowsPresent: m.RowsPresent,
			RowsSkewed: m.RowsSkewed, Batches: m.Batches, BatchFailures: m.BatchFailures, RoutesDone: m.RoutesDone,
			VerifyRuns: m.VerifyRuns, VerifyPending: m.VerifyPending, VerifyDifferences: m.VerifyDiffs,
			Differences: []migrationDiffJSON{}, Locked: st.Locked, LastError: m.LastError,
			PlannedAt: jsonTime(!m.PlannedAt.IsZero(), m.PlannedAt), CutoverAt: jsonTime(m.CutoverAt.Valid, m.CutoverAt.Time),
			UpdatedAt: jsonTime(!m.UpdatedAt.IsZero(), m.UpdatedAt)}
		if m.State == routing.MigrationNone {
			j.State = "none"
		}
		for _, d := range st.Diffs {
			j.Differences = append(j.Differences, migrationDiffJSON{Topic: d.Topic, Month: d.Month.String(), MinSeq: d.MinSeq,
				MaxSeq: d.MaxSeq, LegacyRows: d.LegacyRows, MonthRows: d.MonthRows})
		}
		out = append(out, j)
	}
	if err := writeJSON(g.stdout, map[string]any{"tenants": out}); err != nil {
		return err
	}
	return errors.Join(errs...)
}

func (g *globals) listMigrations(ctx context.Context, cfg *config.Config, mg *migrate.Migrator) error {
	w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TENANT\tSTATE\tCOPIED\tLEGACY ROWS\tDIFFERENCES\tUPDATED")
	var errs []error
	for _, t := range cfg.Tenants {
		st, err := mg.Status(ctx, t.ID)
		if err != nil {
			fmt.Fprintf(w, "%s\tERROR: %v\t\t\t\t\n", t.ID, err)
			errs = append(errs, fmt.Errorf("tenant %s: %w", t.ID, err))
			continue
		}
		m := st.Migration
		if m.State == routing.MigrationNone {
			fmt.Fprintf(w, "%s\tnone\t-\t-\t-\t-\n", t.ID)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\n", t.ID, m.State, m.RowsRead, m.LegacyRows, m.VerifyDiffs,
			m.UpdatedAt.UTC().Format(time.RFC3339))
	}
	_ = w.Flush()
	return errors.Join(errs...)
}

func (g *globals) printStatus(st migrate.Status) {
	m := st.Migration
	out := g.stdout
	if m.State == routing.MigrationNone {
		fmt.Fprintf(out, "tenant %s: no migration\n", st.Tenant)
		return
	}
	fmt.Fprintf(out, "tenant %s: %s\n", st.Tenant, m.State)
	fmt.Fprintf(out, "  legacy rows %d, months %s..%s, planned %s\n", m.LegacyRows, m.MinMonth, m.MaxMonth, m.PlannedAt.UTC().Format(time.RFC3339))
	if m.CutoverAt.Valid {
		fmt.Fprintf(out, "  cutover_time %s\n", m.CutoverAt.Time.UTC().Format(time.RFC3339Nano))
	}
	if m.State.AfterCutover() {
		fmt.Fprintf(out, "  copied %d/%d (%s): inserted %d, already present %d, skewed %d; %d batches, %d failed\n",
			m.RowsRead, m.LegacyRows, percent(m.RowsRead, m.LegacyRows), m.RowsInserted, m.RowsPresent, m.RowsSkewed, m.Batches, m.BatchFailures)
		fmt.Fprintf(out, "  cursor message_id %d of %d; routes rebuilt: %v; backfill lock held: %v\n", m.CursorID, m.LegacyMax, m.RoutesDone, st.Locked)
	}
	if m.State == routing.MigrationBackfilling && m.Batches > 0 {
		fmt.Fprintf(out, "  pace (as of %s): %s\n", m.UpdatedAt.UTC().Format(time.RFC3339), pace(m))
	}
	if m.LastError != "" {
		fmt.Fprintf(out, "  last error: %s\n", m.LastError)
	}
	if m.VerifyRuns > 0 {
		fmt.Fprintf(out, "  verifications %d, differences %d\n", m.VerifyRuns, m.VerifyDiffs)
		for _, d := range st.Diffs {
			fmt.Fprintf(out, "    topic %s month %s seqs %d..%d: legacy %d rows (%s…), month table %d rows (%s…)\n",
				d.Topic, d.Month, d.MinSeq, d.MaxSeq, d.LegacyRows, d.LegacyHash[:12], d.MonthRows, d.MonthHash[:12])
		}
	}
}

// pace is the copy rate the copying process recorded, beside its limit
// and the rate of its batches alone.
func pace(m routing.Migration) string {
	limit := "unthrottled"
	if m.RateLimit > 0 {
		limit = fmt.Sprintf("%d allowed", m.RateLimit)
	}
	return fmt.Sprintf("%d rows/s achieved over the last 10 s (%s), batches alone %d rows/s: %s",
		m.RateAchieved, limit, m.RateBatch, migrate.Pace(m.RateLimit, float64(m.RateAchieved), float64(m.RateBatch)))
}

func percent(n, of int64) string {
	if of <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// watchMigration repeats the status until the migration stops moving on
// its own: a progress bar with rate and ETA on a terminal, a line per
// interval otherwise.
func (g *globals) watchMigration(ctx context.Context, mg *migrate.Migrator, tenant string, every time.Duration) error {
	f, ok := g.stdout.(*os.File)
	tty := ok && isatty.IsTerminal(f.Fd())
	var lastRows int64
	var lastAt time.Time
	for {
		st, err := mg.Status(ctx, tenant)
		if err != nil {
			return err
		}
		m := st.Migration
		now := time.Now()
		rate := 0.0
		if !lastAt.IsZero() {
			rate = float64(m.RowsRead-lastRows) / now.Sub(lastAt).Seconds()
		}
		lastRows, lastAt = m.RowsRead, now
		eta := "-"
		if rate > 0 && m.LegacyRows > m.RowsRead {
			eta = (time.Duration(float64(m.LegacyRows-m.RowsRead)/rate) * time.Second).Round(time.Second).String()
		}
		limit := ""
		if m.State == routing.MigrationBackfilling && m.RateLimit > 0 {
			limit = fmt.Sprintf(" (limit %d)", m.RateLimit)
		}
		line := fmt.Sprintf("%s %d/%d rows %s, %.0f rows/s%s, ETA %s, differences %d",
			m.State, m.RowsRead, m.LegacyRows, percent(m.RowsRead, m.LegacyRows), rate, limit, eta, m.VerifyDiffs)
		if tty {
			fmt.Fprintf(g.stdout, "\r%s %s\x1b[K", bar(m.RowsRead, m.LegacyRows, 30), line)
		} else {
			fmt.Fprintln(g.stdout, now.UTC().Format(time.RFC3339), tenant, line)
		}
		switch {
		case m.State == routing.MigrationNone, m.State == routing.MigrationDone, m.State == routing.MigrationFinished,
			m.State == routing.MigrationVerifying && !m.VerifyPending:
			if tty {
				fmt.Fprintln(g.stdout)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(g.stdout)
			}
			return nil
		case <-time.After(every):
		}
	}
}

func bar(n, of int64, width int) string {
	filled := 0
	if of > 0 {
		filled = int(min(n, of) * int64(width) / of)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]"
}

// months lists months for a report line ("none" for none).
func months(ms []routing.Month) string {
	if len(ms) == 0 {
		return "none"
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return strings.Join(out, ", ")
}
