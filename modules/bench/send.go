package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// SendParams drive `imshard bench send`: the product's HTTP send beside a
// reference send — the simplest correct send, written here from plain Redis
// and Kafka client calls — and optionally an outside peer command, in
// paired, alternating rounds with the same clients, body and GOMAXPROCS.
type SendParams struct {
	Concurrency int
	Round       time.Duration // measured time of each side in each round
	Warmup      time.Duration // unmeasured time of each side before the first round
	Topics      int
	Pairs       int // rounds; each runs every side once, the first side rotating
	BodyBytes   int // length of the message text
	// open-loop arrival rates (per second); RateShares are fractions of the
	// reference send's median closed-loop rate, used when Rates is empty
	Rates      []float64
	RateShares []float64
	Peer       string // shell command printing the peer's line; "" = none
	// ProfileHTTP receives a CPU profile of the first round's HTTP side
	// alone (the measured time, nothing else of the run); nil = none
	ProfileHTTP io.Writer

	BaseURL string // the API
	Tenant  string
	Secret  []byte

	Redis     rueidis.Client
	KeySpace  routing.KeySpace
	Allocator *routing.Allocator // the raw allocation figure
	Producer  []kgo.Opt          // the reference's producer: the send path's settings (send.ProducerOpts)

	// Persist, when set, starts a persist role for the preparation and
	// returns its stop (nil: persist runs elsewhere, as behind --addr).
	// A send role asks MySQL for an earlier send of every message until
	// the tenant's idempotency horizon stands, and the horizon stands only
	// once persist's progress vouches for MySQL (docs/operations.md,
	// "Persist"): every deployment runs persist, so the rounds start once
	// the horizon stands, and persist stops before them (awaitHorizon).
	Persist        func(context.Context) (stop func(), err error)
	ProduceTimeout time.Duration // send.produce_timeout: how long the horizon can take to stand

	Progress io.Writer // one line per phase
}

// Sides of the comparison.
const (
	SideHTTP      = "HTTP send (end to end)"
	SideReference = "reference send"
	SidePeer      = "peer (--peer)"
)

// Redis commands each side sends per message at the top level (the
// commands a script runs are counted by INFO commandstats too, and their
// time is inside the script's): the weights of the Redis µs per send. The
// HTTP send's FCALLs count as observed: one before the produce, and the
// call after the ack shared by the sends acknowledged together.
var topLevel = map[string]map[string]float64{
	SideHTTP:      {"fcall": asObserved},
	SideReference: {"evalsha": 1, "hset": 1, "zrem": 1, "zadd": 1, "pexpire": 1, "spublish": 1},
	SidePeer:      {"evalsha": 1, "hset": 1, "zrem": 1, "zadd": 1, "pexpire": 1, "publish": 1},
}

// RoundResult is one side's figures in one round (or one open-loop run).
type RoundResult struct {
	Side           string
	Sends, Errors  int64
	Elapsed        time.Duration
	P50, P99, P999 time.Duration
	RedisUS        float64 // Redis command µs per send (INFO commandstats deltas, top-level commands)
	RedisCPUUS     float64 // Redis server CPU µs per send (INFO cpu deltas, whole server), 0 = unknown
	AllocsPerSend  float64 // heap allocations per send in this process (client included), 0 = unknown
	CPUUS          float64 // this process's CPU µs per send (user + system; the clients, and in-process the API and broker, included), 0 = unknown
	PeakRSS        int64   // peak RSS of this process during the round, bytes, 0 = unknown
	PeakInFlight   int64   // open loop: the most requests in flight at once (arrived, not answered)
	Rate           float64 // sends per second
	FirstErr       error
	Offered        float64 // open loop: the arrival rate
}

// SendReport is the whole comparison.
type SendReport struct {
	Sides       []string
	Rounds      [][]RoundResult // per round, in Sides order
	Alloc       RoundResult
	OpenLoop    [][]RoundResult // per rate: HTTP, reference
	RecordBytes map[string]float64
	GOMAXPROCS  int
}

// Median is the median of each figure of side over the rounds.
func (r SendReport) Median(side string) RoundResult {
	i := slices.Index(r.Sides, side)
	out := RoundResult{Side: side}
	if i < 0 || len(r.Rounds) == 0 {
		return out
	}
	col := func(f func(RoundResult) float64) float64 {
		v := make([]float64, len(r.Rounds))
		for k, round := range r.Rounds {
			v[k] = f(round[i])
		}
		return median(v)
	}
	dur := func(f func(RoundResult) time.Duration) time.Duration {
		return time.Duration(col(func(x RoundResult) float64 { return float64(f(x)) }))
	}
	out.Rate = col(func(x RoundResult) float64 { return x.Rate })
	out.P50 = dur(func(x RoundResult) time.Duration { return x.P50 })
	out.P99 = dur(func(x RoundResult) time.Duration { return x.P99 })
	out.P999 = dur(func(x RoundResult) time.Duration { return x.P999 })
	out.RedisUS = col(func(x RoundResult) float64 { return x.RedisUS })
	out.RedisCPUUS = col(func(x RoundResult) float64 { return x.RedisCPUUS })
	out.AllocsPerSend = col(func(x RoundResult) float64 { return x.AllocsPerSend })
	out.CPUUS = col(func(x RoundResult) float64 { return x.CPUUS })
	out.PeakRSS = int64(col(func(x RoundResult) float64 { return float64(x.PeakRSS) }))
	for _, round := range r.Rounds {
		out.Sends += round[i].Sends
		out.Errors += round[i].Errors
	}
	return out
}

// Ratios are the medians over the rounds of side's rate and p99 divided by
// ref's in the same round.
func (r SendReport) Ratios(side, ref string) (rate, p99 float64) {
	i, j := slices.Index(r.Sides, side), slices.Index(r.Sides, ref)
	if i < 0 || j < 0 || len(r.Rounds) == 0 {
		return 0, 0
	}
	rates, p99s := make([]float64, len(r.Rounds)), make([]float64, len(r.Rounds))
	for k, round := range r.Rounds {
		rates[k] = round[i].Rate / round[j].Rate
		p99s[k] = float64(round[i].P99) / float64(round[j].P99)
	}
	return median(rates), median(p99s)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchMembers is how many users each benchmark topic has; client k sends
// as user k mod benchMembers + 1.
const benchMembers = 16

// recordSamples is how many idempotency records of each side are weighed.
const recordSamples = 200

// Send prepares the groups, measures the raw allocation, then runs the
// rounds and the open-loop runs.
func Send(ctx context.Context, p SendParams) (SendReport, error) {
	keys, err := p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return SendReport{}, err
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	httpTopics, allocTopics := make([]string, p.Topics), make([]string, p.Topics)
	for i := range p.Topics {
		httpTopics[i] = fmt.Sprintf("bench-%s-%d", run, i)
		allocTopics[i] = fmt.Sprintf("alloc-%s-%d", run, i)
	}
	conns := max(p.Concurrency, openLoopWorkers)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}}
	b := &sendBench{p: p, hc: hc, run: run}
	progress := func(format string, args ...any) {
		if p.Progress != nil {
			fmt.Fprintf(p.Progress, format+"\n", args...)
		}
	}
	rep := SendReport{GOMAXPROCS: runtime.GOMAXPROCS(0), RecordBytes: map[string]float64{}}
	progress("preparing %d groups of %d members", p.Topics, benchMembers)
	stopPersist := func() {}
	if p.Persist != nil {
		if stopPersist, err = p.Persist(ctx); err != nil {
			return rep, err
		}
	}
	err = b.setup(ctx, httpTopics)
	if err == nil {
		err = b.awaitHorizon(ctx, keys, httpTopics[0], progress)
	}
	stopPersist()
	if err != nil {
		return rep, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := b.cleanup(ctx); err != nil {
			progress("cleanup of the run's Redis keys failed: %v", err)
		}
	}()

	progress("raw allocation FCALL, %d clients, %s", p.Concurrency, p.Round)
	alloc := func(ctx context.Context, _ int, n int64) error {
		_, err := p.Allocator.Allocate(ctx, p.Tenant, allocTopics[n%int64(len(allocTopics))])
		return err
	}
	if _, err := b.loop(ctx, p.Warmup, alloc); err != nil {
		return rep, err
	}
	s, err := b.loop(ctx, p.Round, alloc)
	if err != nil {
		return rep, err
	}
	if rep.Alloc, err = s.result("raw allocation (FCALL)"); err != nil {
		return rep, err
	}

	ref, err := startReference(p, keys.BenchReference(run), run, p.Topics)
	if err != nil {
		return rep, err
	}
	defer ref.close()
	tokens := make([]string, benchMembers)
	for u := range tokens {
		if tokens[u], err = httpapi.Sign(p.Secret, p.Tenant, int64(u+1), "", 24*time.Hour); err != nil {
			return rep, err
		}
	}
	text := strings.Repeat("x", max(p.BodyBytes, 1))
	var sampleMu sync.Mutex
	samples := map[string][]string{}
	keep := func(side, key string) {
		sampleMu.Lock()
		if len(samples[side]) < recordSamples {
			samples[side] = append(samples[side], key)
		}
		sampleMu.Unlock()
	}
	ops := map[string]func(ctx context.Context, w int, n int64) error{
		SideHTTP: func(ctx context.Context, w int, n int64) error {
			uid, topic, cmid := w%benchMembers+1, n%int64(p.Topics), run+"-"+strconv.FormatInt(n, 10)
			err := b.post(ctx, b.p.BaseURL, tokens[uid-1], httpTopics[topic], cmid, text)
			if err == nil {
				keep(SideHTTP, keys.Idempotency(httpTopics[topic], int64(uid), cmid))
			}
			return err
		},
		SideReference: func(ctx context.Context, w int, n int64) error {
			uid, topic, cmid := w%benchMembers+1, n%int64(p.Topics), run+"-"+strconv.FormatInt(n, 10)
			err := b.post(ctx, ref.url, tokens[uid-1], ref.topics[topic], cmid, text)
			if err == nil {
				keep(SideReference, ref.idemKey(ref.topics[topic], int64(uid), cmid))
			}
			return err
		},
	}
	rep.Sides = []string{SideHTTP, SideReference}
	if p.Peer != "" {
		rep.Sides = append(rep.Sides, SidePeer)
	}
	for _, side := range rep.Sides[:2] {
		progress("warm-up: %s, %s", side, p.Warmup)
		if _, err := b.loop(ctx, p.Warmup, ops[side]); err != nil {
			return rep, fmt.Errorf("%s: %w", side, err)
		}
	}
	pairs := max(p.Pairs, 1)
	progress("%d rounds of %s, %d clients, %s per side and round", pairs, strings.Join(rep.Sides, " / "), p.Concurrency, p.Round)
	for r := range pairs {
		round := make([]RoundResult, len(rep.Sides))
		// the first side rotates, so that load from elsewhere on a shared
		// machine and any drift within a round fall on every side alike
		for j := range rep.Sides {
			k := (r + j) % len(rep.Sides)
			side := rep.Sides[k]
			var res RoundResult
			var err error
			if side == SidePeer {
				res, err = b.peerRound(ctx)
			} else {
				profile := r == 0 && side == SideHTTP && p.ProfileHTTP != nil
				res, err = b.measure(ctx, side, func(ctx context.Context) (sample, error) {
					if profile {
						if err := pprof.StartCPUProfile(p.ProfileHTTP); err != nil {
							return sample{}, err
						}
						defer pprof.StopCPUProfile()
					}
					return b.loop(ctx, p.Round, ops[side])
				})
			}
			if err != nil {
				return rep, fmt.Errorf("round %d, %s: %w", r+1, side, err)
			}
			round[k] = res
			progress("round %d: %-24s %8.0f/s  p50 %-9s p99 %-9s errors %d", r+1, side, res.Rate,
				res.P50.Round(10*time.Microsecond), res.P99.Round(10*time.Microsecond), res.Errors)
		}
		rep.Rounds = append(rep.Rounds, round)
	}
	for side, keys := range samples {
		if n, err := b.recordBytes(ctx, keys); err == nil {
			rep.RecordBytes[side] = n
		}
	}

	rates := p.Rates
	if len(rates) == 0 {
		peak := rep.Median(SideReference).Rate
		for _, share := range p.RateShares {
			rates = append(rates, share*peak)
		}
	}
	for _, rate := range rates {
		if rate < 1 {
			continue
		}
		var pair []RoundResult
		for _, side := range rep.Sides[:2] {
			progress("open loop: %s at %.0f/s, %s", side, rate, p.Round)
			res, err := b.measure(ctx, side, func(ctx context.Context) (sample, error) {
				return b.openLoop(ctx, p.Round, rate, ops[side])
			})
			if err != nil {
				return rep, fmt.Errorf("open loop %s at %.0f/s: %w", side, rate, err)
			}
			res.Offered = rate
			pair = append(pair, res)
		}
		rep.OpenLoop = append(rep.OpenLoop, pair)
	}
	return rep, nil
}

type sendBench struct {
	p   SendParams
	hc  *http.Client
	run string
	ops atomic.Int64 // numbers every operation: unique client_msg_ids
}

func (b *sendBench) do(ctx context.Context, base, method, path, token string, body []byte, want int) error {
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return &statusError{status: resp.StatusCode, msg: fmt.Sprintf("%s %s: %d %s", method, path, resp.StatusCode, out)}
	}
	return nil
}

// statusError is an answer of another status than the one wanted.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func (b *sendBench) setup(ctx context.Context, topics []string) error {
	svc, err := httpapi.Sign(b.p.Secret, b.p.Tenant, 1<<40, httpapi.RoleService, time.Hour)
	if err != nil {
		return err
	}
	for i, t := range topics {
		body, _ := json.Marshal(map[string]any{"group_id": i + 1, "status": "active"})
		if err := b.do(ctx, b.p.BaseURL, "PUT", "/v1/topics/"+t, svc, body, http.StatusOK); err != nil {
			return err
		}
		for u := 1; u <= benchMembers; u++ {
			if err := b.do(ctx, b.p.BaseURL, "PUT", fmt.Sprintf("/v1/topics/%s/members/%d", t, u), svc, []byte(`{"role":"member"}`), http.StatusOK); err != nil {
				return err
			}
		}
	}
	// one send of every member to every topic: the steady state the rounds
	// measure has the membership cached (a member's first send after a
	// change, or after acl_cache_ttl, reads MySQL once)
	next := atomic.Int64{}
	errs := make(chan error, b.p.Concurrency)
	for range b.p.Concurrency {
		go func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(topics)*benchMembers) || ctx.Err() != nil {
					errs <- ctx.Err()
					return
				}
				tok, err := httpapi.Sign(b.p.Secret, b.p.Tenant, i%benchMembers+1, "", time.Hour)
				if err == nil {
					err = b.post(ctx, b.p.BaseURL, tok, topics[i/benchMembers], b.run+"-prime-"+strconv.FormatInt(i, 10), "prime")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var first error
	for range b.p.Concurrency {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// awaitHorizon sends to topic until the tenant's idempotency horizon stands
// (routing.Keys.IdemSince): from then on a send that finds no record of
// itself is new without asking MySQL, as in any deployment where persist
// runs. Without it every HTTP send of the rounds would ask MySQL, which is
// what a send role does while persist is down — not the path to measure.
func (b *sendBench) awaitHorizon(ctx context.Context, keys routing.Keys, topic string, progress func(string, ...any)) error {
	tok, err := httpapi.Sign(b.p.Secret, b.p.Tenant, 1, "", time.Hour)
	if err != nil {
		return err
	}
	start := time.Now()
	// persist vouches once its progress passes the memory start by the
	// produce timeout; its consumer group joins first
	limit := 3*b.p.ProduceTimeout + 30*time.Second
	for i := 0; ; i++ {
		set, err := b.p.Redis.Do(ctx, b.p.Redis.B().Exists().Key(keys.IdemSince()).Build()).AsInt64()
		if err != nil {
			return err
		}
		if set == 1 {
			progress("idempotency horizon set after %s", time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		if time.Since(start) > limit {
			progress("WARNING: the idempotency horizon did not stand within %s (is persist running and caught up?): every HTTP send asks MySQL for an earlier send", limit)
			return nil
		}
		if err := b.post(ctx, b.p.BaseURL, tok, topic, b.run+"-horizon-"+strconv.Itoa(i), "horizon"); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// cleanup unlinks every Redis key of this run (each carries the run id), so
// a shared Redis does not keep a benchmark's idempotency records and caches
// for a day.
func (b *sendBench) cleanup(ctx context.Context) error {
	keys, err := b.p.KeySpace.Tenant(b.p.Tenant)
	if err != nil {
		return err
	}
	rdb := b.p.Redis
	for _, node := range rdb.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(keys.TenantPattern()).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return err
			}
			var del []string
			for _, k := range e.Elements {
				if strings.Contains(k, b.run) {
					del = append(del, k)
				}
			}
			if len(del) > 0 {
				if err := rdb.Do(ctx, rdb.B().Unlink().Key(del...).Build()).Error(); err != nil {
					return err
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// post sends one message; ids, topics and the text are plain ASCII, so the
// body needs no encoder.
func (b *sendBench) post(ctx context.Context, base, token, topic, clientMsgID, text string) error {
	body := `{"client_msg_id":"` + clientMsgID + `","msg_type":"text","content":{"text":"` + text + `"}}`
	return b.do(ctx, base, "POST", "/v1/topics/"+topic+"/messages", token, []byte(body), http.StatusCreated)
}

// sample is what one or more timed loops measured.
type sample struct {
	lats         []time.Duration
	errs         int64
	elapsed      time.Duration
	firstErr     error
	peakInFlight int64 // open loop only
}

func (s sample) result(name string) (RoundResult, error) {
	if len(s.lats) == 0 {
		return RoundResult{}, fmt.Errorf("bench: %s: nothing succeeded: %v", name, s.firstErr)
	}
	r := RoundResult{Side: name, Sends: int64(len(s.lats)), Errors: s.errs, Elapsed: s.elapsed, FirstErr: s.firstErr,
		Rate: float64(len(s.lats)) / s.elapsed.Seconds(), PeakInFlight: s.peakInFlight}
	slices.Sort(s.lats)
	r.P50, r.P99, r.P999 = quantile(s.lats, 0.5), quantile(s.lats, 0.99), quantile(s.lats, 0.999)
	return r, nil
}

// quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*q))]
}

// measure runs one side's timed run with the process and Redis figures
// around it.
func (b *sendBench) measure(ctx context.Context, side string, fn func(context.Context) (sample, error)) (RoundResult, error) {
	before, err := readRedisStats(ctx, b.p.Redis)
	if err != nil {
		return RoundResult{}, err
	}
	resetPeakRSS()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := processCPU()
	s, err := fn(ctx)
	if err != nil {
		return RoundResult{}, err
	}
	cpu1 := processCPU()
	runtime.ReadMemStats(&m1)
	res, err := s.result(side)
	if err != nil {
		return res, err
	}
	res.PeakRSS = peakRSS()
	res.AllocsPerSend = float64(m1.Mallocs-m0.Mallocs) / float64(res.Sends)
	if cpu0 > 0 {
		res.CPUUS = float64((cpu1 - cpu0).Microseconds()) / float64(res.Sends)
	}
	after, err := readRedisStats(ctx, b.p.Redis)
	if err != nil {
		return res, err
	}
	res.RedisUS, res.RedisCPUUS = after.perSend(before, topLevel[side], res.Sends)
	return res, nil
}

// loop runs op from p.Concurrency goroutines until d has passed (closed
// loop: each client sends its next message when the last one is answered);
// n numbers every operation of the bench uniquely.
func (b *sendBench) loop(ctx context.Context, d time.Duration, op func(ctx context.Context, w int, n int64) error) (sample, error) {
	workers := b.p.Concurrency
	lat := make([][]time.Duration, workers)
	var errs atomic.Int64
	// each worker keeps its own first error: errors of different types
	// never meet in one shared value
	firstErrs := make([]error, workers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				if err := op(ctx, w, b.ops.Add(1)); err != nil {
					errs.Add(1)
					if firstErrs[w] == nil {
						firstErrs[w] = err
					}
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	return collect(ctx, start, lat, &errs, firstErrs)
}

func collect(ctx context.Context, start time.Time, lat [][]time.Duration, errs *atomic.Int64, firstErrs []error) (sample, error) {
	if err := ctx.Err(); err != nil {
		return sample{}, err
	}
	out := sample{errs: errs.Load(), elapsed: time.Since(start)}
	for _, e := range firstErrs {
		if e != nil && out.firstErr == nil {
			out.firstErr = e
		}
	}
	for _, l := range lat {
		out.lats = append(out.lats, l...)
	}
	return out, nil
}

// openLoopWorkers bounds the requests an open-loop run has in flight; an
// arrival that finds them all busy waits, and its wait counts.
const openLoopWorkers = 512

// openLoop sends at a fixed arrival rate for d, whatever the answers take
// (open loop), and measures each latency from the request's scheduled
// time, so that a stall delays every arrival behind it in the figures
// instead of pausing the clock.
func (b *sendBench) openLoop(ctx context.Context, d time.Duration, rate float64, op func(ctx context.Context, w int, n int64) error) (sample, error) {
	total := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	due := make(chan time.Time, total)
	workers := min(openLoopWorkers, max(total, 1))
	lat := make([][]time.Duration, workers)
	firstErrs := make([]error, workers)
	var errs atomic.Int64
	// in flight from its due time (an arrival waiting for a worker counts)
	// to its answer; the peak says how far the queue grew
	var inFlight, peak atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range due {
				if ctx.Err() != nil {
					inFlight.Add(-1)
					continue
				}
				err := op(ctx, w, b.ops.Add(1))
				inFlight.Add(-1)
				if err != nil {
					errs.Add(1)
					if firstErrs[w] == nil {
						firstErrs[w] = err
					}
					continue
				}
				lat[w] = append(lat[w], time.Since(at))
			}
		}()
	}
	for i := range total {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			break
		}
		if n := inFlight.Add(1); n > peak.Load() {
			peak.Store(n) // only this goroutine raises it
		}
		due <- at
	}
	close(due)
	wg.Wait()
	out, err := collect(ctx, start, lat, &errs, firstErrs)
	out.peakInFlight = peak.Load()
	return out, err
}
