package cmd

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/routing"
)

type shardArchiveOptions struct {
	monthOptions
	dryRun bool
}

func newShardArchiveCmd(g *globals) *cobra.Command {
	o := &shardArchiveOptions{}
	c := &cobra.Command{
		Use:   "archive --tenant=T --month=YYYYMM [--dry-run]",
		Short: "Export a sealed, complete month to archive.url as Parquet with a manifest, and verify it against the table",
		Long: `Checks that the month is sealed and proven complete, hashes every topic of its
table, writes the month as Parquet (zstd, (topic, seqid) order, bloom filter on topic)
and a JSON manifest to archive.url, reads the archive back and compares it with the
table, then marks the month archived (read from its archive from then on). Each
step is recorded in the tenant's im_archives table: run the command again after
an interruption and it resumes. Once archive.keep_table (at least the catalog
caches' settle time) has passed since the mark, the month's table is dropped
by the shard manager's patrol, or by this command run again for the month.
--dry-run only runs the checks and counts. Until the drop the month table is
read, never changed.`,
		Example: "  imshard shard archive --tenant=acme --month=202601 --dry-run\n  imshard shard archive --tenant=acme --month=202601",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			m, err := parseMonthFlag("month", o.month)
			if err != nil {
				return err
			}
			return g.withTools(o.dryRun, func(ctx context.Context, cfg *config.Config, a *app.App) error {
				if _, err := tenantsFor(cfg, o.tenant); err != nil {
					return err
				}
				rep, err := a.NewArchiver().Archive(ctx, o.tenant, m, o.dryRun)
				if err != nil {
					return fmt.Errorf("archive %s for %s: %w", m, o.tenant, err)
				}
				if rep.DryRun && rep.Step == archive.StepMarked {
					fmt.Fprintf(g.stdout, "tenant %s: month %s is archived already: %d rows in %d topics, %d bytes at %s\n",
						o.tenant, m, rep.Rows, rep.Topics, rep.Bytes, rep.Key)
					return nil
				}
				if rep.DryRun {
					fmt.Fprintf(g.stdout, "tenant %s: month %s can be archived: %d rows in %d topics (step so far: %s)\n",
						o.tenant, m, rep.Rows, rep.Topics, orDash(rep.Step))
					return nil
				}
				fmt.Fprintf(g.stdout, "tenant %s: month %s %s: %d rows in %d topics, %d bytes at %s\n",
					o.tenant, m, rep.Step, rep.Rows, rep.Topics, rep.Bytes, rep.Key)
				switch {
				case rep.TableDropped:
					fmt.Fprintf(g.stdout, "tenant %s: month %s: table %s dropped; the month is read from its archive\n", o.tenant, m, archiveTable(m))
				case rep.Step == archive.StepMarked:
					fmt.Fprintf(g.stdout, "tenant %s: month %s: table %s (if still there) is dropped once archive.keep_table (%s, at least %s) has passed since the mark and send.idempotency_ttl + send.produce_timeout (%s) since the month's end, by the shard manager's patrol or by this command run again\n",
						o.tenant, m, archiveTable(m), cfg.Archive.KeepTable, routing.RestoreSettle, cfg.Send.IdempotencyTTL+cfg.Send.ProduceTimeout)
				}
				return nil
			})
		},
	}
	o.bind(c)
	c.Flags().BoolVar(&o.dryRun, "dry-run", false, "only check and count; write nothing")
	return c
}

// archiveTable is month m's table name.
func archiveTable(m routing.Month) string {
	t, err := routing.TableFor(m)
	if err != nil {
		return m.String()
	}
	return t.Name()
}

// archiveText is a month's archive progress in `shard list` ("" when the
// archive never touched it).
func archiveText(p archive.Progress) string {
	if p.Step == "" {
		return ""
	}
	s := fmt.Sprintf("%s, %d rows, %d bytes", p.Step, p.Rows, p.Bytes)
	if p.LastError != "" {
		s += "; last error: " + p.LastError
	}
	return s
}
