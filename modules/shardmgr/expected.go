// Package shardmgr owns the month tables: a reconcile loop shaped like
// Cortex's TableManager — a pure function of (config, now) gives the months
// that must exist, a diff against MySQL says what to create, and a gauge
// records the last successful sync. The same SyncTenant serves the periodic
// patrol and the one-shot `imshard shard ensure`.
package shardmgr

import (
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// ExpectedMonths is the set of months that must have a table at month now:
// the previous month (late events), the current one and the next ahead
// months; from, when set and older, extends the range back to it (history,
// migrations, tests). Months outside the sane range are left out.
func ExpectedMonths(now routing.Month, ahead int, from routing.Month) []routing.Month {
	start := now.Prev()
	if !from.IsZero() && from.Before(start) {
		start = from
	}
	var out []routing.Month
	for _, m := range routing.Range(start, now.Add(ahead)) {
		if m.Valid() {
			out = append(out, m)
		}
	}
	return out
}

// Transition is a lifecycle change the patrol decides for one month.
type Transition struct {
	Month routing.Month
	To    routing.Status
}

// Lifecycle decides status changes from the catalog and the active month:
// every writable month older than the active one starts
// sealing; a sealing month whose grace (counted from when it stopped being
// active) has passed becomes sealed. Prepared months are promoted by the
// sync itself once their table exists. Pure, for table tests.
func Lifecycle(shards []routing.Shard, active routing.Month, now time.Time, grace time.Duration) []Transition {
	var out []Transition
	if active.IsZero() {
		return nil
	}
	for _, s := range shards {
		switch {
		case s.Status == routing.StatusWritable && s.Month.Before(active):
			out = append(out, Transition{Month: s.Month, To: routing.StatusSealing})
		case s.Status == routing.StatusSealing && s.Month.Before(active) &&
			s.DeactivatedAt.Valid && !now.Before(s.DeactivatedAt.Time.Add(grace)):
			out = append(out, Transition{Month: s.Month, To: routing.StatusSealed})
		}
	}
	return out
}

// nearBoundary reports whether now is within window of a UTC month edge,
// when the patrol runs more often so the next month is ready and the switch
// is recorded promptly.
func nearBoundary(now time.Time, window time.Duration) bool {
	m := routing.MonthOf(now)
	if m.IsZero() {
		return false
	}
	return now.Sub(m.Start()) < window || m.End().Sub(now) < window
}

// HoldForMigration drops from transitions the sealing of the months a
// migration from the legacy table is filling (from its oldest legacy month
// on): the backfill writes them until the migration is finished.
func HoldForMigration(transitions []Transition, mig routing.Migration) []Transition {
	if !mig.State.DualRead() || mig.MinMonth.IsZero() {
		return transitions
	}
	out := transitions[:0:0]
	for _, tr := range transitions {
		if tr.To == routing.StatusSealed && !tr.Month.Before(mig.MinMonth) {
			continue
		}
		out = append(out, tr)
	}
	return out
}
