package changes

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
)

// Results and follow-up steps of the change path beside the error codes
// (imshard_message_changes_total, imshard_message_change_followup_failures_total).
const (
	changeOK        = "ok"           // changed
	changeUnchanged = "unchanged"    // a repeated recall or delete: nothing to change
	changeInFlight  = "in_flight"    // the message was not stored yet: 409, retry
	stepHotPut      = "hot_put"      // the changed message back into the hot cache
	stepPublish     = "publish"      // the change event on the realtime channel
	stepOverlayMark = "overlay_mark" // an archived month's overlay marked again after the commit
)

type metrics struct {
	changes         *prometheus.CounterVec
	changeLatency   *prometheus.HistogramVec
	changeFollowups *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{}
	m.changes = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_message_changes_total", Help: "Message changes by action (recall, edit, delete) and result: ok, unchanged (a repeated recall or delete), in_flight (409: the message was not stored yet), or the error code answered (conflict, permission_denied, not_found, unavailable, ...)."}, []string{"action", "result"})
	m.changeLatency = f.NewHistogramVec(prometheus.HistogramOpts{Name: "imshard_message_change_latency", Help: "Latency in seconds of message changes by action, whatever their result.", Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, 1}}, []string{"action"})
	m.changeFollowups = f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_message_change_followup_failures_total", Help: "Best-effort steps after a committed change that failed: hot_put (the changed message was not put back into the hot cache: pages read MySQL for it), publish (the change event was not published), overlay_mark (an archived month the change overlaid was not marked again after the commit: only if Redis also lost the tenant's set of overlaid months since the mark before it may readers skip the change)."}, []string{"step"})
	for _, step := range []string{stepHotPut, stepPublish, stepOverlayMark} {
		m.changeFollowups.WithLabelValues(step)
	}
	// exported as 0 from the start: the alerts on failures and on changes
	// waiting for persist see a first one as an increase
	for _, action := range []string{message.ActionRecall, message.ActionEdit, message.ActionDelete} {
		for _, result := range []string{changeOK, changeInFlight, httpapi.CodeUnavailable, httpapi.CodeInternal} {
			m.changes.WithLabelValues(action, result)
		}
		m.changeLatency.WithLabelValues(action)
	}
	return m
}
