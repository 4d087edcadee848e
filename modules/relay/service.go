// Package relay is the change feed's relay role: it produces the outbox
// rows of every tenant (modules/feed) to kafka.changes_topic and deletes
// each row once the broker acknowledged its event — at least once, in
// change_seq order per topic.
//
// It is a role of its own rather than a part of persist or the shard
// manager: it needs only the tenant databases and Kafka, its load follows
// the rate of changes rather than of sends, and a relay killed or stopped
// leaves sends, persist and the month tables untouched (changes keep
// committing; their events wait in the outbox and the lag alert fires).
// Any number of relays may run: per tenant one at a time relays, under a
// MySQL lock held by its session (feed.Lock), the others pass the tenant
// over until the lock is free.
package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
)

// Config is the relay section of the configuration.
type Config struct {
	// BatchSize is how many outbox rows one produce carries.
	BatchSize int
	// PollInterval is the pause between two passes over the tenants.
	PollInterval time.Duration
	// Workers is how many tenants are relayed at once.
	Workers int
	// ProduceTimeout bounds one batch's produce; its rows stay and are
	// produced again on the next pass.
	ProduceTimeout time.Duration
}

// Params wires a Service.
type Params struct {
	Config Config
	// Topic is kafka.changes_topic.
	Topic     string
	KafkaConn []kgo.Opt
	Tenants   func() []string
	DBs       routing.DBs
	Log       zerolog.Logger
	// Registerer receives the lag, relayed and failure metrics.
	Registerer prometheus.Registerer
}

// Service relays the outboxes of the configured tenants.
type Service struct {
	p  Params
	cl *kgo.Client
	m  *metrics
}

// New builds the relay and its producer.
func New(p Params) (*Service, error) {
	cl, err := kgo.NewClient(append(slices.Clone(p.KafkaConn),
		kgo.DefaultProduceTopic(p.Topic),
		// acks=all with the idempotent producer: a broker retry never
		// reorders or repeats a topic's events; a record that fails fails
		// every record after it in its partition, so no later change of a
		// topic is acknowledged past an earlier one that was not
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(p.Config.ProduceTimeout),
		kgo.ProduceRequestTimeout(p.Config.ProduceTimeout),
	)...)
	if err != nil {
		return nil, fmt.Errorf("relay: kafka producer: %w", err)
	}
	return &Service{p: p, cl: cl, m: newMetrics(p.Registerer)}, nil
}

// Run relays every tenant each poll interval until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.p.Config.PollInterval)
	defer t.Stop()
	for {
		s.pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Stop closes the producer.
func (s *Service) Stop(context.Context) error {
	s.cl.Close()
	return nil
}

// pass relays each tenant's outbox once, Workers tenants at a time.
func (s *Service) pass(ctx context.Context) {
	var g errgroup.Group
	g.SetLimit(max(s.p.Config.Workers, 1))
	for _, tenant := range s.p.Tenants() {
		g.Go(func() error {
			drained, err := s.Relay(ctx, tenant)
			if err != nil && ctx.Err() == nil {
				s.p.Log.Warn().Err(err).Str("tenant", tenant).Msg("relay: pass failed; the change events stay in the outbox and are relayed next pass")
			}
			if drained {
				s.m.lag.WithLabelValues(tenant).Set(0)
			} else {
				s.measure(ctx, tenant)
			}
			return nil
		})
	}
	_ = g.Wait()
}

// Relay produces tenant's outbox until it is empty (or a step fails),
// unless another relay holds the tenant; drained reports that this call
// emptied it (the tenant's lag is then 0 without asking MySQL again).
func (s *Service) Relay(ctx context.Context, tenant string) (drained bool, err error) {
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		s.fail(ctx, tenant, stepRead)
		return false, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		s.fail(ctx, tenant, stepRead)
		return false, fmt.Errorf("relay: %w", err)
	}
	defer conn.Close()
	held, err := feed.Lock(ctx, conn)
	if err != nil || !held {
		if err != nil {
			s.fail(ctx, tenant, stepRead)
		}
		return false, err
	}
	defer func() { _ = feed.Unlock(context.WithoutCancel(ctx), conn) }()
	for {
		n, err := s.batch(ctx, tenant, conn)
		if err != nil {
			return false, err
		}
		if n < s.p.Config.BatchSize {
			return true, nil
		}
	}
}

// batch relays the oldest rows of the outbox once and returns how many it
// read.
func (s *Service) batch(ctx context.Context, tenant string, conn *sql.Conn) (int, error) {
	rows, err := feed.Pending(ctx, conn, s.p.Config.BatchSize)
	if err != nil {
		s.fail(ctx, tenant, stepRead)
		return 0, err
	}
	if len(rows) == 0 {
		return 0, nil
	}
	rows, tooLarge := sendable(rows)
	recs := make([]*kgo.Record, len(rows))
	for i, r := range rows {
		recs[i] = &kgo.Record{Key: []byte(tenant + "/" + r.Topic), Value: r.Event}
	}
	done, err := acknowledged(rows, recs, s.cl.ProduceSync(ctx, recs...))
	if err = errors.Join(tooLarge, err); err != nil {
		s.fail(ctx, tenant, stepProduce)
	}
	testhook.CrashAfterRelay()
	// the rows acknowledged are deleted even when others failed: what is
	// left is each failed topic's rows from its first failure on
	if derr := feed.Delete(context.WithoutCancel(ctx), conn, done); derr != nil {
		s.fail(ctx, tenant, stepDelete)
		return 0, derr
	}
	s.m.relayed.WithLabelValues(tenant).Add(float64(len(done)))
	return len(rows), err
}

// fail counts a failed step of tenant's pass, unless the process is
// stopping (its own cancellation is no failure).
func (s *Service) fail(ctx context.Context, tenant, step string) {
	if ctx.Err() == nil {
		s.m.failures.WithLabelValues(tenant, step).Inc()
	}
}

// maxEventBytes is the largest event the relay hands the producer: below
// franz-go's default batch limit (kgo.ProducerBatchMaxBytes, 1,000,012
// bytes), which the client enforces by failing that record alone — a
// later change of the same topic would then be acknowledged past it.
const maxEventBytes = 1_000_012 - 1024

// sendable drops from rows each topic's rows from its first event larger
// than maxEventBytes on: they stay in the outbox, in order, and the topic's
// lag grows until an operator acts (docs/operations.md,
// ImshardChangeFeedLagging). err names the first such event.
func sendable(rows []feed.Row) (out []feed.Row, err error) {
	held := map[string]bool{}
	out = rows[:0:0]
	for _, r := range rows {
		if held[r.Topic] || len(r.Event)+len(r.Topic) > maxEventBytes {
			if !held[r.Topic] && err == nil {
				err = fmt.Errorf("relay: change %s/%d is %d bytes, more than a record may carry (%d): held with the topic's later changes", r.Topic, r.ChangeSeq, len(r.Event), maxEventBytes)
			}
			held[r.Topic] = true
			continue
		}
		out = append(out, r)
	}
	return out, err
}

// acknowledged are the ids of rows whose records the broker acknowledged,
// each topic's only up to its first failure: a topic's later rows are
// kept so the next pass produces them again after the failed one, in
// change_seq order (the producer fails them too; this holds the order
// whatever it does). recs[i] is rows[i]'s record; results come in the
// order the broker answered. err is the first failure.
func acknowledged(rows []feed.Row, recs []*kgo.Record, results kgo.ProduceResults) ([]int64, error) {
	errs := make(map[*kgo.Record]error, len(results))
	for _, r := range results {
		errs[r.Record] = r.Err
	}
	var (
		ids    = make([]int64, 0, len(rows))
		failed = map[string]bool{}
		first  error
	)
	for i, r := range rows {
		err, answered := errs[recs[i]]
		if !answered {
			err = errors.New("no produce result")
		}
		if err != nil || failed[r.Topic] {
			failed[r.Topic] = true
			if first == nil {
				first = fmt.Errorf("relay: produce %s/%d: %w", r.Topic, r.ChangeSeq, err)
			}
			continue
		}
		ids = append(ids, r.ID)
	}
	return ids, first
}

// measure sets tenant's lag gauge from its outbox (every relay process
// does, the one holding the tenant or not, so the lag is seen while the
// holder hangs).
func (s *Service) measure(ctx context.Context, tenant string) {
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		return
	}
	age, err := feed.OldestAge(ctx, db)
	if err != nil {
		return
	}
	s.m.lag.WithLabelValues(tenant).Set(age.Seconds())
}
