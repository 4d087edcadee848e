package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestRotationOrder runs the rotation against a server that accepts the
// tokens of the keys the last reload gave: the new key is added before the
// issuer uses it and the old one removed only after its last request, so
// no request fails; every request due is made.
func TestRotationOrder(t *testing.T) {
	var mu sync.Mutex
	keys := []string{"old"}
	var steps []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(keys, r.Header.Get("Authorization")[len("Bearer "):]) {
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	p := RotationParams{
		URL:   srv.URL,
		Token: func(kid string) (string, error) { return kid, nil },
		Keys: func(kids []string) {
			mu.Lock()
			defer mu.Unlock()
			keys = kids
			steps = append(steps, kids...)
			steps = append(steps, "|")
		},
		Old: "old", New: "new", Rate: 400, Duration: 400 * time.Millisecond, Concurrency: 8,
		Client: srv.Client(), Progress: io.Discard,
	}
	rep, err := Rotation(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []RotationResult{rep.Steady, rep.Rotation} {
		if r.Requests != 160 || r.Failed != 0 {
			t.Fatalf("%s: %d requests, %d failed (%s); want 160, none failed", r.Name, r.Requests, r.Failed, r.FirstFailure)
		}
	}
	if want := []string{"old", "new", "|", "new", "|"}; !slices.Equal(steps, want) {
		t.Fatalf("reloads %v, want %v", steps, want)
	}
	// the check fails a rotation that removes the old key too early
	keys, steps = []string{"old"}, nil
	early := p
	early.Keys = func(kids []string) {
		mu.Lock()
		defer mu.Unlock()
		keys = []string{"new"}
	}
	rep, err = Rotation(context.Background(), early)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rotation.Failed == 0 {
		t.Fatal("a rotation removing the old key with its first reload failed no request")
	}
}
