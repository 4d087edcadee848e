package retention

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// A job queued or resumed in the process wakes its job loop: the loop
// passes again at once, not at its next poll (an hour here, so only the
// wake can bring the second pass).
func TestJobLoopWoken(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r := New(Params{Registerer: prometheus.NewRegistry()})
	r.poll = time.Hour
	passes := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- r.RunJobLoop(ctx, func() []string { passes <- struct{}{}; return nil }, time.Second)
	}()
	pass := func(what string) {
		t.Helper()
		select {
		case <-passes:
		case <-time.After(30 * time.Second):
			t.Fatalf("no pass of the job loop %s", what)
		}
	}
	pass("at its start")
	select {
	case <-passes:
		t.Fatal("a pass without a wake or a poll")
	case <-time.After(200 * time.Millisecond):
	}
	r.woken()
	pass("after a job was queued")
	r.woken()
	pass("after another job was queued")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
