package inbox

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	readState *prometheus.HistogramVec
	// cursorCache counts reads of a user's cached cursors by result;
	// unreadFrom the topics counted by where the answer came from
	cursorCache *prometheus.CounterVec
	unreadFrom  *prometheus.CounterVec
	// mentionReads counts the statements reading the mention index,
	// readFrames the read frames published after a cursor committed
	mentionReads prometheus.Counter
	// routeMemo counts the topics of topic lists by where their mirror came from
	routeMemo  *prometheus.CounterVec
	readFrames *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, memoUsers, memoRoutes func() int) *metrics {
	f := promauto.With(reg)
	m := &metrics{}
	m.readState = f.NewHistogramVec(prometheus.HistogramOpts{Name: "imshard_read_state_latency", Help: "Latency in seconds of the read-state requests that succeeded, by op: read (a cursor move), unread (every badge), topics (a topic list page), sync (a device sync), prefs (a preferences change).", Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .25, 1}}, []string{"op"})
	m.cursorCache = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_read_cursor_cache_total", Help: "Reads of a user's cached memberships and read cursors by result: held (this process's copy of the entry, its generation unchanged: one field read); moved (the copy's generation moved, the topics did not: read whole, the last seqs read with the copy kept); hit (read whole); miss (read from MySQL and cached: first read, expired, or dropped by a membership change, or read again after a change of a group); error (Redis failed: MySQL answered)."}, []string{"result"})
	m.unreadFrom = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_unread_counts_total", Help: "Topics with something above the caller's cursor whose unread count was answered, by source: memo (remembered by this process, its topic's versions unchanged), redis (the hot cache proved it), mysql (the month tables)."}, []string{"source"})
	m.mentionReads = f.NewCounter(prometheus.CounterOpts{Name: "imshard_mention_index_reads_total", Help: "Statements that read the per-topic mention index for mention_unread (each covers up to 128 topics with something above the caller's cursor)."})
	m.readFrames = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_read_frames_total", Help: "Read frames ({\"type\":\"read\"}) of committed cursor moves by result: published, failed (the user's other devices learn the cursor on their next sync)."}, []string{"result"})
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "imshard_query_badge_memo_users", Help: "Users whose unread counts this process remembers (at most hot_cache.local_users)."}, func() float64 { return float64(memoUsers()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "imshard_query_route_memo_topics", Help: "Topics whose route mirror this process remembers for topic lists (at most hot_cache.local_routes)."}, func() float64 { return float64(memoRoutes()) })
	m.routeMemo = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_query_route_memo_total", Help: "Topics of topic lists by where their route mirror came from: hit (remembered, the topic's last seq unchanged), miss (read from MySQL)."}, []string{"result"})
	for _, r := range []string{"held", "moved", "hit", "miss", "error"} {
		m.cursorCache.WithLabelValues(r)
	}
	for _, r := range []string{"hit", "miss"} {
		m.routeMemo.WithLabelValues(r)
	}
	for _, r := range []string{"memo", "redis", "mysql"} {
		m.unreadFrom.WithLabelValues(r)
	}
	for _, r := range []string{"published", "failed"} {
		m.readFrames.WithLabelValues(r)
	}
	for _, op := range []string{"read", "unread", "topics", "sync", "prefs"} {
		m.readState.WithLabelValues(op)
	}
	return m
}
