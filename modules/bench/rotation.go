package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// RotationParams drive `imshard bench rotation`: authenticated requests
// at a fixed rate (open loop: each is due at its time whether the ones
// before it have answered or not) for Duration without a rotation, then
// for Duration across a key rotation as docs/operations.md "Key rotation"
// tells: a reload adds the new key at a quarter of the run, the issuer
// switches to it at half, and once no request of the old key's token is
// under way a reload removes the old key.
type RotationParams struct {
	URL string // a GET the API answers 200 to any user of the tenant
	// Token is a token of the tenant's key kid.
	Token func(kid string) (string, error)
	// Keys reloads the tenant with exactly the keys kids.
	Keys func(kids []string)
	// Old and New are the kids of the rotation; the tenant starts with Old
	// alone.
	Old, New    string
	Rate        int
	Duration    time.Duration
	Concurrency int
	Client      *http.Client
	Progress    io.Writer
}

// RotationResult is one run: every request, the ones not answered 200,
// the latencies measured from each request's due time.
type RotationResult struct {
	Name         string
	Requests     int64
	Failed       int64
	FirstFailure string
	Elapsed      time.Duration
	P50, P99     time.Duration
}

// Rate is the requests answered per second.
func (r RotationResult) Rate() float64 { return Rate(r.Requests, r.Elapsed) }

// RotationReport is the run without a rotation (the reference) and the
// one across it.
type RotationReport struct {
	Steady, Rotation RotationResult
}

// Rotation runs both.
func Rotation(ctx context.Context, p RotationParams) (RotationReport, error) {
	if p.Rate < 1 || p.Duration <= 0 || p.Concurrency < 1 {
		return RotationReport{}, errors.New("bench: rate, duration and concurrency must be positive")
	}
	var rep RotationReport
	tok, err := p.Token(p.Old)
	if err != nil {
		return rep, err
	}
	var cur atomic.Pointer[genToken]
	cur.Store(&genToken{token: tok})
	fmt.Fprintf(p.Progress, "bench: %d requests/s for %s without a rotation\n", p.Rate, p.Duration)
	if rep.Steady, err = p.run(ctx, "steady", &cur, nil); err != nil {
		return rep, err
	}
	fmt.Fprintf(p.Progress, "bench: %d requests/s for %s across a rotation of %s to %s\n", p.Rate, p.Duration, p.Old, p.New)
	rep.Rotation, err = p.run(ctx, "rotation", &cur, func(inFlightOld *atomic.Int64) error {
		if err := sleepCtx(ctx, p.Duration/4); err != nil {
			return err
		}
		p.Keys([]string{p.Old, p.New})
		fmt.Fprintf(p.Progress, "bench: key %s added\n", p.New)
		if err := sleepCtx(ctx, p.Duration/4); err != nil {
			return err
		}
		next, err := p.Token(p.New)
		if err != nil {
			return err
		}
		cur.Store(&genToken{gen: 1, token: next})
		fmt.Fprintf(p.Progress, "bench: the issuer signs with %s\n", p.New)
		if err := sleepCtx(ctx, p.Duration/4); err != nil {
			return err
		}
		for inFlightOld.Load() > 0 {
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return err
			}
		}
		p.Keys([]string{p.New})
		fmt.Fprintf(p.Progress, "bench: key %s removed\n", p.Old)
		return nil
	})
	return rep, err
}

// genToken is the issuer's token: generation 0 of the old key, 1 of the new.
type genToken struct {
	gen   int
	token string
}

// run sends p.Rate requests a second for p.Duration with the current
// token; rotate, when set, runs beside them, told how many requests with
// a generation-0 token are under way.
func (p *RotationParams) run(ctx context.Context, name string, cur *atomic.Pointer[genToken], rotate func(*atomic.Int64) error) (RotationResult, error) {
	res := RotationResult{Name: name}
	total := int(int64(p.Rate) * int64(p.Duration) / int64(time.Second))
	due := make(chan time.Time, total)
	var inFlightOld, failed atomic.Int64
	var firstFailure atomic.Value
	lat := make([][]time.Duration, p.Concurrency)
	var wg sync.WaitGroup
	for w := range p.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range due {
				// counted before the token is read: a request that reads
				// the old key's token is in the count from before the
				// issuer switched, so the rotator's wait for none under way
				// cannot pass between this read and its count
				inFlightOld.Add(1)
				t := cur.Load()
				if t.gen != 0 {
					inFlightOld.Add(-1)
				}
				err := p.get(ctx, t.token)
				if t.gen == 0 {
					inFlightOld.Add(-1)
				}
				lat[w] = append(lat[w], time.Since(at))
				if err != nil {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	rotated := make(chan error, 1)
	if rotate != nil {
		go func() { rotated <- rotate(&inFlightOld) }()
	} else {
		rotated <- nil
	}
	start := time.Now()
	interval := time.Second / time.Duration(p.Rate)
	var err error
	for i := range total {
		at := start.Add(time.Duration(i) * interval)
		if err = sleepCtx(ctx, time.Until(at)); err != nil {
			break
		}
		due <- at
	}
	close(due)
	wg.Wait()
	res.Elapsed = time.Since(start)
	if rerr := <-rotated; err == nil {
		err = rerr
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	res.Requests, res.Failed = int64(len(all)), failed.Load()
	if f, ok := firstFailure.Load().(string); ok {
		res.FirstFailure = f
	}
	res.P50, res.P99 = percentiles(all)
	return res, err
}

// get makes one request; anything but 200 is a failure.
func (p *RotationParams) get(ctx context.Context, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := p.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %d", p.URL, resp.StatusCode)
	}
	return nil
}
