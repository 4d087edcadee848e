package app

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/imshard/imshard/config"
)

// TestInProcessKafkaRefusesAnOutsideProducer starts the Kafka of a single
// process (kafka.brokers empty, as `imshard all` does) and has a client of
// another process, which knows the loopback address but not the secret drawn
// at the start, produce a forged event into the messages topic: the broker
// refuses it and stores nothing, while the service's own clients produce.
func TestInProcessKafkaRefusesAnOutsideProducer(t *testing.T) {
	cfg := config.Default()
	cfg.Kafka.DataDir = t.TempDir()
	a := New(&cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := initKafka(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop(context.Background()) })

	own := kafkaClient(t, a.clients.kafka...)
	if err := own.ProduceSync(ctx, &kgo.Record{Topic: cfg.Kafka.Topic, Value: []byte("own")}).FirstErr(); err != nil {
		t.Fatalf("the service's own produce: %v", err)
	}
	brokers := own.OptValue(kgo.SeedBrokers).([]string)

	for name, opts := range map[string][]kgo.Opt{
		"no credentials":    nil,
		"guessed password":  {kgo.SASL(scram.Auth{User: privateKafkaUser, Pass: "imshard"}.AsSha256Mechanism())},
		"kfake's superuser": {kgo.SASL(scram.Auth{User: "admin", Pass: "admin"}.AsSha256Mechanism())},
	} {
		t.Run(name, func(t *testing.T) {
			outsider := kafkaClient(t, append(opts, kgo.SeedBrokers(brokers...), kgo.RecordRetries(1), kgo.RequestRetries(1))...)
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			defer pcancel()
			forged := &kgo.Record{Topic: cfg.Kafka.Topic, Value: []byte(`{"tenant":"t1","sender":"someone-else"}`)}
			if err := outsider.ProduceSync(pctx, forged).FirstErr(); err == nil {
				t.Fatal("a client without the start's secret produced into the in-process Kafka")
			}
		})
	}

	if n := topicRecords(t, ctx, cfg.Kafka.Topic, a.clients.kafka); n != 1 {
		t.Fatalf("messages topic holds %d records, want only the service's own one", n)
	}
}

// TestInProcessKafkaRestartsOnItsLog restarts the in-process Kafka on the log
// of a previous start: the credentials kfake kept there are not those of the
// new start, which must still be the ones its clients authenticate with.
func TestInProcessKafkaRestartsOnItsLog(t *testing.T) {
	k := config.Default().Kafka
	k.DataDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, v := range []string{"first", "second"} {
		cluster, conn, err := StartPrivateKafka(k)
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		opts, err := KafkaOpts(conn)
		if err != nil {
			t.Fatal(err)
		}
		cl := kafkaClient(t, append(opts, kgo.RecordRetries(2))...)
		err = cl.ProduceSync(ctx, &kgo.Record{Topic: k.Topic, Value: []byte(v)}).FirstErr()
		cl.Close()
		cluster.Close()
		if err != nil {
			t.Fatalf("start %d: the process's own produce: %v", i, err)
		}
	}
}

// TestDevKafkaWithSASLAcceptsOnlyItsUser runs devkafka with kafka.sasl set:
// a client configured with the same kafka.sasl produces, one without is
// refused.
func TestDevKafkaWithSASLAcceptsOnlyItsUser(t *testing.T) {
	k := config.Default().Kafka
	k.DataDir = t.TempDir()
	k.SASL = config.SASL{Mechanism: config.SASLScramSHA512, Username: "dev", Password: "dev-secret"}
	d, err := StartDevKafka(k, "127.0.0.1:0", zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	k.Brokers = d.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	opts, err := KafkaOpts(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := kafkaClient(t, opts...).ProduceSync(ctx, &kgo.Record{Topic: k.Topic, Value: []byte("configured")}).FirstErr(); err != nil {
		t.Fatalf("a client with the configured kafka.sasl: %v", err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	outsider := kafkaClient(t, kgo.SeedBrokers(k.Brokers...), kgo.RecordRetries(1), kgo.RequestRetries(1))
	if err := outsider.ProduceSync(pctx, &kgo.Record{Topic: k.Topic, Value: []byte("forged")}).FirstErr(); err == nil {
		t.Fatal("a client without credentials produced into devkafka with kafka.sasl set")
	}
	if n := topicRecords(t, ctx, k.Topic, opts); n != 1 {
		t.Fatalf("topic holds %d records, want only the configured client's one", n)
	}
}

func kafkaClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// topicRecords counts the records topic holds, over all its partitions.
func topicRecords(t *testing.T, ctx context.Context, topic string, conn []kgo.Opt) int64 {
	t.Helper()
	ends, err := kadm.NewClient(kafkaClient(t, conn...)).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}
