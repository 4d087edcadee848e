package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

type otherError struct{}

func (otherError) Error() string { return "other" }

// TestBenchLoopErrorsOfDifferentTypes: a run whose operations fail with
// errors of different types counts them all and reports one, instead of
// panicking on the second type.
func TestBenchLoopErrorsOfDifferentTypes(t *testing.T) {
	b := &sendBench{p: SendParams{Concurrency: 4}}
	s, err := b.loop(context.Background(), 50*time.Millisecond, func(_ context.Context, _ int, n int64) error {
		if n%2 == 0 {
			return otherError{}
		}
		return fmt.Errorf("wrapped %d: %w", n, errors.ErrUnsupported)
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.errs < 2 || s.firstErr == nil || len(s.lats) != 0 {
		t.Fatalf("errs=%d first=%v ok=%d, want every operation failed and one error kept", s.errs, s.firstErr, len(s.lats))
	}
}
