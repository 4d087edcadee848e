package migrate

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/imshard/imshard/modules/routing"
)

type metrics struct {
	rows      *prometheus.CounterVec
	failures  *prometheus.CounterVec
	rate      *prometheus.GaugeVec
	achieved  *prometheus.GaugeVec
	limit     *prometheus.GaugeVec
	remaining *prometheus.GaugeVec
	lastBatch *prometheus.GaugeVec
	diffs     *prometheus.GaugeVec
	state     *prometheus.GaugeVec
}

// states are the values of imshard_migrate_state's state label.
var states = []routing.MigrationState{routing.MigrationPlanned, routing.MigrationCutover, routing.MigrationBackfilling,
	routing.MigrationPaused, routing.MigrationVerifying, routing.MigrationDone, routing.MigrationFinished}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		rows:      f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_migrate_rows_total", Help: "Legacy rows the backfill handled, by result: inserted into a month table, already present, skewed (created_at month differs from the month its seq range went to; counted besides inserted or present)."}, []string{"tenant", "result"}),
		failures:  f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_migrate_batch_failures_total", Help: "Backfill batches that failed and are retried."}, []string{"tenant"}),
		rate:      f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_rows_per_second", Help: "Rows per second of the last backfill batch alone (throttle waits excluded): what the database gave the copy."}, []string{"tenant"}),
		achieved:  f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_achieved_rows_per_second", Help: "Rows per second the backfill copied over the last 10 s, throttle waits included (0 while it does not copy); compare with imshard_migrate_rows_per_second_limit."}, []string{"tenant"}),
		limit:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_rows_per_second_limit", Help: "Rows per second the backfill is allowed (migrate.rows_per_second of the process copying; 0: unthrottled)."}, []string{"tenant"}),
		remaining: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_lag_rows", Help: "Legacy rows the backfill has still to read (behind the legacy table's max message_id at cutover)."}, []string{"tenant"}),
		lastBatch: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_last_batch_timestamp_seconds", Help: "Unix time of the tenant's last committed backfill batch in this process."}, []string{"tenant"}),
		diffs:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_verify_differences", Help: "Topic months the last verification found different (finish refuses while any remain)."}, []string{"tenant"}),
		state:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_migrate_state", Help: "1 for the tenant's migration state, 0 for the others (all 0: no migration)."}, []string{"tenant", "state"}),
	}
	return m
}

// ExportTenants creates the tenant-labelled series at 0 (an existing series
// keeps its value): a tenant without a migration has no rows left, no
// differences and no batch yet (last batch time 0: never).
func (mg *Migrator) ExportTenants(tenants []string) {
	for _, t := range tenants {
		for _, r := range []string{"inserted", "present", "skewed"} {
			mg.m.rows.WithLabelValues(t, r)
		}
		for _, g := range []*prometheus.GaugeVec{mg.m.rate, mg.m.remaining, mg.m.lastBatch, mg.m.diffs} {
			g.WithLabelValues(t)
		}
		mg.m.failures.WithLabelValues(t)
		mg.m.limit.WithLabelValues(t).Set(float64(mg.p.Config.RowsPerSecond))
		mg.m.observe(t, routing.MigrationNone)
	}
}

func (m *metrics) observe(tenant string, s routing.MigrationState) {
	for _, st := range states {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(tenant, string(st)).Set(v)
	}
	if s != routing.MigrationBackfilling {
		// nothing is copied: no rate to show
		m.achieved.WithLabelValues(tenant).Set(0)
	}
}

// export publishes what the tenant's migration row says.
func (m *metrics) export(tenant string, mig routing.Migration) {
	m.observe(tenant, mig.State)
	if mig.State == routing.MigrationNone {
		return
	}
	m.remaining.WithLabelValues(tenant).Set(float64(max(mig.LegacyRows-mig.RowsRead, 0)))
	m.diffs.WithLabelValues(tenant).Set(float64(mig.VerifyDiffs))
}
