package send

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/imshard/imshard/modules/httpapi"
)

// metrics of the send role.
type metrics struct {
	latency  *prometheus.HistogramVec // imshard_send_latency_seconds{result}
	total    *prometheus.CounterVec   // imshard_send_total{result}
	gaps     prometheus.Counter       // imshard_seq_gaps_total
	postAck  *prometheus.CounterVec   // imshard_send_post_ack_failures_total{step}
	dedupHit prometheus.Counter       // imshard_send_mysql_dedup_hits_total
	ackBatch prometheus.Histogram     // imshard_send_post_ack_batch_size
}

// Result labels besides the API error codes.
const (
	resultOK        = "ok"
	resultDuplicate = "duplicate"
)

// Post-ack steps whose failures are counted: the call after the ack failed
// (all four; the send answered 503, a retry re-produces), or the ack came
// after readers recorded the seq as a gap (the send answered 503, persist
// drops the event).
const (
	stepPending      = "pending"
	stepIdempotency  = "idempotency"
	stepHotCache     = "hot_cache"
	stepPublish      = "publish"
	stepLateAfterGap = "late_after_gap"
)

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		latency:  f.NewHistogramVec(prometheus.HistogramOpts{Name: "imshard_send_latency_seconds", Help: "Send request latency, by result (ok, duplicate, or the error code).", Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"result"}),
		total:    f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_send_total", Help: "Send requests, by result (ok, duplicate, or the error code)."}, []string{"result"}),
		gaps:     f.NewCounter(prometheus.CounterOpts{Name: "imshard_seq_gaps_total", Help: "Seqs the send path allocated and abandoned, recorded as gaps."}),
		postAck:  f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_send_post_ack_failures_total", Help: "Failures after the Kafka ack: the call recording it failed (pending, idempotency, hot_cache, publish) or came after the seq was recorded as a gap (late_after_gap); the send answered 503."}, []string{"step"}),
		dedupHit: f.NewCounter(prometheus.CounterOpts{Name: "imshard_send_mysql_dedup_hits_total", Help: "Retries Redis had forgotten, answered from MySQL (the month tables)."}),
		ackBatch: f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_send_post_ack_batch_size", Help: "Sends recorded by one call after the Kafka ack: sends of a tenant whose acks came together share the call.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64}}),
	}
	// exported as 0 from the start: the error-rate alert divides by them and
	// sees a first failure as an increase, and the dashboard's rates and
	// quantiles have a series before the first send
	for _, r := range []string{resultOK, resultDuplicate, httpapi.CodeUnavailable, httpapi.CodeInternal} {
		m.total.WithLabelValues(r)
		m.latency.WithLabelValues(r)
	}
	for _, s := range []string{stepPending, stepIdempotency, stepHotCache, stepPublish, stepLateAfterGap} {
		m.postAck.WithLabelValues(s)
	}
	return m
}
