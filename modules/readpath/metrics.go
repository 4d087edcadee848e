package readpath

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Latency sources: a page served by the hot cache, by one
// month table, or by several.
const (
	sourceRedis  = "redis"
	sourceSingle = "single_month"
	sourceCross  = "cross_month"
)

// Results of pages read over this process's copy of a topic's newest
// stretch (imshard_query_hot_local_total).
const (
	localHit      = "hit"      // the copy and the read above it answered
	localFallback = "fallback" // they fell short: a full cache read followed
	localReset    = "reset"    // the seq counter went below the copy: dropped
	localChanged  = "changed"  // a message of the topic changed: dropped
)

// WidePageTables is the most tables a page may touch before it counts as
// wide (invariant 7, docs/invariants.md: counted and alerted).
const WidePageTables = 3

type metrics struct {
	tables  prometheus.Histogram
	latency *prometheus.HistogramVec
	wide    prometheus.Counter
	hot     *prometheus.CounterVec
	hidden  *prometheus.CounterVec
	local   *prometheus.CounterVec
	// coldReads counts reads of archived months served from their archive
	coldReads prometheus.Counter
	// overlay counts the overlay lookups of archived-month reads by result
	overlay *prometheus.CounterVec
}

// Results of an archived-month read's overlay lookup (imshard_query_overlay_total).
const (
	overlayRead    = "read"    // the month may have overlay rows: MySQL was asked
	overlaySkipped = "skipped" // the month has none: MySQL was not asked
	overlayError   = "error"   // Redis could not tell: MySQL was asked
)

func newMetrics(reg prometheus.Registerer, held func() int64) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		tables:    f.NewHistogram(prometheus.HistogramOpts{Name: "group_message_query_tables", Help: "Month tables one read request touched.", Buckets: []float64{0, 1, 2, 3, 4, 6, 12}}),
		latency:   f.NewHistogramVec(prometheus.HistogramOpts{Name: "group_message_query_latency", Help: "Read latency in seconds by source: redis (hot cache), single_month, cross_month.", Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, 1}}, []string{"source"}),
		wide:      f.NewCounter(prometheus.CounterOpts{Name: "imshard_query_wide_pages_total", Help: "Read requests that touched more than 3 month tables (alerted: invariant 7)."}),
		hot:       f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_query_hot_cache_total", Help: "List pages the hot cache could answer (hit) or not (miss: MySQL answered)."}, []string{"result"}),
		hidden:    f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_query_hidden_cache_total", Help: "Lookups of a caller's deletion ranges: hit, miss (read from MySQL), many (too many to cache: MySQL filters), error (Redis failed: MySQL filters)."}, []string{"result"}),
		local:     f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_query_hot_local_total", Help: "List pages read over this process's copy of a topic's newest messages: hit (the copy and the Redis read above it answered), fallback (they fell short: a full hot-cache read followed), reset (the topic's seq counter went below the copy: dropped), changed (a message of the topic was recalled, edited or deleted since the copy was read: dropped)."}, []string{"result"}),
		coldReads: f.NewCounter(prometheus.CounterOpts{Name: "imshard_query_cold_reads_total", Help: "Reads of archived months (a page's share of a month, one message, a lookup by id) served from their archive object."}),
		overlay:   f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_query_overlay_total", Help: "Overlay lookups of reads of archived months: read (the month may have changes: MySQL asked), skipped (the month has none: MySQL not asked), error (Redis could not tell: MySQL asked)."}, []string{"result"}),
	}
	for _, r := range []string{overlayRead, overlaySkipped, overlayError} {
		m.overlay.WithLabelValues(r)
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "imshard_query_hot_local_topics", Help: "Topics whose newest messages this process holds a copy of (at most hot_cache.local_topics)."}, func() float64 { return float64(held()) })
	// exported as 0 from the start: rates and quantiles need no first event
	for _, r := range []string{localHit, localFallback, localReset, localChanged} {
		m.local.WithLabelValues(r)
	}
	for _, s := range []string{sourceRedis, sourceSingle, sourceCross} {
		m.latency.WithLabelValues(s)
	}
	for _, r := range []string{"hit", "miss"} {
		m.hot.WithLabelValues(r)
	}
	for _, r := range []string{"hit", "miss", "many", "error"} {
		m.hidden.WithLabelValues(r)
	}
	return m
}

// observe records one request that touched n month tables; cached means
// the hot cache answered.
func (m *metrics) observe(n int, cached bool, seconds float64) {
	m.tables.Observe(float64(n))
	src := sourceCross
	switch {
	case cached:
		src = sourceRedis
	case n <= 1:
		src = sourceSingle
	}
	m.latency.WithLabelValues(src).Observe(seconds)
	if n > WidePageTables {
		m.wide.Inc()
	}
}
