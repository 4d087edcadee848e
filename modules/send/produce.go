package send

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/imshard/imshard/modules/testhook"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ProducerOpts are the franz-go settings of the send path on top of the
// connection (brokers, TLS, SASL); `imshard bench send` produces its raw
// baseline with exactly these.
func ProducerOpts(conn []kgo.Opt, topic string, timeout time.Duration) []kgo.Opt {
	return append(slices.Clone(conn),
		kgo.DefaultProduceTopic(topic),
		// acks=all with the idempotent producer (franz-go's default once
		// acks=all): a broker retry never writes an event twice
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// every send waits for its ack, so lingering only adds latency;
		// records still batch while a request is in flight
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(timeout),
		kgo.ProduceRequestTimeout(timeout),
	)
}

// produceGrace lets the client fail a record at its deadline before the
// handler gives up on the promise (at most a quarter of the produce
// timeout, see ackDeadlines).
const produceGrace = 250 * time.Millisecond

// ackDeadlines are a produce's two deadlines: the client fails the record
// at the first, the handler stops waiting at the second. Both count from
// origin, taken before the Redis call that stamped the seq's pending entry
// with its Redis time (the allocation, or a retry's refresh), so at or
// before that stamp; and both end strictly inside send.produce_timeout,
// after which readers may record the seq as a gap (routing.Flight.Settled).
// A send that is answered 503 at its deadline thus leaves its seq pending,
// and a retry re-produces it under the same seq. (Whether an ack counts is
// still decided in Redis by the call after it, lua/fenced.lua sent: an ack
// can come after the record's deadline.)
func ackDeadlines(origin time.Time, timeout time.Duration) (record, handler time.Time) {
	grace := min(produceGrace, timeout/4)
	return origin.Add(timeout - 2*grace), origin.Add(timeout - grace)
}

// producer produces events asynchronously; each call gets its own promise,
// so concurrent sends never wait on each other, only on their own ack.
type producer struct {
	cl *kgo.Client
}

func newProducer(conn []kgo.Opt, topic string, timeout time.Duration) (*producer, error) {
	cl, err := kgo.NewClient(ProducerOpts(conn, topic, timeout)...)
	if err != nil {
		return nil, fmt.Errorf("send: kafka producer: %w", err)
	}
	return &producer{cl: cl}, nil
}

// produce hands the record to the client and returns its promise: one error
// (nil = acked by all in-sync replicas). The record's own deadline is
// deadline (ackDeadlines), not the request's context: a client hanging up
// does not withdraw a record the broker may already hold.
func (p *producer) produce(key, value []byte, deadline time.Time) <-chan error {
	done := make(chan error, 1)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	p.cl.Produce(ctx, &kgo.Record{Key: key, Value: value}, func(_ *kgo.Record, err error) {
		cancel()
		testhook.Ack(func() { done <- err })
	})
	return done
}

// close flushes what is buffered (within ctx), then fails the rest.
func (p *producer) close(ctx context.Context) {
	_ = p.cl.Flush(ctx)
	p.cl.Close()
}
