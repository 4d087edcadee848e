package relay

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Steps of a relay pass that can fail, the label of failures.
const (
	stepRead    = "read"
	stepProduce = "produce"
	stepDelete  = "delete"
)

type metrics struct {
	lag      *prometheus.GaugeVec
	relayed  *prometheus.CounterVec
	failures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		lag: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_change_feed_lag_seconds",
			Help: "Age of the oldest change event of the tenant not yet acknowledged by kafka.changes_topic (0: every change relayed), measured by every relay process each pass."}, []string{"tenant"}),
		relayed: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_change_feed_relayed_total",
			Help: "Change events produced to kafka.changes_topic and acknowledged (a re-send after a crash counts again)."}, []string{"tenant"}),
		failures: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_change_feed_failures_total",
			Help: "Relay passes of a tenant that failed, by step (read, produce, delete); the rows stay and the next pass retries them."}, []string{"tenant", "step"}),
	}
}

// ExportTenants creates the tenant-labelled series of tenants, so an alert
// sees a tenant's first failure as an increase and its lag from the start.
func (s *Service) ExportTenants(tenants []string) {
	for _, t := range tenants {
		s.m.lag.WithLabelValues(t).Add(0)
		s.m.relayed.WithLabelValues(t)
		for _, step := range []string{stepRead, stepProduce, stepDelete} {
			s.m.failures.WithLabelValues(t, step)
		}
	}
}
