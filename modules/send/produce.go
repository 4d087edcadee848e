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

// producer produces events asynchronously; each call gets its own promise,
// so concurrent sends never wait on each other, only on their own ack.
type producer struct {
	cl      *kgo.Client
	timeout time.Duration
}

func newProducer(conn []kgo.Opt, topic string, timeout time.Duration) (*producer, error) {
	cl, err := kgo.NewClient(ProducerOpts(conn, topic, timeout)...)
	if err != nil {
		return nil, fmt.Errorf("send: kafka producer: %w", err)
	}
	return &producer{cl: cl, timeout: timeout}, nil
}

// produce hands the record to the client and returns its promise: one error
// (nil = acked by all in-sync replicas). The record's own deadline is the
// produce timeout, not the request's context: a client hanging up does not
// withdraw a record the broker may already hold.
func (p *producer) produce(key, value []byte) <-chan error {
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
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
