// Package send is the send role: POST /v1/topics/{topic}/messages and the
// group/member management endpoints (docs/api.md). A send is authenticated,
// validated and authorised, claims its idempotency record, takes a Snowflake
// id, allocates (seq, month) in one Lua call, produces the event to Kafka
// and answers 201 only once the call after the broker's ack recorded it in
// time; the hot cache and the realtime publish it also makes never fail the
// send.
//
// Gaps (invariants 1 and 12, docs/invariants.md): a seq is never reused. When the
// produce fails or times out, the answer is 503 and the idempotency record
// keeps the event (status failed), so a retry with the same client_msg_id
// re-produces exactly that event — same seq, month and event_id. A seq
// nobody acknowledged within send.produce_timeout of its allocation is
// recorded as a gap and abandoned by routing.Flight.Settled: a late ack of
// it answers 503 too, persist drops its event, and a retry finds the gap
// and sends the message afresh under a new seq. The send path itself
// records a gap only for a seq it abandons before producing (the event
// could not be stored in the claim), since nothing can ever re-produce
// that one.
package send

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/ratelimit"
	"github.com/imshard/imshard/modules/routing"
)

// DefaultLeaseTTL is the Snowflake node lease's lifetime; it is renewed at a
// third of it.
const DefaultLeaseTTL = 30 * time.Second

// Params wires the send role.
type Params struct {
	Send       config.Send
	HotCache   config.HotCache
	KafkaConn  []kgo.Opt // seed brokers, TLS, SASL
	KafkaTopic string
	LeaseTTL   time.Duration // 0 = DefaultLeaseTTL

	Redis      rueidis.Client
	KeySpace   routing.KeySpace // redis.key_prefix: where every key and channel is named
	DBs        routing.DBs
	Catalog    *routing.Catalog
	Allocator  *routing.Allocator
	Scripts    *routing.Scripts
	ACL        *acl.Checker
	Auth       *httpapi.Authenticator
	Migrations *routing.Migrations // the write gate of a tenant being migrated
	Limits     *ratelimit.Limiter  // the tenants' send limits, decided in the send call
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Service is the send role.
type Service struct {
	p       Params
	m       *metrics
	ids     *Snowflake
	lease   *NodeLease
	prod    *producer
	idemTTL string // send.idempotency_ttl in ms, as the scripts take it
	stale   string // send.produce_timeout in ms
	hotTTL  string // hot_cache.ttl in ms
	hotMax  string // hot_cache.max_per_topic
	acks    *ackBatcher

	wg       sync.WaitGroup // background work: produces answered 503, horizons
	horizons sync.Map       // tenant → struct{}: one horizon computation each
}

// New leases a Snowflake node id and starts the Kafka producer.
func New(ctx context.Context, p Params) (*Service, error) {
	if p.LeaseTTL <= 0 {
		p.LeaseTTL = DefaultLeaseTTL
	}
	s := &Service{
		p:       p,
		m:       newMetrics(p.Registerer),
		ids:     NewSnowflake(p.Send.MaxClockBackward),
		idemTTL: fmt.Sprint(p.Send.IdempotencyTTL.Milliseconds()),
		stale:   fmt.Sprint(p.Send.ProduceTimeout.Milliseconds()),
		hotTTL:  fmt.Sprint(p.HotCache.TTL.Milliseconds()),
		hotMax:  fmt.Sprint(p.HotCache.MaxPerTopic),
	}
	s.acks = newAckBatcher(s.sentCall, func(n int) { s.m.ackBatch.Observe(float64(n)) })
	s.lease = NewNodeLease(p.Redis, p.KeySpace, p.Scripts, p.LeaseTTL, s.ids, p.Log)
	if err := s.lease.Acquire(ctx); err != nil {
		return nil, err
	}
	prod, err := newProducer(p.KafkaConn, p.KafkaTopic, p.Send.ProduceTimeout)
	if err != nil {
		_ = s.lease.Release(context.Background())
		return nil, err
	}
	s.prod = prod
	return s, nil
}

// Register adds the role's routes to mux (Go 1.22 patterns).
func (s *Service) Register(mux *httpapi.Mux) {
	h := func(fn httpapi.HandlerFunc) http.Handler { return httpapi.Handle(s.p.Auth, s.p.Log, false, fn) }
	mux.Handle("POST /v1/topics/{topic}/messages", h(s.handleSend))
	mux.Handle("PUT /v1/topics/{topic}", h(s.handlePutGroup))
	mux.Handle("PUT /v1/topics/{topic}/members/{uid}", h(s.handlePutMember))
	mux.Handle("DELETE /v1/topics/{topic}/members/{uid}", h(s.handleDeleteMember))
}

// Run renews the node lease until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	s.lease.Run(ctx)
	return nil
}

// Stop flushes the producer, waits for background work and gives the
// node id back. The API server stops before this role, so no send starts.
func (s *Service) Stop(ctx context.Context) error {
	s.prod.close(ctx)
	s.wg.Wait()
	return s.lease.Release(ctx)
}

// Ready reports a usable node lease: without one no message id is minted.
func (s *Service) Ready(context.Context) error {
	if !s.ids.Leased() {
		return ErrNoNode
	}
	return nil
}

// token is an attempt's owner token in its idempotency claim.
func token() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
