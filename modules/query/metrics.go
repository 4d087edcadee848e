package query

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
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

// Results and follow-up steps of the change path beside the error codes
// (imshard_message_changes_total, imshard_message_change_followup_failures_total).
const (
	changeOK        = "ok"        // changed
	changeUnchanged = "unchanged" // a repeated recall or delete: nothing to change
	changeInFlight  = "in_flight" // the message was not stored yet: 409, retry
	stepHotPut      = "hot_put"   // the changed message back into the hot cache
	stepPublish     = "publish"   // the change event on the realtime channel
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

	changes         *prometheus.CounterVec
	changeLatency   *prometheus.HistogramVec
	changeFollowups *prometheus.CounterVec

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

func newMetrics(reg prometheus.Registerer, held func() int64, memoUsers, memoRoutes func() int) *metrics {
	m := &metrics{
		tables: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "group_message_query_tables",
			Help:    "Month tables one read request touched.",
			Buckets: []float64{0, 1, 2, 3, 4, 6, 12},
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "group_message_query_latency",
			Help:    "Read latency in seconds by source: redis (hot cache), single_month, cross_month.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"source"}),
		wide: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "imshard_query_wide_pages_total",
			Help: "Read requests that touched more than 3 month tables (alerted: invariant 7).",
		}),
		hot: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imshard_query_hot_cache_total",
			Help: "List pages the hot cache could answer (hit) or not (miss: MySQL answered).",
		}, []string{"result"}),
		hidden: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imshard_query_hidden_cache_total",
			Help: "Lookups of a caller's deletion ranges: hit, miss (read from MySQL), many (too many to cache: MySQL filters), error (Redis failed: MySQL filters).",
		}, []string{"result"}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imshard_query_hot_local_total",
			Help: "List pages read over this process's copy of a topic's newest messages: hit (the copy and the Redis read above it answered), fallback (they fell short: a full hot-cache read followed), reset (the topic's seq counter went below the copy: dropped), changed (a message of the topic was recalled, edited or deleted since the copy was read: dropped).",
		}, []string{"result"}),
	}
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "imshard_message_changes_total",
		Help: "Message changes by action (recall, edit, delete) and result: ok, unchanged (a repeated recall or delete), in_flight (409: the message was not stored yet), or the error code answered (conflict, permission_denied, not_found, unavailable, ...).",
	}, []string{"action", "result"})
	m.changeLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imshard_message_change_latency",
		Help:    "Latency in seconds of message changes by action, whatever their result.",
		Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, 1},
	}, []string{"action"})
	m.changeFollowups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "imshard_message_change_followup_failures_total",
		Help: "Best-effort steps after a committed change that failed: hot_put (the changed message was not put back into the hot cache: pages read MySQL for it), publish (the change event was not published).",
	}, []string{"step"})
	m.readState = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imshard_read_state_latency",
		Help:    "Latency in seconds of the read-state requests that succeeded, by op: read (a cursor move), unread (every badge), topics (a topic list page), sync (a device sync), prefs (a preferences change).",
		Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .25, 1},
	}, []string{"op"})
	m.cursorCache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "imshard_read_cursor_cache_total",
		Help: "Reads of a user's cached memberships and read cursors by result: held (this process's copy of the entry, its generation unchanged: one field read); moved (the copy's generation moved, the topics did not: read whole, the last seqs read with the copy kept); hit (read whole); miss (read from MySQL and cached: first read, expired, or dropped by a membership change, or read again after a change of a group); error (Redis failed: MySQL answered).",
	}, []string{"result"})
	m.unreadFrom = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "imshard_unread_counts_total",
		Help: "Topics with something above the caller's cursor whose unread count was answered, by source: memo (remembered by this process, its topic's versions unchanged), redis (the hot cache proved it), mysql (the month tables).",
	}, []string{"source"})
	m.mentionReads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "imshard_mention_index_reads_total",
		Help: "Statements that read the per-topic mention index for mention_unread (each covers up to 128 topics with something above the caller's cursor).",
	})
	m.readFrames = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "imshard_read_frames_total",
		Help: "Read frames ({\"type\":\"read\"}) of committed cursor moves by result: published, failed (the user's other devices learn the cursor on their next sync).",
	}, []string{"result"})
	topics := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "imshard_query_hot_local_topics",
		Help: "Topics whose newest messages this process holds a copy of (at most hot_cache.local_topics).",
	}, func() float64 { return float64(held()) })
	users := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "imshard_query_badge_memo_users",
		Help: "Users whose unread counts this process remembers (at most hot_cache.local_users).",
	}, func() float64 { return float64(memoUsers()) })
	routes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "imshard_query_route_memo_topics",
		Help: "Topics whose route mirror this process remembers for topic lists (at most hot_cache.local_routes).",
	}, func() float64 { return float64(memoRoutes()) })
	m.routeMemo = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "imshard_query_route_memo_total",
		Help: "Topics of topic lists by where their route mirror came from: hit (remembered, the topic's last seq unchanged), miss (read from MySQL).",
	}, []string{"result"})
	reg.MustRegister(m.tables, m.latency, m.wide, m.hot, m.hidden, m.local, topics, users, routes, m.routeMemo, m.changes, m.changeLatency, m.changeFollowups, m.readState, m.cursorCache, m.unreadFrom, m.mentionReads, m.readFrames)
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
	for _, r := range []string{localHit, localFallback, localReset, localChanged} {
		m.local.WithLabelValues(r) // exported as 0 from the start: rates need no first event
	}
	for _, step := range []string{stepHotPut, stepPublish} {
		m.changeFollowups.WithLabelValues(step)
	}
	for _, action := range []string{message.ActionRecall, message.ActionEdit, message.ActionDelete} {
		for _, result := range []string{httpapi.CodeUnavailable, httpapi.CodeInternal} {
			m.changes.WithLabelValues(action, result) // the failure alert sees a first one as an increase
		}
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
