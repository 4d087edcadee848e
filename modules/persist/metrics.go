package persist

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Persist outcomes, the status label of group_message_persist_total.
const (
	statusInserted    = "inserted"    // a new row in the month table
	statusReplayed    = "replayed"    // redelivered; the row was already there
	statusDuplicate   = "duplicate"   // its client_msg_id is stored under another seq
	statusCompensated = "compensated" // the month is sealed: compensation queue
	statusDeadLetter  = "dead_letter" // sent to the dead-letter topic
	statusRetry       = "retry"       // an attempt failed and will be retried
	statusAbandoned   = "abandoned"   // its seq timed out into a gap first: dropped, never stored
)

// metrics are the persist role's. The group_message_* names are kept
// stable: dashboards and alert rules (docs/alerts.yml) use them.
type metrics struct {
	persisted  *prometheus.CounterVec // group_message_persist_total{month,status}
	latency    prometheus.Histogram   // group_message_persist_latency
	dedupHits  prometheus.Counter     // group_message_dedup_hit_total
	deadLetter *prometheus.CounterVec // group_message_dead_letter_total{reason}
	backlog    *prometheus.GaugeVec   // group_message_route_repair_backlog{tenant}
	batchSize  prometheus.Histogram   // imshard_persist_batch_size
	batchTime  prometheus.Histogram   // imshard_persist_batch_seconds
	retries    *prometheus.CounterVec // imshard_persist_retries_total{reason}
	lag        *prometheus.GaugeVec   // imshard_persist_consumer_lag{partition}
	repairs    *prometheus.CounterVec // imshard_persist_route_repairs_total{result}

	parkedTenants prometheus.Gauge // imshard_persist_parked_tenants
	parkedEvents  prometheus.Gauge // imshard_persist_parked_events
	pollPaused    prometheus.Gauge // imshard_persist_poll_paused
	progress      prometheus.Gauge // imshard_persist_progress_timestamp_seconds

	lateEvents        *prometheus.CounterVec // imshard_persist_late_events_total{tenant}
	deadLetterUnnoted prometheus.Counter     // imshard_persist_dead_letters_unnoted_total
}

// newMetrics registers the role's metrics; inFlight counts the records
// polled and not yet done (imshard_persist_in_flight_records).
func newMetrics(reg prometheus.Registerer, inFlight func() float64) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		persisted:     f.NewCounterVec(prometheus.CounterOpts{Name: "group_message_persist_total", Help: "Events handled by persist, by frozen month and outcome (inserted, replayed, duplicate, compensated, dead_letter, retry, abandoned)."}, []string{"month", "status"}),
		latency:       f.NewHistogram(prometheus.HistogramOpts{Name: "group_message_persist_latency", Help: "Seconds from the Kafka record timestamp to the DB commit that stored it.", Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}),
		dedupHits:     f.NewCounter(prometheus.CounterOpts{Name: "group_message_dedup_hit_total", Help: "Events not stored because their (topic, from_user, client_msg_id) is already stored under another seq."}),
		deadLetter:    f.NewCounterVec(prometheus.CounterOpts{Name: "group_message_dead_letter_total", Help: "Events sent to the dead-letter topic, by reason (malformed, shard_missing, rejected, unknown_tenant)."}, []string{"reason"}),
		backlog:       f.NewGaugeVec(prometheus.GaugeOpts{Name: "group_message_route_repair_backlog", Help: "Entries in the tenant's durable route repair queue (Redis follow-ups of committed batches still to redo)."}, []string{"tenant"}),
		batchSize:     f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_persist_batch_size", Help: "Events per batch transaction.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		batchTime:     f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_persist_batch_seconds", Help: "Seconds one batch took from dispatch to its DB commit.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		retries:       f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_persist_retries_total", Help: "Failed batch attempts that will be retried, by class (transient, shard_missing, unclassified, moved: refused by the placement fence during a move); refused data is never retried."}, []string{"reason"}),
		lag:           f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_persist_consumer_lag", Help: "Records between the last polled offset and the partition's high watermark."}, []string{"partition"}),
		repairs:       f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_persist_route_repairs_total", Help: "Route repair queue entries processed, by result (done, failed)."}, []string{"result"}),
		parkedTenants: f.NewGauge(prometheus.GaugeOpts{Name: "imshard_persist_parked_tenants", Help: "Tenants whose events wait for a retry (their database down or refusing everyone, a month table missing) while other tenants' events are stored."}),
		parkedEvents:  f.NewGauge(prometheus.GaugeOpts{Name: "imshard_persist_parked_events", Help: "Events held in memory, uncommitted, behind parked tenants (at most persist.max_parked)."}),
		pollPaused:    f.NewGauge(prometheus.GaugeOpts{Name: "imshard_persist_poll_paused", Help: "1 while persist stops polling Kafka because its in-flight or parked events are at their limit: every tenant waits."}),
		progress:      f.NewGauge(prometheus.GaugeOpts{Name: "imshard_persist_progress_timestamp_seconds", Help: "The Redis time before which every record produced to kafka.topic is stored, compensated or dead-lettered, as last published by this process (lifts resume fences)."}),
	}
	m.lateEvents = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_persist_late_events_total", Help: "Events that arrived for a month already sealed (or archived) and went to the compensation queue: answered 201 but not readable until replayed into the month."}, []string{"tenant"})
	m.deadLetterUnnoted = f.NewCounter(prometheus.CounterOpts{Name: "imshard_persist_dead_letters_unnoted_total", Help: "Dead-lettered events persist could not note in their tenant's database (a seal cannot see them)."})
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "imshard_persist_in_flight_records", Help: "Records polled from Kafka and not yet stored, compensated or dead-lettered (work persist holds)."}, inFlight)
	// exported as 0 from the start, so an alert sees the first one as an increase
	for _, r := range []string{reasonMalformed, missingTable.String(), permanent.String(), fatal.String()} {
		m.deadLetter.WithLabelValues(r)
	}
	for _, f := range []failure{transient, missingTable, unclassified, moved} {
		m.retries.WithLabelValues(f.String())
	}
	for _, r := range []string{"done", "failed"} {
		m.repairs.WithLabelValues(r)
	}
	return m
}
