package migrate

import "time"

// pacer spaces the backfill's batches so that the copy averages at most
// rate rows per second. It keeps a schedule across batches instead of
// sleeping each batch's allotment minus its own duration: the work between
// two batches (reading the migration's row, the loop) is absorbed by the
// schedule, so a copy the database can carry reaches the limit rather than
// falling short by that overhead on every batch. Time lost to a slow stretch
// is made up by at most one batch: a throttle is a cap, never a burst.
type pacer struct {
	rate float64   // rows per second; 0 or less: unthrottled
	next time.Time // when the rows copied so far are due
}

// wait is how long to wait at now after a batch of n rows, before the next.
func (p *pacer) wait(now time.Time, n int) time.Duration {
	if p.rate <= 0 || n <= 0 {
		return 0
	}
	cost := time.Duration(float64(n) / p.rate * float64(time.Second))
	if earliest := now.Add(-cost); p.next.Before(earliest) {
		p.next = earliest
	}
	p.next = p.next.Add(cost)
	return max(p.next.Sub(now), 0)
}

// rateWindow is the copy rate the operator sees: rows of the batches that
// started within the last span over the time since the first of them
// started, throttle waits and the work between batches included.
type rateWindow struct {
	span    time.Duration
	batches []startedBatch
}

type startedBatch struct {
	at   time.Time
	rows int
}

// add records a batch of n rows that started at at.
func (w *rateWindow) add(at time.Time, n int) {
	w.batches = append(w.batches, startedBatch{at, n})
	drop := 0
	for drop < len(w.batches)-2 && at.Sub(w.batches[drop].at) > w.span {
		drop++
	}
	w.batches = w.batches[drop:]
}

// rate is rows per second from the first recorded batch's start to at (the
// start of the batch under way, which is not counted): 0 until two batches
// started.
func (w *rateWindow) rate(at time.Time) float64 {
	if len(w.batches) == 0 {
		return 0
	}
	d := at.Sub(w.batches[0].at)
	rows := 0
	for _, b := range w.batches {
		if b.at.Before(at) {
			rows += b.rows
		}
	}
	if d <= 0 || rows == 0 {
		return 0
	}
	return float64(rows) / d.Seconds()
}

// perSecond is n rows per second of d (0 for no time).
func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Pace says what sets a copy's pace from the limit it is allowed (0:
// unthrottled), the rate it achieved (throttle waits included) and the rate
// of its batches alone: when the batches alone run below the limit, no
// throttle could reach it — the database (its load, the machine) sets the
// pace, and lowering the load or raising the batch's share of the machine
// is what helps.
func Pace(allowed int, achieved, batch float64) string {
	switch {
	case allowed <= 0:
		return "unthrottled"
	case batch > 0 && batch < float64(allowed):
		return "below the limit: the batches alone run slower than allowed, the database sets the pace"
	case achieved >= 0.9*float64(allowed):
		return "at the limit"
	default:
		return "below the limit while the batches alone run faster: the throttle holds the copy back"
	}
}
