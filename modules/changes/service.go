// Package changes is the message-change path: recall, edit and delete for
// everyone (change.go), and delete for me (hide.go), with their revisions
// and change events. They are writes, so the send role runs them; they read
// the message they change and keep the read path's caches true through
// modules/readpath.
package changes

import (
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
	Reader  *readpath.Reader
	Redis   rueidis.Client
	Router  *routing.Router
	Flight  *routing.Flight
	ACL     *acl.Checker
	Scripts *routing.Scripts
	// Migrations gates changes while the tenant migrates from its legacy table.
	Migrations *routing.Migrations
	// RecallWindow is how long after sending a sender may recall a
	// message (send.recall_window).
	RecallWindow time.Duration
	// MaxEditBody bounds an edit's body as send.max_body_bytes bounds a
	// send's (default 64 KiB).
	MaxEditBody int64
	Log         zerolog.Logger
	Registerer  prometheus.Registerer
}

// Service changes messages.
type Service struct {
	p Params
	r *readpath.Reader
	m *metrics
}

// New builds the service and registers its metrics.
func New(p Params) *Service {
	return &Service{p: p, r: p.Reader, m: newMetrics(p.Registerer)}
}
