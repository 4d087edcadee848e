package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
)

// LimitsParams drive `imshard bench limits`: one user sends to one topic
// through several send processes of one tenant at Offered times the
// user's send limit, open loop, the sends spread evenly over the
// processes; the limit is exact across processes when the accepted rate
// is the limit's.
type LimitsParams struct {
	BaseURLs  []string // the send processes' APIs
	Tenant    string
	Secret    []byte
	PerSecond float64 // the user's send limit (limits.send.user.per_second)
	Burst     int     // and its burst
	Offered   float64 // the offered rate as a multiple of PerSecond
	Duration  time.Duration
	Progress  io.Writer
}

// LimitsReport is what one run measured.
type LimitsReport struct {
	Params   LimitsParams
	Elapsed  time.Duration
	Accepted []int64 // 201s per process
	Refused  int64   // 429 rate_limited
	Failed   int64   // anything else
	FirstErr error
}

// AcceptedRate is the sends accepted per second, all processes together,
// less the burst the bucket held at the start: the rate the limit lets
// through in its steady state.
func (r LimitsReport) AcceptedRate() float64 {
	var n int64
	for _, a := range r.Accepted {
		n += a
	}
	return float64(n-int64(r.Params.Burst)) / r.Elapsed.Seconds()
}

// Deviation is how far the accepted rate is from the limit, as a fraction
// of the limit (the bar: at most 0.05).
func (r LimitsReport) Deviation() float64 {
	d := r.AcceptedRate()/r.Params.PerSecond - 1
	if d < 0 {
		return -d
	}
	return d
}

// Limits makes the user a member of the run's topic, then sends for the
// duration and counts the answers.
func Limits(ctx context.Context, p LimitsParams) (LimitsReport, error) {
	if len(p.BaseURLs) == 0 || p.PerSecond <= 0 || p.Offered <= 0 {
		return LimitsReport{}, errors.New("bench: limits needs processes, a limit and an offered rate")
	}
	rep := LimitsReport{Params: p, Accepted: make([]int64, len(p.BaseURLs))}
	b := &sendBench{hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: openLoopWorkers}}}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "limits-" + run
	svc, err := httpapi.Sign(p.Secret, p.Tenant, 1<<40, httpapi.RoleService, time.Hour)
	if err != nil {
		return rep, err
	}
	user, err := httpapi.Sign(p.Secret, p.Tenant, 1, "", 24*time.Hour)
	if err != nil {
		return rep, err
	}
	group, _ := json.Marshal(map[string]any{"group_id": 1, "status": "active"})
	if err := b.do(ctx, p.BaseURLs[0], "PUT", "/v1/topics/"+topic, svc, group, http.StatusOK); err != nil {
		return rep, err
	}
	if err := b.do(ctx, p.BaseURLs[0], "PUT", "/v1/topics/"+topic+"/members/1", svc, []byte(`{"role":"member"}`), http.StatusOK); err != nil {
		return rep, err
	}
	rate := p.PerSecond * p.Offered
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, "one user sending at %.0f/s (%.1f× its limit of %g/s, burst %d) through %d processes for %s\n",
			rate, p.Offered, p.PerSecond, p.Burst, len(p.BaseURLs), p.Duration)
	}
	var refused, failed atomic.Int64
	var firstErr atomic.Value
	accepted := make([]atomic.Int64, len(p.BaseURLs))
	op := func(ctx context.Context, _ int, n int64) error {
		i := int(n % int64(len(p.BaseURLs)))
		err := b.post(ctx, p.BaseURLs[i], user, topic, run+"-"+strconv.FormatInt(n, 10), "x")
		switch {
		case err == nil:
			accepted[i].Add(1)
		case isRefusal(err):
			refused.Add(1)
		default:
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
		return nil
	}
	s, err := b.openLoop(ctx, p.Duration, rate, op)
	if err != nil {
		return rep, err
	}
	rep.Elapsed = s.elapsed
	for i := range accepted {
		rep.Accepted[i] = accepted[i].Load()
	}
	rep.Refused, rep.Failed = refused.Load(), failed.Load()
	if e, ok := firstErr.Load().(error); ok {
		rep.FirstErr = e
	}
	return rep, nil
}

// isRefusal tells a 429 from sendBench.do's error of another answer.
func isRefusal(err error) bool {
	var st *statusError
	return errors.As(err, &st) && st.status == http.StatusTooManyRequests
}
