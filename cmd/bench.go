package cmd

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/bench"
	"github.com/imshard/imshard/modules/routing"
	imsql "github.com/imshard/imshard/sql"
)

// newBenchCmd is the parent of the benchmarks; each measures a path beside
// its raw limit on the same services in the same run (docs/performance.md).
func newBenchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "Measure a path beside its raw limit on the same services",
		Example: "  imshard bench send --duration=10s\n  imshard bench query --only='raw SQL'\n  imshard bench rotation\n  imshard bench archive --rows=100000 --topics=100\n  imshard bench move --rows=200000 --topics=200\n  imshard bench retention",
	}
	c.AddCommand(newBenchSendCmd(g), newBenchQueryCmd(g), newBenchPersistCmd(g), newBenchInboxCmd(g), newBenchStreamCmd(g), newBenchMigrateCmd(g), newBenchLimitsCmd(g), newBenchRotationCmd(g), newBenchArchiveCmd(g), newBenchMoveCmd(g), newBenchRetentionCmd(g))
	return c
}

// benchTenant makes id one of cfg's tenants with a fresh random secret (a
// configured tenant of that id is replaced) and returns the secret: a
// benchmark works in a tenant of its own. Its rate limits are off: a
// benchmark measures a path at the speed of the machine, and one that
// measures limits sets its own.
func benchTenant(cfg *config.Config, id string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	secret := hex.EncodeToString(b[:])
	tenants := cfg.Tenants[:0:0]
	for _, t := range cfg.Tenants {
		if t.ID != id {
			tenants = append(tenants, t)
		}
	}
	off := &config.Rate{}
	cfg.Tenants = append(tenants, config.Tenant{ID: id, JWTSecret: secret, Limits: config.TenantLimits{
		Send: config.TenantSendLimits{Tenant: off, User: off, Topic: off}, Reads: off, Changes: off}})
	return secret
}

// benchKafka points k at an in-process Kafka kept in memory when it names
// no brokers (nothing to clean up; the bench's own roles and clients reach
// it) and returns what stops it.
func benchKafka(k *config.Kafka) (stop func(), err error) {
	if len(k.Brokers) > 0 {
		return func() {}, nil
	}
	k.DataDir = ""
	cluster, private, err := app.StartPrivateKafka(*k)
	if err != nil {
		return nil, err
	}
	*k = private
	return cluster.Close, nil
}

// benchFlags are the flags the benches share: the tenant a bench works in
// and a CPU profile of its run. A bench's options embed them, declare
// the ones it has with tenantFlag and cpuProfileFlag (or both at once
// with ownTenant) and hand them to runBench, which checks the tenant
// before anything starts.
type benchFlags struct {
	tenant     string
	cpuProfile string
	hasTenant  bool // --tenant is declared
}

// The help of the shared flags as most benches word it.
const (
	ownTenantHelp  = "the benchmark's own tenant (its database is dropped afterwards)"
	cpuProfileHelp = "write a CPU profile of the whole run to this file"
)

// tenantFlag declares --tenant, naming def by default.
func (f *benchFlags) tenantFlag(c *cobra.Command, def, help string) {
	c.Flags().StringVar(&f.tenant, "tenant", def, help)
	f.hasTenant = true
}

// cpuProfileFlag declares --cpuprofile.
func (f *benchFlags) cpuProfileFlag(c *cobra.Command, help string) {
	c.Flags().StringVar(&f.cpuProfile, "cpuprofile", "", help)
}

// ownTenant declares --tenant (a tenant of the bench's own, named def by
// default) and --cpuprofile with their usual help.
func (f *benchFlags) ownTenant(c *cobra.Command, def string) {
	f.tenantFlag(c, def, ownTenantHelp)
	f.cpuProfileFlag(c, cpuProfileHelp)
}

// checkTenant refuses a --tenant that cannot name a tenant.
func (f *benchFlags) checkTenant() error {
	if !f.hasTenant {
		return nil
	}
	if err := routing.ValidTenant(f.tenant); err != nil {
		return usagef("--tenant: %v", err)
	}
	return nil
}

// runBench checks f's tenant, loads the configuration, runs a bench until
// it ends or a signal stops it (profiling the CPU into f's --cpuprofile
// when set) and prints its report.
func runBench[R any](g *globals, f *benchFlags,
	run func(context.Context, *config.Config) (R, error), print func(io.Writer, R)) error {
	if err := f.checkTenant(); err != nil {
		return err
	}
	cfg, err := g.load(nil)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return withCPUProfile(f.cpuProfile, func() error {
		rep, err := run(ctx, cfg)
		if err != nil {
			return err
		}
		print(g.stdout, rep)
		return nil
	})
}

// withCPUProfile runs fn, profiling the CPU into path when it is set.
func withCPUProfile(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return fn()
}

// dropBenchTenant drops a bench tenant's database (db is a pool of it) and
// its Redis keys: a benchmark leaves nothing behind unless told to keep it.
func dropBenchTenant(ctx context.Context, a *app.App, db *sql.DB, tenant string) error {
	ctx = context.WithoutCancel(ctx)
	return errors.Join(bench.DropFixtures(ctx, db, func(name string) string {
		return strings.Replace(imsql.DropDatabase(), imsql.DatabasePlaceholder, name, 1)
	}), a.KeySpace().DropTenantKeys(ctx, a.Redis(), tenant))
}

// verdict is how a bench line reads a bar.
func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
