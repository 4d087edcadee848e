package routing

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics shared by several modules live here, registered once per process,
// so that `imshard all` (every role in one registry) registers each name once.
// The group_message_* names are kept stable: dashboards and alert rules
// (docs/alerts.yml) use them.
type Metrics struct {
	ShardMissing  *prometheus.CounterVec // group_message_shard_missing_total{tenant}
	RouteMiss     prometheus.Counter     // group_message_route_miss_total
	RouteRebuild  *prometheus.CounterVec // group_message_route_rebuild_total{status}
	SeqReserve    *prometheus.CounterVec // imshard_seq_reservations_total{result}
	SeqResumed    prometheus.Counter     // imshard_seq_resumed_total
	MonthSwitches *prometheus.CounterVec // imshard_active_month_switches_total{source}
	ActiveMonth   *prometheus.GaugeVec   // imshard_active_month{tenant}
	AllocRetries  *prometheus.CounterVec // imshard_alloc_slow_path_total{reason}
	SeqFences     *prometheus.CounterVec // imshard_seq_fences_total{event}
	FenceStalls   prometheus.Counter     // imshard_seq_fence_stalled_reads_total
}

// NewMetrics registers the routing metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		ShardMissing:  f.NewCounterVec(prometheus.CounterOpts{Name: "group_message_shard_missing_total", Help: "Month tables found missing: by the shard manager's patrol, or by persist for an event's month."}, []string{"tenant"}),
		RouteMiss:     f.NewCounter(prometheus.CounterOpts{Name: "group_message_route_miss_total", Help: "Topic route lookups that found no Redis route and fell back to the MySQL mirror."}),
		RouteRebuild:  f.NewCounterVec(prometheus.CounterOpts{Name: "group_message_route_rebuild_total", Help: "Redis topic routes rebuilt from the MySQL mirror, by result."}, []string{"status"}),
		SeqReserve:    f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_seq_reservations_total", Help: "Durable seq high-water reservations taken in MySQL, by result."}, []string{"result"}),
		SeqResumed:    f.NewCounter(prometheus.CounterOpts{Name: "imshard_seq_resumed_total", Help: "Topic seq counters re-seeded from the MySQL reservation after Redis lost them."}),
		MonthSwitches: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_active_month_switches_total", Help: "Active-month activations written, by source (auto, activate, recover, ensure)."}, []string{"source"}),
		ActiveMonth:   f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_active_month", Help: "The tenant's active month as YYYYMM, as last seen by this process."}, []string{"tenant"}),
		AllocRetries:  f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_alloc_slow_path_total", Help: "Allocations that took a slow path, by reason (recover, advance, seed, reserve, migration_gate)."}, []string{"reason"}),
		SeqFences:     f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_seq_fences_total", Help: "Resume fences of re-seeded topic counters, by event (raised by a re-seed, lifted by a reader once persist passed them)."}, []string{"event"}),
		FenceStalls:   f.NewCounter(prometheus.CounterOpts{Name: "imshard_seq_fence_stalled_reads_total", Help: "Forward reads held by a resume fence standing more than a minute past send.produce_timeout (persist not passing it)."}),
	}
	for _, r := range []string{"ok", "error"} {
		m.SeqReserve.WithLabelValues(r) // exported as 0 from the start: the first error is an increase
	}
	for _, e := range []string{fenceRaised, fenceLifted} {
		m.SeqFences.WithLabelValues(e)
	}
	for _, s := range []string{"ok", "empty", "error"} {
		m.RouteRebuild.WithLabelValues(s)
	}
	for _, s := range []string{"auto", "activate", "recover", "ensure"} {
		m.MonthSwitches.WithLabelValues(s)
	}
	for _, r := range []string{"recover", "advance", "seed", "reserve", "migration_gate"} {
		m.AllocRetries.WithLabelValues(r)
	}
	return m
}

// ExportTenants creates the tenant-labelled counters of tenants at 0 (an
// existing series keeps its value), so that an alert on a tenant's first
// increment, increase(…) > 0, sees it rise from 0. The process calls it at
// start and for the tenants a reload adds.
func (m *Metrics) ExportTenants(tenants []string) {
	for _, t := range tenants {
		m.ShardMissing.WithLabelValues(t)
	}
}
