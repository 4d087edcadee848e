package keyset

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	refused     *prometheus.CounterVec
	fetches     *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	keys        *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	f := promauto.With(reg)
	return metrics{
		refused: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_auth_refused_total",
			Help: "Tokens refused (401 unauthenticated), by tenant (\"unknown\" for a tid not configured) and reason: missing, malformed, unknown_tenant, unknown_key, algorithm, signature, expired, not_yet_valid, lifetime, claims, issuer, audience."},
			[]string{"tenant", "reason"}),
		fetches: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_jwks_fetches_total",
			Help: "Fetches of a tenant's jwks_url (at start, each auth.jwks_refresh_interval, and for an unknown kid at most once per interval), by result: ok or error (the last good keys stay in use)."},
			[]string{"tenant", "result"}),
		lastSuccess: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_jwks_last_success_timestamp_seconds",
			Help: "When a tenant's jwks_url was last fetched successfully (Unix seconds; 0 if never since start)."},
			[]string{"tenant"}),
		keys: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_jwks_keys",
			Help: "Keys the last successful fetch of a tenant's jwks_url returned."},
			[]string{"tenant"}),
	}
}

// forget drops the JWKS series of a tenant whose jwks_url a reload removed
// or changed (a new URL starts its series again).
func (m metrics) forget(tenant string) {
	m.fetches.DeletePartialMatch(prometheus.Labels{"tenant": tenant})
	m.lastSuccess.DeleteLabelValues(tenant)
	m.keys.DeleteLabelValues(tenant)
}
