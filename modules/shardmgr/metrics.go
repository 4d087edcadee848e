package shardmgr

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/imshard/imshard/modules/routing"
)

type metrics struct {
	lastSuccess  *prometheus.GaugeVec
	ddlFailures  *prometheus.CounterVec
	created      *prometheus.CounterVec
	syncDuration prometheus.Histogram
	transitions  *prometheus.CounterVec
	readyAhead   *prometheus.GaugeVec
	activeLag    *prometheus.GaugeVec
	sealWaiting  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		lastSuccess:  f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_shardmgr_last_success_timestamp_seconds", Help: "Unix time of the last sync that left every expected month table of the tenant in place."}, []string{"tenant"}),
		ddlFailures:  f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_shardmgr_ddl_failures_total", Help: "Month-table DDL or catalog writes that failed (no month switch follows)."}, []string{"tenant"}),
		created:      f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_shardmgr_tables_created_total", Help: "Month tables created by the shard manager."}, []string{"tenant"}),
		syncDuration: f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_shardmgr_sync_duration_seconds", Help: "Duration of one tenant's shard sync.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
		transitions:  f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_shardmgr_transitions_total", Help: "Month status changes made by the shard manager, by target status."}, []string{"status"}),
		readyAhead:   f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_shardmgr_months_ready_ahead", Help: "Writable month tables after the current (Redis-time) month; 0 means next month's table is missing."}, []string{"tenant"}),
		activeLag:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_shardmgr_active_month_lag", Help: "Months the active month trails the Redis-time month (-1: no active month)."}, []string{"tenant"}),
		sealWaiting:  f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_shardmgr_seal_waiting_months", Help: "Months past their sealing grace that stay unsealed because they are not proven complete, by the first failing check (consumer, dead_letter, compensation, route_repair, route_check, still_active, check_failed)."}, []string{"tenant", "reason"}),
	}
	// the statuses the manager moves months to, exported as 0 from the start
	for _, s := range []routing.Status{routing.StatusSealing, routing.StatusSealed} {
		m.transitions.WithLabelValues(string(s))
	}
	return m
}

// ExportTenants creates the tenant-labelled series of tenants (an existing
// series keeps its value): the counters at 0, so an alert sees a tenant's
// first DDL failure as an increase, and the last-success time at 0 ("never"),
// so a tenant whose sync never succeeds is visible from the start. The
// process calls it at start and for the tenants a reload adds.
func (mg *Manager) ExportTenants(tenants []string) {
	for _, t := range tenants {
		mg.m.ddlFailures.WithLabelValues(t)
		mg.m.created.WithLabelValues(t)
		mg.m.lastSuccess.WithLabelValues(t).Add(0)
		for _, r := range routing.WaitReasons {
			mg.m.sealWaiting.WithLabelValues(t, r).Add(0)
		}
	}
}
