package keyset

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
)

// Params are the registry's dependencies.
type Params struct {
	Log        zerolog.Logger
	Registerer prometheus.Registerer
	// RefreshInterval is auth.jwks_refresh_interval.
	RefreshInterval time.Duration
	// Client fetches the JWKS; nil means one of the registry's own.
	Client *http.Client
}

// Registry is the live key set of every tenant. It is built with the
// configured keys; Start adds the tenants' JWKS and keeps them fresh until
// Close, and Apply (a reload) replaces the tenants.
type Registry struct {
	p Params
	m metrics

	apply sync.Mutex // one Apply (or Start) at a time

	mu      sync.RWMutex
	sets    map[string]*Set
	remotes map[string]*jwks // by tenant, while started
	ctx     context.Context  // set by Start: the JWKS' lifetime
	cancel  context.CancelFunc
	closed  bool

	// removed is signalled when a fetch dropped a kid; notify runs the
	// onRemoved functions (the stream's revalidation) off the fetch
	removed   chan struct{}
	onRemoved []func()
	notifying sync.WaitGroup
}

// New builds the registry of tenants' configured keys and registers its
// metrics; no JWKS is fetched before Start.
func New(p Params, tenants []config.Tenant) *Registry {
	if p.Client == nil {
		// a transport of its own, so Close can drop its idle connections
		p.Client = &http.Client{Timeout: FetchTimeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	r := &Registry{p: p, m: newMetrics(p.Registerer), remotes: map[string]*jwks{}, removed: make(chan struct{}, 1)}
	r.sets = r.build(tenants, nil)
	return r
}

// Set is the key set of tenant; ok is false for a tenant not configured.
func (r *Registry) Set(tenant string) (*Set, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.sets[tenant]
	return s, ok
}

// Refused counts a token refused for reason; a tenant not configured (the
// claim is the client's to write) is counted as "unknown", so the series
// stay as many as the tenants.
func (r *Registry) Refused(tenant, reason string) {
	if _, ok := r.Set(tenant); !ok {
		tenant = "unknown"
	}
	r.m.refused.WithLabelValues(tenant, reason).Inc()
}

// OnKeysRemoved registers fn to run after a JWKS fetch dropped a key, off
// the fetch (the stream ends the sockets whose key is gone). Apply's
// callers handle a reload's removals themselves.
func (r *Registry) OnKeysRemoved(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onRemoved = append(r.onRemoved, fn)
}

// Start fetches the JWKS of every tenant that has one, all at once and
// each bounded by FetchTimeout (a failure leaves that tenant's JWKS empty
// until a refresh succeeds), and keeps them fresh until Close.
func (r *Registry) Start(tenants []config.Tenant) {
	r.apply.Lock()
	defer r.apply.Unlock()
	r.mu.Lock()
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.mu.Unlock()
	r.notifying.Add(1)
	go r.notify()
	r.applyLocked(tenants)
}

// Apply replaces the tenants (a reload): configured keys at once, a new or
// changed jwks_url fetched before it returns, a dropped one stopped.
func (r *Registry) Apply(tenants []config.Tenant) {
	r.apply.Lock()
	defer r.apply.Unlock()
	r.applyLocked(tenants)
}

func (r *Registry) applyLocked(tenants []config.Tenant) {
	r.mu.RLock()
	ctx, closed, live := r.ctx, r.closed, r.remotes
	r.mu.RUnlock()
	next := map[string]*jwks{}
	if ctx != nil && !closed {
		next = r.startRemotes(ctx, tenants, live)
	}
	sets := r.build(tenants, next)
	r.mu.Lock()
	if r.closed { // Close ran meanwhile: it stopped only what it saw
		for _, j := range next {
			j.close()
		}
		next = map[string]*jwks{}
		sets = r.build(tenants, nil)
	}
	r.sets, r.remotes = sets, next
	r.mu.Unlock()
	for tenant, j := range live {
		if next[tenant] != j {
			j.close()
			if next[tenant] == nil {
				r.m.forget(tenant)
			}
		}
	}
}

// startRemotes returns the JWKS of tenants: live ones whose URL is
// unchanged are kept, the others started concurrently.
func (r *Registry) startRemotes(ctx context.Context, tenants []config.Tenant, live map[string]*jwks) map[string]*jwks {
	next := map[string]*jwks{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range tenants {
		if t.JWKSURL == "" {
			continue
		}
		if j, ok := live[t.ID]; ok && j.url == t.JWKSURL {
			next[t.ID] = j
			continue
		}
		wg.Add(1)
		go func(t config.Tenant) {
			defer wg.Done()
			j, err := startJWKS(ctx, t.ID, t.JWKSURL, jwksParams{interval: r.p.RefreshInterval, client: r.p.Client,
				fetched: r.fetched, failed: r.failed})
			if err != nil {
				r.p.Log.Error().Err(err).Str("tenant", t.ID).Msg("keyset: JWKS not started; the tenant's tokens with a kid of its identity provider are refused")
				return
			}
			mu.Lock()
			next[t.ID] = j
			mu.Unlock()
		}(t)
	}
	wg.Wait()
	return next
}

func (r *Registry) build(tenants []config.Tenant, remotes map[string]*jwks) map[string]*Set {
	sets := make(map[string]*Set, len(tenants))
	for _, t := range tenants {
		sets[t.ID] = newSet(t, remotes[t.ID])
	}
	return sets
}

// fetched records a successful fetch, and signals a dropped kid.
func (r *Registry) fetched(j *jwks, kids []string, removed bool) {
	r.m.fetches.WithLabelValues(j.tenant, "ok").Inc()
	r.m.lastSuccess.WithLabelValues(j.tenant).Set(float64(time.Now().UnixMilli()) / 1000)
	r.m.keys.WithLabelValues(j.tenant).Set(float64(len(kids)))
	r.p.Log.Debug().Str("tenant", j.tenant).Strs("kids", kids).Msg("keyset: JWKS fetched")
	if removed {
		r.p.Log.Info().Str("tenant", j.tenant).Strs("kids", kids).Msg("keyset: the JWKS dropped a key: its tokens are refused and its sockets closed")
		select {
		case r.removed <- struct{}{}:
		default: // one pending notification covers this one too
		}
	}
}

// failed records a failed fetch: the keys of the last good one stay.
func (r *Registry) failed(j *jwks, err error) {
	r.m.fetches.WithLabelValues(j.tenant, "error").Inc()
	r.m.lastSuccess.WithLabelValues(j.tenant) // a tenant never fetched shows 0: stale
	r.p.Log.Warn().Err(err).Str("tenant", j.tenant).Str("url", j.url).Msg("keyset: JWKS fetch failed; the keys of the last good fetch stay in use")
}

func (r *Registry) notify() {
	defer r.notifying.Done()
	r.mu.RLock()
	ctx := r.ctx
	r.mu.RUnlock()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.removed:
			r.mu.RLock()
			fns := append([]func(){}, r.onRemoved...)
			r.mu.RUnlock()
			for _, fn := range fns {
				fn()
			}
		}
	}
}

// Close stops every JWKS refresh; the keys already fetched stay usable.
func (r *Registry) Close() {
	r.mu.Lock()
	if r.closed || r.cancel == nil {
		r.closed = true
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.cancel()
	r.mu.Unlock()
	r.notifying.Wait()
	r.p.Client.CloseIdleConnections()
}
