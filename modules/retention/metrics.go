package retention

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	runs          *prometheus.CounterVec
	lastSuccess   *prometheus.GaugeVec
	rowsRemoved   *prometheus.CounterVec
	monthsDropped *prometheus.CounterVec
	behind        *prometheus.GaugeVec
	dropDuration  prometheus.Histogram

	jobsRunning *prometheus.GaugeVec
	jobRows     *prometheus.CounterVec
	jobFailures *prometheus.CounterVec
	jobsStalled *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		runs:          f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_retention_runs_total", Help: "Retention runs by tenant and result (ok, failed)."}, []string{"tenant", "result"}),
		lastSuccess:   f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_retention_last_success_timestamp_seconds", Help: "Unix time of the tenant's last retention run that removed everything its plan named (0: never)."}, []string{"tenant"}),
		rowsRemoved:   f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_retention_rows_removed_total", Help: "Message rows removed past retention, by how: drop (a whole month table) or trim (one topic's rows in batches)."}, []string{"tenant", "how"}),
		monthsDropped: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_retention_months_dropped_total", Help: "Month tables dropped whole past retention."}, []string{"tenant"}),
		behind:        f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_retention_months_behind", Help: "Months past retention that the tenant's last retention run left in place (not sealed yet, archived, or its removal failed)."}, []string{"tenant"}),
		dropDuration:  f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_retention_drop_duration_seconds", Help: "Time to remove one expired month whole: floors, side rows, routes, mirror and the DROP TABLE.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		jobsRunning:   f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_jobs_running", Help: "Jobs (group purges, user erases) this process runs now, by tenant."}, []string{"tenant"}),
		jobRows:       f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_jobs_rows_removed_total", Help: "Message rows removed (purge) or made tombstones (erase) by jobs, by tenant and kind."}, []string{"tenant", "kind"}),
		jobFailures:   f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_jobs_failures_total", Help: "Jobs that ended failed, by tenant."}, []string{"tenant"}),
		jobsStalled:   f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_jobs_stalled", Help: "The tenant's queued or running jobs without progress for 15 minutes (no shard manager runs them, or their runner hangs)."}, []string{"tenant"}),
	}
}

// ExportTenants creates the tenant-labelled series at 0, so an alert sees a
// tenant's first failure as an increase and a tenant never retained as
// such.
func (r *Retention) ExportTenants(tenants []string) {
	for _, t := range tenants {
		r.m.runs.WithLabelValues(t, "ok")
		r.m.runs.WithLabelValues(t, "failed")
		r.m.lastSuccess.WithLabelValues(t).Add(0)
		r.m.behind.WithLabelValues(t).Add(0)
		r.m.rowsRemoved.WithLabelValues(t, "drop")
		r.m.rowsRemoved.WithLabelValues(t, "trim")
		r.m.monthsDropped.WithLabelValues(t)
		r.m.jobsRunning.WithLabelValues(t).Add(0)
		r.m.jobRows.WithLabelValues(t, KindPurge)
		r.m.jobRows.WithLabelValues(t, KindErase)
		r.m.jobFailures.WithLabelValues(t)
		r.m.jobsStalled.WithLabelValues(t).Add(0)
	}
}
