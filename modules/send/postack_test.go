package send

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// fakeSent answers each send the number in its first key; a key "fail"
// fails that send alone. The first call blocks until release is closed.
type fakeSent struct {
	mu      sync.Mutex
	calls   [][]string // the keys of each call
	release chan struct{}
	entered chan struct{}
	failOne error // the first call's failure as a whole
}

func (f *fakeSent) call(_ context.Context, keys, args []string) ([]ackReply, error) {
	f.mu.Lock()
	f.calls = append(f.calls, slices.Clone(keys))
	first := len(f.calls) == 1
	f.mu.Unlock()
	if first && f.release != nil {
		close(f.entered)
		<-f.release
	}
	if first && f.failOne != nil {
		return nil, f.failOne
	}
	if len(keys) != len(args) {
		return nil, fmt.Errorf("%d keys, %d args", len(keys), len(args))
	}
	out := make([]ackReply, len(keys))
	for i, k := range keys {
		if k == "fail" {
			out[i].err = errors.New("WRONGTYPE")
			continue
		}
		n, _ := strconv.ParseInt(k, 10, 64)
		out[i].n = n
	}
	return out, nil
}

func (b *ackBatcher) queued(tenant string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[tenant]; q != nil {
		return len(q.items)
	}
	return 0
}

// Sends whose acks arrive while a call is in flight share the next call,
// each with its own reply; a send of an idle tenant makes its call at once,
// alone; another tenant's sends never join a call.
func TestAckBatcherCoalescesWhileACallIsInFlight(t *testing.T) {
	f := &fakeSent{release: make(chan struct{}), entered: make(chan struct{})}
	var sizes []int
	var sizesMu sync.Mutex
	b := newAckBatcher(f.call, func(n int) { sizesMu.Lock(); sizes = append(sizes, n); sizesMu.Unlock() })
	ctx := context.Background()

	type result struct {
		key string
		n   int64
		err error
	}
	results := make(chan result, 16)
	send := func(tenant, key string) {
		n, err := b.do(ctx, tenant, []string{key}, []string{"a" + key})
		results <- result{key, n, err}
	}
	go send("t1", "1")
	<-f.entered // the first call is in flight, holding t1's turn
	for _, k := range []string{"2", "fail", "4"} {
		go send("t1", k)
	}
	go send("t2", "7") // another tenant: a call of its own, at once
	if r := <-results; r.key != "7" || r.n != 7 || r.err != nil {
		t.Fatalf("the other tenant's send = %+v, want its own call at once", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.queued("t1") != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sends queued behind the call in flight, want 3", b.queued("t1"))
		}
		time.Sleep(time.Millisecond)
	}
	close(f.release)
	got := map[string]result{}
	for range 4 {
		r := <-results
		got[r.key] = r
	}
	for _, k := range []string{"1", "2", "4"} {
		if want, _ := strconv.ParseInt(k, 10, 64); got[k].n != want || got[k].err != nil {
			t.Errorf("send %s = %+v, want its own reply %d", k, got[k], want)
		}
	}
	if got["fail"].err == nil {
		t.Errorf("the send whose part failed answered %+v, want its error", got["fail"])
	}
	if len(f.calls) != 3 {
		t.Fatalf("calls %v, want 3: t1's first, t2's, then t1's three queued sends together", f.calls)
	}
	last := slices.Clone(f.calls[2])
	slices.Sort(last)
	if !slices.Equal(last, []string{"2", "4", "fail"}) {
		t.Errorf("the second call of t1 carried %v, want the three queued sends", f.calls[2])
	}
	if b.queued("t1") != 0 || len(b.queues) != 0 {
		t.Errorf("queues left after every call returned: %v", b.queues)
	}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{1, 1, 3}) {
		t.Errorf("observed batch sizes %v, want 1, 1, 3", sizes)
	}
}

// A call that fails as a whole fails every send it carried, and the sends
// queued behind it still get a call of their own.
func TestAckBatcherFailedCallFailsItsSendsOnly(t *testing.T) {
	f := &fakeSent{release: make(chan struct{}), entered: make(chan struct{}), failOne: errors.New("connection reset")}
	b := newAckBatcher(f.call, nil)
	ctx := context.Background()
	first := make(chan error, 2)
	for _, k := range []string{"1", "2"} {
		go func() { _, err := b.do(ctx, "t", []string{k}, []string{"a"}); first <- err }()
		if k == "1" {
			<-f.entered
		}
	}
	for b.queued("t") != 1 {
		time.Sleep(time.Millisecond)
	}
	// a third send joins the second's call: the first call fails
	second := make(chan error, 1)
	go func() { _, err := b.do(ctx, "t", []string{"3"}, []string{"c"}); second <- err }()
	for b.queued("t") != 2 {
		time.Sleep(time.Millisecond)
	}
	close(f.release)
	if err := <-first; err == nil || err.Error() != "connection reset" {
		t.Fatalf("the send of the failed call = %v, want its error", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("a send queued behind a failed call = %v, want its own call to succeed", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("a send queued behind a failed call = %v, want its own call to succeed", err)
	}
	if len(f.calls) != 2 || len(f.calls[1]) != 2 {
		t.Fatalf("calls %v, want the failed one and one for the two queued sends", f.calls)
	}
}

// More sends than one call takes are carried by successive calls, every
// one answered.
func TestAckBatcherSplitsLongQueues(t *testing.T) {
	f := &fakeSent{release: make(chan struct{}), entered: make(chan struct{})}
	b := newAckBatcher(f.call, nil)
	ctx := context.Background()
	const n = 2*maxAckBatch + 5
	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	wg.Add(1)
	go func() { defer wg.Done(); _, err := b.do(ctx, "t", []string{"0"}, []string{"a"}); errs <- err }()
	<-f.entered
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := b.do(ctx, "t", []string{strconv.Itoa(i)}, []string{"a"})
			if err == nil && got != int64(i) {
				err = fmt.Errorf("send %d answered %d", i, got)
			}
			errs <- err
		}()
	}
	for b.queued("t") != n {
		time.Sleep(time.Millisecond)
	}
	close(f.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range f.calls {
		if len(c) > maxAckBatch {
			t.Fatalf("call %d carried %d sends, more than %d", i, len(c), maxAckBatch)
		}
	}
	if len(f.calls) != 1+3 {
		t.Fatalf("%d calls, want the first and three for %d queued sends", len(f.calls), n)
	}
}
