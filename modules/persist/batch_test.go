package persist

import (
	"fmt"
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
	g := newGrouper(3, 20*time.Millisecond, 1)
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
	if d, ok := g.wait(t0.Add(5*time.Millisecond), never); !ok || d != 15*time.Millisecond {
		t.Fatalf("wait %v %v", d, ok)
	}
	if due := g.due(t0.Add(5*time.Millisecond), false, never); len(due) != 0 {
		t.Fatalf("due before linger: %d", len(due))
	}
	due := g.due(t0.Add(20*time.Millisecond), false, never)
	if len(due) != 3 {
		t.Fatalf("due after linger: %d", len(due))
	}
	for i := 1; i < len(due); i++ {
		if due[i-1].first > due[i].first {
			t.Fatal("due batches not oldest first")
		}
	}
	if _, ok := g.wait(t0, never); ok {
		t.Fatal("nothing open, yet a wait")
	}
}

func TestGrouperBeforeKeepsATenantsDeliveryOrder(t *testing.T) {
	g := newGrouper(2, time.Second, 1)
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

// topicOfStripe finds a topic name in stripe i of n.
func topicOfStripe(t *testing.T, i, n int) string {
	for k := 0; k < 1000; k++ {
		if topic := fmt.Sprintf("t%d", k); stripeOf(topic, n) == i {
			return topic
		}
	}
	t.Fatalf("no topic in stripe %d of %d", i, n)
	return ""
}

// A tenant's records are batched apart by topic stripe, so its full
// batches touch disjoint topics; at the linger the stripes' partial batches
// are joined again, as few as the batch size allows.
func TestGrouperKeepsTopicStripesApartAndJoinsThemAtTheLinger(t *testing.T) {
	const stripes = 4
	t0 := time.Unix(1000, 0)
	g := newGrouper(4, 20*time.Millisecond, stripes)
	topics := make([]string, stripes)
	for i := range topics {
		topics[i] = topicOfStripe(t, i, stripes)
	}
	seq := uint64(0)
	add := func(stripe int, at time.Time) *batch {
		seq++
		r := rec(seq, "a", "202601")
		r.ev.Topic = topics[stripe]
		return g.add(r, at)
	}
	// stripe 0 fills alone: one full batch of stripe 0 only
	for i := 0; i < 3; i++ {
		if add(0, t0) != nil || add(1, t0) != nil {
			t.Fatal("a batch filled early")
		}
	}
	full := add(0, t0)
	if full == nil || len(full.recs) != 4 || full.stripes != 1 {
		t.Fatalf("full batch %+v", full)
	}
	for _, r := range full.recs {
		if stripeOf(r.ev.Topic, stripes) != 0 {
			t.Fatalf("stripe 0's batch holds topic %s", r.ev.Topic)
		}
	}
	// at the linger: stripe 1 (3 records) and stripes 2 and 3 (1 each, a
	// later month's record between) join into batches of at most 4
	add(2, t0.Add(5*time.Millisecond))
	add(3, t0.Add(6*time.Millisecond))
	seq++
	other := rec(seq, "a", "202602")
	other.ev.Topic = topics[2]
	g.add(other, t0.Add(7*time.Millisecond))
	if due := g.due(t0.Add(19*time.Millisecond), false, never); len(due) != 0 {
		t.Fatalf("due before the linger: %d", len(due))
	}
	due := g.due(t0.Add(20*time.Millisecond), false, never)
	if len(due) != 2 {
		t.Fatalf("due at the linger: %d batches, want 2 (3+1 and 1)", len(due))
	}
	if len(due[0].recs) != 4 || due[0].stripes != 1<<1|1<<2 || len(due[1].recs) != 1 || due[1].stripes != 1<<3 {
		t.Fatalf("joined %d records of stripes %b, then %d of %b", len(due[0].recs), due[0].stripes, len(due[1].recs), due[1].stripes)
	}
	if due[0].first > due[1].first || !due[0].since.Equal(t0) {
		t.Fatal("joined batches not oldest first, or the linger not from the oldest record")
	}
	// the later month's batch is not due yet
	if rest := g.due(t0.Add(26*time.Millisecond), false, never); len(rest) != 0 {
		t.Fatalf("the later month's batch due early: %d", len(rest))
	}
	if rest := g.due(t0.Add(27*time.Millisecond), false, never); len(rest) != 1 || rest[0].key.month != routing.MustMonth("202602") {
		t.Fatalf("the later month's batch: %+v", rest)
	}
}

func never(string) bool { return false }

// While every writer is busy, a part-full batch of a tenant that has
// batches running keeps filling past the linger (it could only queue); a
// quiet tenant's batch, with nothing running, is due at the linger, so a
// busy tenant never keeps it waiting.
func TestGrouperLetsOnlyARunningTenantHoldWhileTheWritersAreBusy(t *testing.T) {
	t0 := time.Unix(1000, 0)
	g := newGrouper(10, 20*time.Millisecond, 1)
	s := newScheduler(1)
	s.push(&batch{key: batchKey{"busy", routing.MustMonth("202601")}})
	if s.next(t0) == nil || !s.busy() {
		t.Fatal("the busy tenant's batch must run")
	}
	g.add(rec(1, "busy", "202601"), t0)
	g.add(rec(2, "quiet", "202601"), t0.Add(time.Millisecond))
	if d, ok := g.wait(t0, s.holds); !ok || d != 21*time.Millisecond {
		t.Fatalf("wait %v %v: the quiet tenant's linger counts", d, ok)
	}
	due := g.due(t0.Add(time.Second), false, s.holds)
	if len(due) != 1 || due[0].key.tenant != "quiet" {
		t.Fatalf("due while busy: %+v", due)
	}
	if _, ok := g.wait(t0, s.holds); ok {
		t.Fatal("the holding tenant's batch has no deadline while it holds")
	}
	for _, b := range due {
		s.push(b)
	}
	s.done(&batch{key: batchKey{"busy", routing.MustMonth("202601")}})
	if s.holds("busy") {
		t.Fatal("holds with nothing running")
	}
	if due := g.due(t0.Add(time.Second), false, s.holds); len(due) != 1 || due[0].key.tenant != "busy" {
		t.Fatalf("the busy tenant's batch is due once its writer is free: %+v", due)
	}
}

// A full batch flushes its tenant's older batches of other months ahead
// of it, not its own month's other stripes.
func TestGrouperBeforeLeavesTheMonthsOtherStripesOpen(t *testing.T) {
	g := newGrouper(2, time.Second, 2)
	now := time.Now()
	r := func(seq uint64, month string, stripe int) *record {
		x := rec(seq, "a", month)
		x.ev.Topic = topicOfStripe(t, stripe, 2)
		return x
	}
	g.add(r(1, "202601", 0), now)
	g.add(r(2, "202602", 1), now)
	g.add(r(3, "202602", 0), now)
	full := g.add(r(4, "202602", 0), now)
	if full == nil {
		t.Fatal("stripe 0 of 202602 must be full")
	}
	older := g.before(full)
	if len(older) != 1 || older[0].key.month != routing.MustMonth("202601") {
		t.Fatalf("before = %+v", older)
	}
	if len(g.open) != 1 {
		t.Fatalf("the month's other stripe must stay open: %d open", len(g.open))
	}
}

// Batches of one tenant and month on disjoint stripes run side by side; one
// whose stripe is busy waits, and a later batch on a free stripe may pass
// it, but never a batch of another month.
func TestSchedulerRunsATenantsStripesSideBySide(t *testing.T) {
	mk := func(month string, stripes uint64, first uint64) *batch {
		return &batch{key: batchKey{"a", routing.MustMonth(month)}, stripes: stripes, first: first}
	}
	s := newScheduler(4)
	s0, s0b, s1, m2, s2 := mk("202601", 1, 1), mk("202601", 1, 2), mk("202601", 2, 3), mk("202602", 4, 4), mk("202601", 4, 5)
	for _, b := range []*batch{s0, s0b, s1, m2, s2} {
		s.push(b)
	}
	if s.next(time.Time{}) != s0 {
		t.Fatal("first batch first")
	}
	if got := s.next(time.Time{}); got != s1 {
		t.Fatalf("stripe 1 runs beside stripe 0, got %+v", got)
	}
	if got := s.next(time.Time{}); got != nil {
		t.Fatalf("stripe 0 is busy and the next month waits, so nothing after it may run; got %+v", got)
	}
	s.done(s0)
	if s.next(time.Time{}) != s0b {
		t.Fatal("stripe 0's second batch once the first is done")
	}
	s.done(s1)
	s.done(s0b)
	if s.next(time.Time{}) != m2 {
		t.Fatal("the next month once the tenant's batches of the first are done")
	}
	s.done(m2)
	if s.next(time.Time{}) != s2 || !func() bool { s.done(s2); return s.idle() }() {
		t.Fatal("last batch / not idle")
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
	if d, n := s.park(a1, t0, delay); d != time.Second || n != 1 {
		t.Fatalf("first backoff %v, failures %d", d, n)
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
	if d, n := s.park(probe, t0.Add(time.Second), delay); d != 2*time.Second || n != 2 {
		t.Fatalf("second backoff %v, want longer; failures %d", d, n)
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
