package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// SendParams drive `imshard bench send`: HTTP sends against a running API,
// and beside them the raw limit of the same work on the same services.
type SendParams struct {
	Concurrency int
	Duration    time.Duration
	Warmup      time.Duration
	Topics      int
	Rounds      int // HTTP and raw alternate in this many slices of Duration

	BaseURL string // the API
	Tenant  string
	Secret  []byte

	// the services the API uses, for the raw baseline
	Redis     rueidis.Client
	Allocator *routing.Allocator
	Flight    *routing.Flight
	Scripts   *routing.Scripts
	Producer  []kgo.Opt // the send role's producer options (send.ProducerOpts)
	Send      config.Send
	HotCache  config.HotCache

	Progress io.Writer // one line per phase
}

// SendResult is one measured run.
type SendResult struct {
	Name     string
	Count    int64
	Errors   int64
	Elapsed  time.Duration
	P50, P99 time.Duration
}

// Rate is completed operations per second.
func (r SendResult) Rate() float64 { return float64(r.Count) / r.Elapsed.Seconds() }

// SendReport is the whole comparison.
type SendReport struct {
	HTTP, Raw, Alloc SendResult
}

// Ratio is the HTTP rate over the raw pipeline's (the bar is 0.5).
func (r SendReport) Ratio() float64 { return r.HTTP.Rate() / r.Raw.Rate() }

// benchMembers is how many users each benchmark topic has; client k sends
// as user k mod benchMembers.
const benchMembers = 16

// Send prepares the groups, then runs the raw allocation, the raw pipeline
// and the HTTP sends, each for p.Duration after p.Warmup.
func Send(ctx context.Context, p SendParams) (SendReport, error) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	httpTopics, rawTopics, allocTopics := make([]string, p.Topics), make([]string, p.Topics), make([]string, p.Topics)
	for i := range p.Topics {
		httpTopics[i] = fmt.Sprintf("bench-%s-%d", run, i)
		rawTopics[i] = fmt.Sprintf("raw-%s-%d", run, i)
		allocTopics[i] = fmt.Sprintf("alloc-%s-%d", run, i)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: p.Concurrency * 2, MaxIdleConnsPerHost: p.Concurrency * 2}}
	b := &sendBench{p: p, hc: hc, run: run}
	progress := func(format string, args ...any) {
		if p.Progress != nil {
			fmt.Fprintf(p.Progress, format+"\n", args...)
		}
	}
	progress("preparing %d groups of %d members", p.Topics, benchMembers)
	if err := b.setup(ctx, httpTopics); err != nil {
		return SendReport{}, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := b.cleanup(ctx); err != nil {
			progress("cleanup of the run's Redis keys failed: %v", err)
		}
	}()
	var rep SendReport
	var err error
	progress("raw allocation FCALL, %d clients, %s", p.Concurrency, p.Duration)
	alloc := func(ctx context.Context, w int, n int64) error {
		_, err := p.Allocator.Allocate(ctx, p.Tenant, allocTopics[n%int64(len(allocTopics))])
		return err
	}
	if _, err := b.loop(ctx, p.Warmup, alloc); err != nil {
		return rep, err
	}
	s, err := b.loop(ctx, p.Duration, alloc)
	if err != nil {
		return rep, err
	}
	if rep.Alloc, err = s.result("raw allocation (FCALL)"); err != nil {
		return rep, err
	}

	raw, err := newRawPipeline(p)
	if err != nil {
		return rep, err
	}
	defer raw.close()
	tokens := make([]string, benchMembers)
	for u := range tokens {
		if tokens[u], err = httpapi.Sign(p.Secret, p.Tenant, int64(u+1), "", 24*time.Hour); err != nil {
			return rep, err
		}
	}
	runs := [2]struct {
		name string
		op   func(ctx context.Context, w int, n int64) error
		s    sample
	}{
		{name: "raw pipeline (Redis + Kafka)", op: func(ctx context.Context, w int, n int64) error {
			return raw.send(ctx, rawTopics[n%int64(len(rawTopics))], int64(w%benchMembers+1), b.run+"-"+strconv.FormatInt(n, 10))
		}},
		{name: "HTTP send (end to end)", op: func(ctx context.Context, w int, n int64) error {
			return b.post(ctx, tokens[w%benchMembers], httpTopics[n%int64(len(httpTopics))], b.run+"-"+strconv.FormatInt(n, 10))
		}},
	}
	rounds := max(p.Rounds, 1)
	progress("raw pipeline and HTTP sends alternating in %d rounds, %d clients, %s each", rounds, p.Concurrency, p.Duration)
	for i := range runs {
		if _, err := b.loop(ctx, p.Warmup, runs[i].op); err != nil {
			return rep, fmt.Errorf("%s: %w", runs[i].name, err)
		}
	}
	// alternating slices, starting with each side in turn, so that load
	// from elsewhere on a shared machine falls on both alike
	for r := range rounds {
		for j := range runs {
			k := (r + j) % len(runs)
			s, err := b.loop(ctx, p.Duration/time.Duration(rounds), runs[k].op)
			if err != nil {
				return rep, fmt.Errorf("%s: %w", runs[k].name, err)
			}
			runs[k].s.add(s)
		}
	}
	if rep.Raw, err = runs[0].s.result(runs[0].name); err != nil {
		return rep, err
	}
	rep.HTTP, err = runs[1].s.result(runs[1].name)
	return rep, err
}

type sendBench struct {
	p   SendParams
	hc  *http.Client
	run string
	ops atomic.Int64 // numbers every operation: unique client_msg_ids
}

func (b *sendBench) do(ctx context.Context, method, path, token string, body any, want int) error {
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, b.p.BaseURL+path, bytes.NewReader(raw))
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
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, out)
	}
	return nil
}

func (b *sendBench) setup(ctx context.Context, topics []string) error {
	svc, err := httpapi.Sign(b.p.Secret, b.p.Tenant, 1<<40, httpapi.RoleService, time.Hour)
	if err != nil {
		return err
	}
	for i, t := range topics {
		if err := b.do(ctx, "PUT", "/v1/topics/"+t, svc, map[string]any{"group_id": i + 1, "status": "active"}, http.StatusOK); err != nil {
			return err
		}
		for u := 1; u <= benchMembers; u++ {
			if err := b.do(ctx, "PUT", fmt.Sprintf("/v1/topics/%s/members/%d", t, u), svc, map[string]any{"role": "member"}, http.StatusOK); err != nil {
				return err
			}
		}
	}
	return nil
}

// cleanup unlinks every Redis key of this run (each carries a topic with
// the run id), so a shared Redis does not keep a benchmark's idempotency
// records and caches for a day.
func (b *sendBench) cleanup(ctx context.Context) error {
	keys, err := routing.KeysFor(b.p.Tenant)
	if err != nil {
		return err
	}
	rdb := b.p.Redis
	var cursor uint64
	for {
		e, err := rdb.Do(ctx, rdb.B().Scan().Cursor(cursor).Match(keys.TenantPattern()).Count(1000).Build()).AsScanEntry()
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
			return nil
		}
	}
}

func (b *sendBench) post(ctx context.Context, token, topic, clientMsgID string) error {
	// ids and topics are plain ASCII: the body needs no encoder
	body := `{"client_msg_id":"` + clientMsgID + `","msg_type":"text","content":{"text":"bench message ` + clientMsgID + `"}}`
	return b.do(ctx, "POST", "/v1/topics/"+topic+"/messages", token, []byte(body), http.StatusCreated)
}

// sample is what one or more timed loops measured.
type sample struct {
	lats     []time.Duration
	errs     int64
	elapsed  time.Duration
	firstErr error
}

func (s *sample) add(o sample) {
	s.lats = append(s.lats, o.lats...)
	s.errs += o.errs
	s.elapsed += o.elapsed
	if s.firstErr == nil {
		s.firstErr = o.firstErr
	}
}

func (s sample) result(name string) (SendResult, error) {
	if len(s.lats) == 0 {
		return SendResult{}, fmt.Errorf("bench: %s: nothing succeeded: %v", name, s.firstErr)
	}
	r := SendResult{Name: name, Count: int64(len(s.lats)), Errors: s.errs, Elapsed: s.elapsed}
	r.P50, r.P99 = percentiles(s.lats)
	return r, nil
}

// loop runs op from p.Concurrency goroutines until d has passed; n numbers
// every operation of the bench uniquely.
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

// rawPipeline issues, per message, the Redis commands and the Kafka produce
// of a send, with the same settings, directly: no HTTP, no JSON request, no
// JWT, no ACL decision — the limit the HTTP path is measured against.
type rawPipeline struct {
	p     SendParams
	keys  routing.Keys
	cl    *kgo.Client
	ttl   string
	stale string
}

func newRawPipeline(p SendParams) (*rawPipeline, error) {
	keys, err := routing.KeysFor(p.Tenant)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(p.Producer...)
	if err != nil {
		return nil, err
	}
	return &rawPipeline{p: p, keys: keys, cl: cl,
		ttl: strconv.FormatInt(p.Send.IdempotencyTTL.Milliseconds(), 10), stale: strconv.FormatInt(p.Send.ProduceTimeout.Milliseconds(), 10)}, nil
}

func (r *rawPipeline) close() { r.cl.Close() }

func (r *rawPipeline) send(ctx context.Context, topic string, uid int64, clientMsgID string) error {
	rdb, sc, k := r.p.Redis, r.p.Scripts, r.keys
	// ACL cache read
	for _, res := range rdb.DoMulti(ctx, rdb.B().Get().Key(k.Group(topic)).Build(),
		rdb.B().Hget().Key(k.Members(topic)).Field(strconv.FormatInt(uid, 10)).Build()) {
		if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return err
		}
	}
	// idempotency claim
	idem := k.Idempotency(topic, uid, clientMsgID)
	if err := sc.Fenced.IdemClaim(ctx, rdb, []string{idem, k.IdemSince()}, []string{"raw", r.ttl, r.stale}).Error(); err != nil {
		return err
	}
	// allocation
	al, err := r.p.Allocator.Allocate(ctx, r.p.Tenant, topic)
	if err != nil {
		return err
	}
	ev := &message.Event{V: message.EventVersion, EventID: clientMsgID, Tenant: r.p.Tenant, Topic: topic, GroupID: 1,
		SeqID: al.Seq, ShardMonth: al.Month.String(), MessageID: message.ID(al.Seq), FromUser: message.ID(uid),
		ClientMsgID: clientMsgID, MsgType: "text", Content: json.RawMessage(`{"text":"bench message ` + clientMsgID + `"}`),
		CreatedAt: message.NewTime(time.Now())}
	raw, _ := json.Marshal(ev)
	// the event stored in the idempotency record
	if err := sc.IdemEvent.Exec(ctx, rdb, []string{idem}, []string{"raw", string(raw), r.ttl}).Error(); err != nil {
		return err
	}
	// produce, wait for the ack
	done := make(chan error, 1)
	r.cl.Produce(ctx, &kgo.Record{Key: ev.Key(), Value: raw}, func(_ *kgo.Record, err error) { done <- err })
	if err := <-done; err != nil {
		return err
	}
	// after the ack: pending ack, idempotency ack, hot cache, publish
	var wg sync.WaitGroup
	var ackErr, idemErr error
	wg.Add(2)
	go func() { defer wg.Done(); ackErr = r.p.Flight.MarkAcked(ctx, r.p.Tenant, topic, al.Seq) }()
	go func() {
		defer wg.Done()
		idemErr = sc.IdemAck.Exec(ctx, rdb, []string{idem}, []string{"acked", string(raw), string(raw), r.ttl}).Error()
	}()
	msg, _ := json.Marshal(message.FromEvent(ev))
	hot := k.HotMessages(topic)
	for _, res := range rdb.DoMulti(ctx,
		rdb.B().Zadd().Key(hot).ScoreMember().ScoreMember(float64(al.Seq), string(msg)).Build(),
		rdb.B().Pexpire().Key(hot).Milliseconds(r.p.HotCache.TTL.Milliseconds()).Build(),
		rdb.B().Zremrangebyrank().Key(hot).Start(0).Stop(int64(-r.p.HotCache.MaxPerTopic-1)).Build(),
		rdb.B().Spublish().Channel(k.Realtime(topic)).Message(string(msg)).Build()) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	wg.Wait()
	if ackErr != nil {
		return ackErr
	}
	return idemErr
}
