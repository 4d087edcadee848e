// Package inbox is the read state (docs/api.md "Read state"): each user's
// read cursor per topic, the unread badges, the topic list, a device's
// sync and the per-topic preferences, with the per-process caches that
// make them cheap (remembered badges and route mirrors). It reads topics'
// messages through modules/readpath.
package inbox

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
)

// Params wires a Service.
type Params struct {
	// Reader is the process's read path (modules/readpath).
	Reader   *readpath.Reader
	Redis    rueidis.Client
	KeySpace routing.KeySpace // redis.key_prefix: where every key and channel is named
	DBs      routing.DBs
	Router   *routing.Router
	Flight   *routing.Flight
	ACL      *acl.Checker
	Scripts  *routing.Scripts
	// Migrations answers whether a tenant migrates from its legacy table
	// (its legacy rows count, nothing is remembered meanwhile).
	Migrations *routing.Migrations
	// LocalUsers is how many users' unread counts the process remembers
	// (readstate_memo.go), each for RememberedMaxAge at most; either 0 keeps
	// none.
	LocalUsers       int
	RememberedMaxAge time.Duration
	// LocalRoutes is how many topics' route mirrors the process remembers
	// for topic lists, each for RememberedMaxAge at most; either 0 keeps
	// none.
	LocalRoutes int
	Log         zerolog.Logger
	Registerer  prometheus.Registerer
}

// Service answers the read state: cursors, badges, the topic list, sync
// and preferences.
type Service struct {
	p      Params
	r      *readpath.Reader
	m      *metrics
	st     store
	memo   *badgeMemo
	routes *routeMemo
	bg     sync.WaitGroup // read frames being published (publishRead)
}

// store is the read path's statement cache with the read state's own
// statements.
type store struct{ *readpath.Store }

// New builds the service; Close waits for its read frames under way.
func New(p Params) *Service {
	bm := newBadgeMemo(p.LocalUsers, p.RememberedMaxAge)
	rm := newRouteMemo(p.LocalRoutes, p.RememberedMaxAge)
	return &Service{p: p, r: p.Reader, m: newMetrics(p.Registerer, bm.userCount, rm.topicCount), st: store{p.Reader.Store()}, memo: bm, routes: rm}
}

// Close waits for the read frames under way.
func (s *Service) Close() {
	s.bg.Wait()
}
