package archive

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	rows           prometheus.Counter
	bytes          prometheus.Counter
	archived       prometheus.Counter
	verifyFailures prometheus.Counter
	exportSeconds  prometheus.Histogram
	failures       *prometheus.CounterVec
	monthsRestored prometheus.Counter
	rowsRestored   prometheus.Counter
	tablesDropped  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		rows:           f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_rows_exported_total", Help: "Month-table rows written to archives."}),
		bytes:          f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_bytes_written_total", Help: "Bytes of Parquet archives written."}),
		archived:       f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_months_verified_total", Help: "Month archives written and verified against their table."}),
		verifyFailures: f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_verify_failures_total", Help: "Archive verifications that found the archive differing from its month table (the month stays in MySQL)."}),
		failures:       f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_archive_failures_total", Help: "Patrol archive runs that failed (a month not finishing its archive: its step and last error are in shard list)."}, []string{"tenant"}),
		monthsRestored: f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_months_restored_total", Help: "Archived months restored to MySQL and verified (shard restore)."}),
		rowsRestored:   f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_rows_restored_total", Help: "Rows written back from archives into month tables by restores."}),
		tablesDropped:  f.NewCounter(prometheus.CounterOpts{Name: "imshard_archive_tables_dropped_total", Help: "Month tables dropped from MySQL after their month was archived, verified and marked (archive.keep_table after the mark)."}),
		exportSeconds:  f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_archive_export_seconds", Help: "Duration of one month's export.", Buckets: prometheus.ExponentialBuckets(0.1, 2, 14)}),
	}
}

// ExportTenants creates the tenant-labelled failure series at 0, so an
// alert sees a tenant's first failure as an increase.
func (a *Archiver) ExportTenants(tenants []string) {
	for _, t := range tenants {
		a.m.failures.WithLabelValues(t)
	}
}
