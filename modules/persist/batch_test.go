package persist

import (
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

func rec(seq uint64, tenant, month string) *record {
	return &record{seq: seq, ev: &message.Event{Tenant: tenant}, month: routing.MustMonth(month)}
}

func TestGrouperBatchesByTenantAndMonth(t *testing.T) {
	t0 := time.Unix(1000, 0)
	g := newGrouper(3, 20*time.Millisecond)
	for i, in := range []struct {
		tenant, month string
		full          bool
	}{
		{"a", "202601", false}, {"a", "202602", false}, {"b", "202601", false},
		{"a", "202601", false}, {"a", "202601", true}, {"a", "202601", false},
	} {
		b := g.add(rec(uint64(i+1), in.tenant, in.month), t0)
		if (b != nil) != in.full {
			t.Fatalf("record %d: full=%v", i, b != nil)
		}
		if b != nil && (len(b.recs) != 3 || b.key != (batchKey{"a", routing.MustMonth("202601")})) {
			t.Fatalf("full batch %+v", b.key)
		}
	}
	if d, ok := g.wait(t0.Add(5 * time.Millisecond)); !ok || d != 15*time.Millisecond {
		t.Fatalf("wait %v %v", d, ok)
	}
	if due := g.due(t0.Add(5*time.Millisecond), false); len(due) != 0 {
		t.Fatalf("due before linger: %d", len(due))
	}
	due := g.due(t0.Add(20*time.Millisecond), false)
	if len(due) != 3 {
		t.Fatalf("due after linger: %d", len(due))
	}
	for i := 1; i < len(due); i++ {
		if due[i-1].first > due[i].first {
			t.Fatal("due batches not oldest first")
		}
	}
	if _, ok := g.wait(t0); ok {
		t.Fatal("nothing open, yet a wait")
	}
}

func TestGrouperBeforeKeepsATenantsDeliveryOrder(t *testing.T) {
	g := newGrouper(2, time.Second)
	now := time.Now()
	g.add(rec(1, "a", "202601"), now) // older month batch, not full
	g.add(rec(2, "b", "202601"), now) // other tenant
	g.add(rec(3, "a", "202602"), now)
	full := g.add(rec(4, "a", "202602"), now)
	older := g.before(full)
	if len(older) != 1 || older[0].key.month != routing.MustMonth("202601") || older[0].key.tenant != "a" {
		t.Fatalf("before = %+v", older)
	}
}

func TestSchedulerNeverRunsTwoMonthsOfATenantAtOnce(t *testing.T) {
	mk := func(tenant, month string, first uint64) *batch {
		return &batch{key: batchKey{tenant, routing.MustMonth(month)}, first: first}
	}
	s := newScheduler(3)
	a1, a2, a1b, b1 := mk("a", "202601", 1), mk("a", "202602", 2), mk("a", "202601", 3), mk("b", "202601", 4)
	for _, b := range []*batch{a1, a2, a1b, b1} {
		s.push(b)
	}
	if got := s.next(time.Time{}); got != a1 {
		t.Fatal("first batch must run first")
	}
	// a2 is blocked by a1's month; a1b must not overtake a2 (same tenant)
	if got := s.next(time.Time{}); got != b1 {
		t.Fatalf("want b's batch, got %+v", got.key)
	}
	if got := s.next(time.Time{}); got != nil {
		t.Fatalf("nothing else may run, got %+v", got.key)
	}
	s.done(a1)
	if got := s.next(time.Time{}); got != a2 {
		t.Fatal("a's next month must run once a1 is done")
	}
	if got := s.next(time.Time{}); got != nil {
		t.Fatal("a1b must wait for a2")
	}
	s.done(a2)
	s.done(b1)
	if got := s.next(time.Time{}); got != a1b {
		t.Fatal("a1b last")
	}
	s.done(a1b)
	if !s.idle() {
		t.Fatal("not idle")
	}
}

func TestSchedulerBoundsWriters(t *testing.T) {
	s := newScheduler(2)
	for i := 0; i < 4; i++ {
		s.push(&batch{key: batchKey{"t", routing.MustMonth("202601")}})
	}
	for i, want := range []bool{true, true, false} {
		if got := s.next(time.Time{}) != nil; got != want {
			t.Fatalf("next #%d ran=%v, want %v (writers bound)", i+1, got, want)
		}
	}
}

func TestBackoffDoublesUpToTheLimit(t *testing.T) {
	for n, want := range []time.Duration{10, 20, 40, 50, 50} {
		if got := backoff(10*time.Millisecond, 50*time.Millisecond, n); got != want*time.Millisecond {
			t.Fatalf("backoff(%d) = %v, want %v", n, got, want*time.Millisecond)
		}
	}
}

// A tenant whose batch failed is parked: its batches wait while another
// tenant's run; after the backoff only its probe (the failed batch) runs;
// a failed probe parks it again for longer, a stored one resumes it.
func TestSchedulerParksATenantAndLetsOthersRun(t *testing.T) {
	mk := func(tenant string, first uint64) *batch {
		return &batch{key: batchKey{tenant, routing.MustMonth("202601")}, first: first, recs: []*record{{}, {}}}
	}
	t0 := time.Unix(1000, 0)
	delay := func(n int) time.Duration { return time.Duration(n+1) * time.Second }
	s := newScheduler(2)
	a1, a2, b1, b2 := mk("a", 1), mk("a", 2), mk("b", 3), mk("b", 4)
	s.push(a1)
	if s.next(t0) != a1 {
		t.Fatal("a1 first")
	}
	s.push(a2)
	s.push(b1)
	s.push(b2)
	s.done(a1)
	if d := s.park(a1, t0, delay); d != time.Second {
		t.Fatalf("first backoff %v", d)
	}
	if n, ev := s.parked(); n != 1 || ev[nil] != 4 {
		t.Fatalf("parked %d tenants, %v events", n, ev)
	}
	// a is parked: b's batches take both writers
	if s.next(t0) != b1 || s.next(t0) != b2 || s.next(t0) != nil {
		t.Fatal("b must run while a is parked")
	}
	s.done(b1)
	s.done(b2)
	if s.next(t0.Add(999*time.Millisecond)) != nil {
		t.Fatal("a's probe ran before its backoff passed")
	}
	if d, ok := s.wake(t0.Add(500 * time.Millisecond)); !ok || d != 500*time.Millisecond {
		t.Fatalf("wake %v %v", d, ok)
	}
	probe := s.next(t0.Add(time.Second))
	if probe != a1 || !probe.probe {
		t.Fatal("the failed batch must be the probe")
	}
	if s.next(t0.Add(time.Second)) != nil {
		t.Fatal("only the probe runs while a is parked")
	}
	if _, ok := s.wake(t0.Add(time.Second)); ok {
		t.Fatal("no wake-up while the probe runs")
	}
	s.done(probe)
	if d := s.park(probe, t0.Add(time.Second), delay); d != 2*time.Second {
		t.Fatalf("second backoff %v, want longer", d)
	}
	probe = s.next(t0.Add(3 * time.Second))
	if probe != a1 {
		t.Fatal("probe again")
	}
	s.done(probe)
	if !s.resume(probe) {
		t.Fatal("a stored probe resumes its tenant")
	}
	if s.next(t0.Add(3*time.Second)) != a2 {
		t.Fatal("a's other batch runs once resumed")
	}
	if n, _ := s.parked(); n != 0 {
		t.Fatal("still parked")
	}
	// a batch that was not the probe resumes nothing
	s.done(a2)
	if s.resume(a2) || !s.idle() {
		t.Fatal("resume by a non-probe / not idle")
	}
}
