package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// StreamTenant is one tenant the stream bench spreads topics over.
type StreamTenant struct {
	ID     string
	Secret []byte
}

// StreamParams shape `imshard bench stream`.
type StreamParams struct {
	BaseURL  string // the API (send and query roles)
	Tenants  []StreamTenant
	Topics   int            // spread over the tenants
	Sockets  int            // spread over the topics, one member each
	Rate     int            // messages per second sent, over all topics
	Duration time.Duration  // of each round
	Rounds   int            // measured rounds, one after the other (at least 1)
	Redis    rueidis.Client // for the raw pub/sub baseline
	KeySpace routing.KeySpace
	Progress io.Writer
	// Hoarders, when positive, adds the hoard phase after the rounds:
	// that many sockets of one member catch up HoardBytes of history
	// without reading, beside another user's catch-up and /readyz (at
	// OpsURL).
	Hoarders   int
	HoardBytes int64
	OpsURL     string
	// Mark, when set, is called at the stages of the run (StageIdleBefore
	// once the members exist and before any socket opens, StageIdleAfter
	// once every socket is open and idle): the server process, apart from
	// this client one, measures its memory there.
	Mark func(stage string) error
}

// The stages Mark is called at.
const (
	StageIdleBefore = "idle-before"
	StageIdleAfter  = "idle-after"
)

// Process is a process's own memory: what `imshard bench stream` reads in
// the server process at its stages.
type Process struct {
	HeapStacks uint64 // live Go heap objects and goroutine stacks, after a GC
	Goroutines int
}

// ReadProcess measures the calling process (after two GCs, so that idle
// goroutine stacks have shrunk back to what they use).
func ReadProcess() Process {
	runtime.GC()
	runtime.GC()
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	rtmetrics.Read(s)
	return Process{HeapStacks: s[0].Value.Uint64() + s[1].Value.Uint64(), Goroutines: runtime.NumGoroutine()}
}

// StreamLatency is one latency distribution.
type StreamLatency struct {
	Name     string
	Count    int
	P50, P99 time.Duration
}

// StreamRound is what one measured round of the bench took.
type StreamRound struct {
	Delivery StreamLatency // send's due time → frame read by the socket's client
	// Arrival is the moment the server took the send in (its created_at)
	// → frame read by the socket's client: Delivery without the client's
	// own wait to send and the request's way to the server
	Arrival StreamLatency
	Send    StreamLatency // send's due time → its 201
	// Published is the send's due time → its publication read by a plain
	// subscriber of the topic's channel: Delivery without the fan-out
	Published StreamLatency
	// FanOut is the stream's own share: a frame's read by a socket's
	// client after the plain subscriber read the same publication (the
	// sampled topics' frames; 0 for a frame read first)
	FanOut  StreamLatency
	PubSub  StreamLatency // raw SPUBLISH's due time → subscriber, same rate and due times, same round
	Sent    int
	Skipped int // due but not sent: every sender was busy (the rate was not reached)
	Errors  int
	Seconds float64 // the sending time, for the rate achieved
}

// Ratios are the round's delivery p99 over the raw pub/sub p99: from the
// send's arrival (the bar's) and from its due time (0 without a raw p99).
func (r StreamRound) Ratios() (fromArrival, fromDue float64) {
	if r.PubSub.P99 <= 0 {
		return 0, 0
	}
	return float64(r.Arrival.P99) / float64(r.PubSub.P99), float64(r.Delivery.P99) / float64(r.PubSub.P99)
}

// StreamReport is what the bench measured.
type StreamReport struct {
	Rounds  []StreamRound
	Warmup  StreamLatency // the first send of each topic, before the measured rounds
	Sockets int
	Hoard   *HoardReport // the hoard phase, when asked for
}

// MedianRatios are the medians over the rounds of their Ratios (0 when no
// round has a raw p99): the figure held against the bar, as the send bench
// takes medians over its rounds.
func (r StreamReport) MedianRatios() (fromArrival, fromDue float64) {
	var a, d []float64
	for _, round := range r.Rounds {
		if x, y := round.Ratios(); x > 0 {
			a, d = append(a, x), append(d, y)
		}
	}
	return median(a), median(d)
}

// progress writes a line of the bench's progress, if it has somewhere to go.
func (p StreamParams) progress(format string, a ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", a...)
	}
}

// Stream opens the sockets, measures the memory they hold idle, then sends
// at the rate for the duration while a raw pub/sub pair runs at the same
// rate, and reports both latency distributions.
func Stream(ctx context.Context, p StreamParams) (StreamReport, error) {
	c := newStreamClient(p.BaseURL)
	tok := c.token
	do := func(method, url, token string, body any) error { return c.do(ctx, method, url, token, body) }
	topic := func(i int) (StreamTenant, string) {
		return p.Tenants[i%len(p.Tenants)], "bst" + strconv.Itoa(i)
	}

	// groups: the sender (user 1) and one member per socket
	p.progress("stream bench: %d topics over %d tenants, %d members", p.Topics, len(p.Tenants), p.Sockets)
	if err := parallel(ctx, 32, p.Topics, func(i int) error {
		t, name := topic(i)
		svc := tok(t, 1, httpapi.RoleService)
		if err := do("PUT", "/v1/topics/"+name, svc, map[string]any{"group_id": strconv.Itoa(i + 1), "name": name, "status": "active"}); err != nil {
			return err
		}
		return do("PUT", "/v1/topics/"+name+"/members/1", svc, map[string]any{"role": "member"})
	}); err != nil {
		return StreamReport{}, err
	}
	if err := parallel(ctx, 32, p.Sockets, func(i int) error {
		t, name := topic(i % p.Topics)
		return do("PUT", "/v1/topics/"+name+"/members/"+strconv.Itoa(1000+i), tok(t, 1, httpapi.RoleService), map[string]any{"role": "member"})
	}); err != nil {
		return StreamReport{}, err
	}

	mark := func(stage string) error {
		if p.Mark == nil {
			return nil
		}
		return p.Mark(stage)
	}
	if err := mark(StageIdleBefore); err != nil {
		return StreamReport{}, err
	}
	var frames atomic.Pointer[frameLatencies] // the round's, swapped between rounds
	frames.Store(&frameLatencies{read: map[int64][]time.Time{}})
	socks := make([]*websocket.Conn, p.Sockets)
	var wg sync.WaitGroup
	defer func() {
		for _, ws := range socks {
			if ws != nil {
				_ = ws.CloseNow()
			}
		}
		wg.Wait()
	}()
	p.progress("stream bench: opening %d sockets", p.Sockets)
	if err := parallel(ctx, 64, p.Sockets, func(i int) error {
		t, name := topic(i % p.Topics)
		ws, _, err := websocket.Dial(ctx, c.ws+"/v1/topics/"+name+"/stream", &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": {"Bearer " + tok(t, int64(1000+i), "")}}})
		if err != nil {
			return err
		}
		socks[i] = ws
		if _, _, err := ws.Read(ctx); err != nil { // the live frame
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); readFrames(ws, &frames) }()
		return nil
	}); err != nil {
		return StreamReport{}, err
	}
	if err := mark(StageIdleAfter); err != nil {
		return StreamReport{}, err
	}
	rep := StreamReport{Sockets: p.Sockets}

	// warm-up: one send per topic, unmeasured by the sockets (its text is
	// no timestamp), from as many senders as the measured time uses, as
	// the send bench warms up before its rounds. A topic's first send is
	// the slow path (the sender's membership, the seq counter's seed and
	// the dedup lookup read from MySQL): 500 of them in the
	// first half second would be the p99 of a 15,000-message run, a cost
	// per topic and process start, not per message; and the senders' HTTP
	// connections are opened here, not in the first measured second.
	// Reported apart.
	p.progress("stream bench: warm-up, one send per topic")
	var warm latencies
	if err := parallel(ctx, streamSenders, p.Topics, func(i int) error {
		t, name := topic(i)
		at := time.Now()
		err := do("POST", "/v1/topics/"+name+"/messages", tok(t, 1, ""), map[string]any{
			"client_msg_id": "warm" + strconv.Itoa(i), "msg_type": "text", "content": map[string]any{"text": "warm-up"}})
		warm.add(time.Since(at))
		return err
	}); err != nil {
		return StreamReport{}, err
	}
	rep.Warmup = warm.report("first send per topic (warm-up, unmeasured)")
	time.Sleep(time.Second) // the warm-up frames delivered

	senders := map[string]string{}
	for _, t := range p.Tenants {
		senders[t.ID] = tok(t, 1, "")
	}
	for r := range max(p.Rounds, 1) {
		round, err := streamRound(ctx, p, &frames, topic, do, senders)
		if err != nil {
			return rep, err
		}
		p.progress("stream bench: round %d of %d done", r+1, max(p.Rounds, 1))
		rep.Rounds = append(rep.Rounds, round)
	}
	if p.Hoarders > 0 {
		h, err := hoard(ctx, p, c, mark)
		rep.Hoard = &h
		if err != nil {
			return rep, err
		}
	}
	return rep, ctx.Err()
}

// streamRound is one measured round: a raw pub/sub pair beside the sends.
func streamRound(ctx context.Context, p StreamParams, frames *atomic.Pointer[frameLatencies], topic func(int) (StreamTenant, string), do func(method, url, token string, body any) error, senders map[string]string) (StreamRound, error) {
	// raw pub/sub beside it
	var raw latencies
	var subs []func()
	stopSubs := func() {
		for _, stop := range subs {
			stop()
		}
	}
	defer stopSubs()
	rawChannel, err := p.KeySpace.BenchChannel()
	if err != nil {
		return StreamRound{}, err
	}
	stop, err := subscribe(ctx, p.Redis, rawChannel, func(m string) {
		if ns, err := strconv.ParseInt(m, 10, 64); err == nil {
			raw.add(time.Since(time.Unix(0, ns)))
		}
	})
	if err != nil {
		return StreamRound{}, err
	}
	subs = append(subs, stop)
	// the same messages as the sockets', seen by a plain subscriber of
	// their topics' channels (a sample of topics): the send up to its
	// publication, which delivery includes, apart from the fan-out
	var published latencies
	pubRead := map[int64]time.Time{} // due time → the plain subscriber's read of it
	var pubMu sync.Mutex
	for i := range min(p.Topics, publishedSample) {
		t, name := topic(i)
		keys, err := p.KeySpace.Tenant(t.ID)
		if err != nil {
			return StreamRound{}, err
		}
		stop, err := subscribe(ctx, p.Redis, keys.Realtime(name), func(m string) {
			at := time.Now()
			if due, d, _, ok := frameAges([]byte(m), at); ok {
				published.add(d)
				pubMu.Lock()
				pubRead[due] = at
				pubMu.Unlock()
			}
		})
		if err != nil {
			return StreamRound{}, err
		}
		subs = append(subs, stop)
	}

	p.progress("stream bench: sending %d/s for %s", p.Rate, p.Duration)
	fl := &frameLatencies{read: map[int64][]time.Time{}}
	frames.Store(fl)
	var sent, errs, skipped atomic.Int64
	var sendLat latencies
	jobs := make(chan streamJob, p.Rate)
	var swg sync.WaitGroup
	for range streamSenders {
		swg.Add(1)
		go func() {
			defer swg.Done()
			for j := range jobs {
				t, name := topic(j.n % p.Topics)
				due := strconv.FormatInt(j.due.UnixNano(), 10)
				if err := do("POST", "/v1/topics/"+name+"/messages", senders[t.ID], map[string]any{
					"client_msg_id": "b" + due, "msg_type": "text", "content": map[string]any{"text": due}}); err != nil {
					errs.Add(1)
					continue
				}
				sendLat.add(time.Since(j.due))
				sent.Add(1)
			}
		}()
	}
	// open loop, evenly spaced: message n is due at began + n/rate (not a
	// burst of them per tick) and every latency runs from its due time, so
	// a dispatcher or sender running late counts against the figures,
	// never for them. The raw pair's publication of the same due time
	// leaves at the same moment as the send, from its own goroutine.
	var pubs sync.WaitGroup
	began := time.Now()
	for n := 0; ; n++ {
		due := began.Add(time.Duration(int64(n) * int64(time.Second) / int64(p.Rate)))
		if due.Sub(began) >= p.Duration || !sleepUntil(ctx, due) {
			break
		}
		select {
		case jobs <- streamJob{n: n, due: due}:
		default:
			skipped.Add(1) // the senders cannot keep up
		}
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			_ = p.Redis.Do(ctx, p.Redis.B().Spublish().Channel(rawChannel).Message(strconv.FormatInt(due.UnixNano(), 10)).Build())
		}()
	}
	close(jobs)
	swg.Wait()
	pubs.Wait()
	rep := StreamRound{Seconds: time.Since(began).Seconds()}
	time.Sleep(time.Second) // the last frames in flight
	stopSubs()
	subs = nil
	fl.mu.Lock()
	defer fl.mu.Unlock()
	rep.Delivery = fl.delivery.report("delivery (send due → frame)")
	rep.Arrival = fl.arrival.report("delivery (send arrival → frame)")
	rep.Published = published.report(fmt.Sprintf("send → publication (%d topics)", min(p.Topics, publishedSample)))
	pubMu.Lock()
	defer pubMu.Unlock()
	rep.FanOut = fanOut(pubRead, fl.read).report(fmt.Sprintf("publication → frame (%d topics)", min(p.Topics, publishedSample)))
	rep.Send = sendLat.report("send (due → 201)")
	rep.PubSub = raw.report("raw SPUBLISH (due) → subscriber")
	rep.Sent, rep.Skipped, rep.Errors = int(sent.Load()), int(skipped.Load()), int(errs.Load())
	return rep, ctx.Err()
}

// streamJob is one message of the measured time: its number and the time
// it is due.
type streamJob struct {
	n   int
	due time.Time
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// frameLatencies are the frames' ages of one round, and when each was
// read, by its due time (one lock per frame: the clients share the
// machine with the server).
type frameLatencies struct {
	mu       sync.Mutex
	delivery latencies // from the send's due time
	arrival  latencies // from the moment the server took the send in
	read     map[int64][]time.Time
}

func (fl *frameLatencies) add(due int64, at time.Time, sinceDue, sinceArrival time.Duration) {
	fl.mu.Lock()
	fl.delivery.d = append(fl.delivery.d, sinceDue)
	fl.arrival.d = append(fl.arrival.d, sinceArrival)
	fl.read[due] = append(fl.read[due], at)
	fl.mu.Unlock()
}

// fanOut is each frame's read after the plain subscriber's read of the
// same publication (0 for a frame read first), for the publications the
// subscriber read: the time the stream adds to a message, apart from the
// send's.
func fanOut(published map[int64]time.Time, read map[int64][]time.Time) *latencies {
	l := &latencies{}
	for due, pub := range published {
		for _, at := range read[due] {
			l.d = append(l.d, max(at.Sub(pub), 0))
		}
	}
	return l
}

// readFrames reads a bench socket until it closes, timing each message
// frame from the due time its text carries and from the moment the server
// took the send in, its created_at, into the current round's frames.
func readFrames(ws *websocket.Conn, frames *atomic.Pointer[frameLatencies]) {
	for {
		_, b, err := ws.Read(context.Background())
		if err != nil {
			return
		}
		at := time.Now()
		if due, d, a, ok := frameAges(b, at); ok {
			frames.Load().add(due, at, d, a)
		}
	}
}

// frameAges is the due time of the message frame (or realtime payload) b
// — its text is the send's due time in Unix nanoseconds —, how long before
// at it was due to be sent, and how long before at the server took the send in: its
// created_at, which the send sets once the request is decoded, kept to the
// millisecond by truncation, so that age is never shorter than the real
// one. It only looks for the two values, not parsing the frame: the clients
// share the machine with the server, and their CPU would show in the
// latency.
func frameAges(b []byte, at time.Time) (due int64, sinceDue, sinceArrival time.Duration, ok bool) {
	if !bytes.HasPrefix(b, []byte(`{"type":"message"`)) {
		return 0, 0, 0, false
	}
	text, ok := quotedAfter(b, `"text":"`)
	if !ok {
		return 0, 0, 0, false
	}
	ns, err := strconv.ParseInt(string(text), 10, 64)
	if err != nil {
		return 0, 0, 0, false
	}
	created, ok := quotedAfter(b, `"created_at":"`)
	if !ok {
		return 0, 0, 0, false
	}
	took, err := time.Parse(message.TimeFormat, string(created))
	if err != nil {
		return 0, 0, 0, false
	}
	return ns, at.Sub(time.Unix(0, ns)), at.Sub(took), true
}

// quotedAfter is the text between key (ending in an opening quote) and the
// next quote in b.
func quotedAfter(b []byte, key string) ([]byte, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return nil, false
	}
	b = b[i+len(key):]
	j := bytes.IndexByte(b, '"')
	if j <= 0 {
		return nil, false
	}
	return b[:j], true
}

// streamSenders is how many requests the stream bench sends at once.
const streamSenders = 128

// publishedSample is how many topics a plain subscriber follows beside
// the sockets.
const publishedSample = 50

// subscribe runs an SSUBSCRIBE of channel until stop, once Redis
// confirmed it.
func subscribe(ctx context.Context, rdb rueidis.Client, channel string, fn func(string)) (stop func(), err error) {
	sctx, cancel := context.WithCancel(ctx)
	subscribed := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rdb.Receive(rueidis.WithOnSubscriptionHook(sctx, func(rueidis.PubSubSubscription) { once.Do(func() { close(subscribed) }) }),
			rdb.B().Ssubscribe().Channel(channel).Build(), func(m rueidis.PubSubMessage) { fn(m.Message) })
	}()
	stop = func() { cancel(); <-done }
	select {
	case <-subscribed:
		return stop, nil
	case <-done:
		stop()
		return nil, fmt.Errorf("bench: ssubscribe %s ended", channel)
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(name string) StreamLatency {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.d)
	r := StreamLatency{Name: name, Count: len(l.d)}
	if len(l.d) > 0 {
		r.P50, r.P99 = l.d[len(l.d)/2], l.d[len(l.d)*99/100]
	}
	return r
}

// parallel runs fn(0..n-1) on workers goroutines; the first error wins.
func parallel(ctx context.Context, workers, n int, fn func(int) error) error {
	var next atomic.Int64
	var first error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
