package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// TestRouteFixWhileSending runs `route check --fix` over and over while
// members send to the topics: every accepted message is stored, the mirror
// afterwards matches the month tables exactly, and the Redis route has
// every month with the tables' first and last seq.
func TestRouteFixWhileSending(t *testing.T) {
	t.Parallel()
	e := writepathStart(t, harness.Options{})
	topics := []string{"fix-a", "fix-b"}
	for i, topic := range topics {
		writepathMembers(t, e, topic, int64(i+1), 1, 9)
	}
	ctx := context.Background()
	rc := e.App.NewRouteCheck()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var fixes int
	var fixErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := rc.Check(ctx, e.Tenant, topics, true, func(routecheck.Difference) {})
			if err != nil {
				fixErr = err
				return
			}
			fixes += res.Fixed
		}
	}()
	sent := writepathSendMany(t, []*sendEnv{e}, topics, 1, 8, 40, nil)
	close(stop)
	wg.Wait()
	if fixErr != nil {
		t.Fatalf("fix under traffic: %v", fixErr)
	}
	if fixes == 0 {
		t.Fatal("no fix ran while the sends did")
	}
	stored := persistWaitCount(t, e.Env, len(sent), 60*time.Second, e.Start)
	for _, topic := range topics {
		var want routing.MonthRange
		for seq := range stored[topic] {
			if want.Count == 0 || seq < want.MinSeq {
				want.MinSeq = seq
			}
			want.MaxSeq = max(want.MaxSeq, seq)
			want.Count++
		}
		want.Month = e.Start
		mirror, err := routing.LoadMirror(ctx, e.DB, topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(mirror) != 1 || mirror[0] != want {
			t.Fatalf("%s: mirror %+v after fixes under traffic, tables %+v", topic, mirror, want)
		}
		waitFor(t, 10*time.Second, func() bool {
			route, _, err := e.App.Routes().Load(ctx, e.Tenant, topic)
			if err != nil {
				t.Fatal(err)
			}
			return len(route) == 1 && route[0].Month == want.Month && route[0].MinSeq == want.MinSeq && route[0].MaxSeq == want.MaxSeq
		})
	}
}
