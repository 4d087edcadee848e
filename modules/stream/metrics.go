package stream

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	sockets           prometheus.Gauge
	channels          prometheus.Gauge
	follows           prometheus.Gauge
	sent              prometheus.Counter
	dropped           prometheus.Counter
	slow              prometheus.Counter
	closes            *prometheus.CounterVec
	refused           *prometheus.CounterVec
	lag               prometheus.Histogram
	catchups          prometheus.Counter
	catchupErrors     prometheus.Counter
	catchupShareWaits prometheus.Counter
	resubscribes      prometheus.Counter
	aclCheckErrors    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		sockets:           f.NewGauge(prometheus.GaugeOpts{Name: "imshard_stream_sockets", Help: "Realtime WebSocket streams open in this process."}),
		channels:          f.NewGauge(prometheus.GaugeOpts{Name: "imshard_stream_channels", Help: "Topics this process holds a Redis (sharded pub/sub) subscription for: one per topic however many sockets follow it."}),
		follows:           f.NewGauge(prometheus.GaugeOpts{Name: "imshard_stream_subscriptions", Help: "Topics followed by the open sockets, summed over sockets."}),
		sent:              f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_frames_sent_total", Help: "Frames written to realtime sockets."}),
		dropped:           f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_frames_dropped_total", Help: "Live events a socket could not take because its send queue was full or it was closing (the socket is closed: the client resumes with its cursors)."}),
		slow:              f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_slow_consumer_closes_total", Help: "Sockets closed with 1008 \"slow consumer\": the send queue filled up."}),
		closes:            f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_stream_closes_total", Help: "Sockets ended, by reason (slow consumer, token expired, idle timeout, permission denied, credentials revoked, key removed, server shutting down, closed by the client)."}, []string{"reason"}),
		refused:           f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_stream_refused_total", Help: "Stream requests refused before the upgrade because of a limit: max_connections, shutting_down."}, []string{"reason"}),
		lag:               f.NewHistogram(prometheus.HistogramOpts{Name: "imshard_stream_delivery_lag_seconds", Help: "From a live message's created_at (the send) to its frame written to a socket.", Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		catchups:          f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_catchups_total", Help: "Reads from storage a socket made to catch up or to fill a seq held back (subscribe, seq jump, resubscription)."}),
		catchupErrors:     f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_catchup_errors_total", Help: "Catch-up reads that failed (storage unavailable); the socket retries and holds its later messages meanwhile."}),
		catchupShareWaits: f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_catchup_share_waits_total", Help: "Catch-ups that waited because their user held its share of the catch-up slots already (an eighth of stream.max_catchups): one user's many sockets never hold every slot."}),
		resubscribes:      f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_resubscribes_total", Help: "Redis subscriptions made again after a lost connection; each makes its sockets catch up from storage."}),
		aclCheckErrors:    f.NewCounter(prometheus.CounterOpts{Name: "imshard_stream_acl_check_errors_total", Help: "Membership re-checks of a followed topic that failed (Redis and MySQL unreadable); each is made again after a pause doubling from 50 ms up to 2 s (jittered), the topic kept meanwhile."}),
	}
	for _, r := range []string{reasonSlow, reasonExpired, reasonIdle, reasonDenied, reasonRevoked, reasonKeyRemoved, reasonStop, reasonGone, reasonRetry} {
		m.closes.WithLabelValues(r)
	}
	for _, r := range []string{refusedMax, refusedStopping} {
		m.refused.WithLabelValues(r)
	}
	return m
}
