package app

import (
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

// Accessors for what the started modules built: role init functions, the
// one-shot commands and the tests read the shared objects through these.

// Pools is the tenant MySQL pools (module mysql).
func (a *App) Pools() *tenantdb.Pools { return a.clients.pools }

// Redis is the Redis client (module redis).
func (a *App) Redis() rueidis.Client { return a.clients.redis }

// KeySpace is where every Redis key and channel is named: under
// redis.key_prefix (module redis).
func (a *App) KeySpace() routing.KeySpace { return a.clients.keys }

// KafkaConn are the options every Kafka client connects with: the seed
// brokers (the in-process cluster's when kafka.brokers is empty), TLS and
// SASL (module kafka).
func (a *App) KafkaConn() []kgo.Opt { return a.clients.kafka }

// Scripts are the Lua scripts (module routing).
func (a *App) Scripts() *routing.Scripts { return a.clients.scripts }

// RoutingMetrics are the metrics shared across modules (module routing).
func (a *App) RoutingMetrics() *routing.Metrics { return a.clients.rmetrics }

// Catalog is the shard catalog (module routing).
func (a *App) Catalog() *routing.Catalog { return a.clients.catalog }

// Allocator hands out seq + month (module routing).
func (a *App) Allocator() *routing.Allocator { return a.clients.alloc }

// Flight tracks pending seqs and gaps (module routing).
func (a *App) Flight() *routing.Flight { return a.clients.flight }

// Routes is the Redis topic-route store (module routing).
func (a *App) Routes() *routing.Routes { return a.clients.routes }

// ACL answers membership questions (module routing).
func (a *App) ACL() *acl.Checker { return a.clients.acl }

// APIAddr is where the API server listens ("" if not started).
func (a *App) APIAddr() string { return a.listenAddr(API) }

// OpsAddr is where /metrics, /healthz and /readyz listen.
func (a *App) OpsAddr() string { return a.listenAddr(Ops) }

func (a *App) listenAddr(module string) string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if s, ok := a.services[module].(*httpServer); ok {
		return s.Addr()
	}
	return ""
}

// APIRoutes lists the patterns ("METHOD /path") the started HTTP roles
// registered on the API server, sorted.
func (a *App) APIRoutes() []string { return a.APIMux.Patterns() }

// OpsRoutes lists the patterns the operations server serves, sorted.
func (a *App) OpsRoutes() []string { return a.opsHandler().Patterns() }

// Reader is the read path the reading modules share (module readpath).
func (a *App) Reader() *readpath.Reader { return a.reader }
