package send

import (
	"testing"
	"time"
)

// TestAckDeadlinesEndBeforeTheGapCutoff: counted from the moment before the
// call that stamps a seq's pending time, both deadlines of its produce end
// strictly before readers may record the seq as a gap (the stamp plus the
// produce timeout), the record's before the handler's, for any timeout.
func TestAckDeadlinesEndBeforeTheGapCutoff(t *testing.T) {
	origin := time.Date(2026, 1, 31, 23, 59, 59, 0, time.UTC)
	for _, timeout := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second, time.Minute} {
		t.Run(timeout.String(), func(t *testing.T) {
			record, handler := ackDeadlines(origin, timeout)
			cutoff := origin.Add(timeout) // the stamp is at or after origin
			if !record.Before(handler) || !handler.Before(cutoff) {
				t.Fatalf("record %s, handler %s, cutoff %s: want record < handler < cutoff",
					record.Sub(origin), handler.Sub(origin), cutoff.Sub(origin))
			}
			if record.Sub(origin) < timeout/2 {
				t.Fatalf("record deadline %s leaves less than half the timeout %s", record.Sub(origin), timeout)
			}
		})
	}
}
