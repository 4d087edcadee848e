package persist

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
)

// A process whose start fails after persist was built stops it without
// ever running it: Stop must return at once and leave nothing behind.
func TestStopWithoutRunReturns(t *testing.T) {
	s, err := New(Params{
		Config:     config.Default().Persist,
		Kafka:      config.Default().Kafka,
		KafkaConn:  []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")},
		Metrics:    routing.NewMetrics(prometheus.NewRegistry()),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Stop(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop without Run hangs")
	}
}

// A caller that builds its own persist config without max_parked (the
// benchmark) gets the default budget, not a zero one that never polls.
func TestUnsetParkedBudgetIsTheDefault(t *testing.T) {
	s, err := New(Params{
		Config:     config.Persist{BatchSize: 10},
		Kafka:      config.Default().Kafka,
		KafkaConn:  []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")},
		Metrics:    routing.NewMetrics(prometheus.NewRegistry()),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stop(context.Background()) }()
	if s.maxParked != config.Default().Persist.MaxParked || s.maxParked <= 0 {
		t.Fatalf("max parked %d", s.maxParked)
	}
}
