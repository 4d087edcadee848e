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

func TestParsePeerLine(t *testing.T) {
	res, err := ParsePeerLine([]byte("sendprobe clients=64\nminimal HTTP send: 173000 ok, 2 failed, 17300/s, p50 3.21ms, p99 6.6ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Sends != 173000 || res.Errors != 2 || res.Rate != 17300 || res.P50 != 3210*time.Microsecond ||
		res.P99 != 6600*time.Microsecond || res.Elapsed != 10*time.Second {
		t.Fatalf("parsed %+v", res)
	}
	for _, bad := range []string{"", "minimal HTTP send: 0 ok, 0 failed, 0/s, p50 0s, p99 0s", "10 ok, 0 failed, 5/s, p50 fast, p99 1ms"} {
		if _, err := ParsePeerLine([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// FuzzParsePeerLine: whatever a peer prints is either refused or read as
// figures a ratio can use (positive rate and count).
func FuzzParsePeerLine(f *testing.F) {
	f.Add([]byte("minimal HTTP send: 10 ok, 0 failed, 5.5/s, p50 1ms, p99 2ms"))
	f.Add([]byte("1 ok, 1 failed, 1/s, p50 1µs, p99 1h"))
	f.Fuzz(func(t *testing.T, out []byte) {
		res, err := ParsePeerLine(out)
		if err == nil && (res.Rate <= 0 || res.Sends <= 0) {
			t.Fatalf("accepted %+v from %q", res, out)
		}
	})
}

func TestMedianAndQuantile(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatalf("median = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatalf("median = %v", m)
	}
	d := make([]time.Duration, 1000)
	for i := range d {
		d[i] = time.Duration(i+1) * time.Millisecond
	}
	if q := quantile(d, 0.999); q != 1000*time.Millisecond {
		t.Fatalf("p99.9 = %v", q)
	}
	if q := quantile(d, 0.5); q != 501*time.Millisecond {
		t.Fatalf("p50 = %v", q)
	}
}
