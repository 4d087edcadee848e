// Package app is the composition root: it builds the clients, starts the
// modules of the chosen roles in dependency order, serves operations
// endpoints, and stops everything in reverse order on shutdown. It is the
// only place that wires modules together.
package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/keyset"
	"github.com/imshard/imshard/modules/readpath"
)

// Service is one module's lifecycle: built by its init function (fallible
// setup), Run until its context ends — then drain, bounded by the module
// itself, and return — and Stop to release what it holds. Stop is called
// only after Run returned (or when Run never started, because start-up
// failed) and must leave no goroutine behind. A Run that returns while its
// context is still live is a failure that stops the process.
type Service interface {
	Run(ctx context.Context) error
	Stop(ctx context.Context) error
}

// ReadyChecker is implemented by services whose dependency /readyz checks.
type ReadyChecker interface {
	Ready(ctx context.Context) error
}

// App holds the process: config, logger, registry and the objects modules
// share. Fields are filled by init functions in dependency order; a module
// reads only what its dependencies built.
type App struct {
	Config   *config.Config
	Log      zerolog.Logger
	Registry *prometheus.Registry

	// APIMux is where HTTP roles register their handlers before API starts.
	APIMux *httpapi.Mux

	// ReadOnly, set before StartTools or DLQTool, makes the clients only
	// look: no tenant database, schema or Kafka topic is created, and a
	// missing one is an error that names it (the read-only commands).
	ReadOnly bool

	clients  clients
	reader   *readpath.Reader // module readpath
	keys     *keyset.Registry
	tenants  tenantSet
	reload   reloader
	stopping atomic.Bool

	mu       sync.RWMutex // services and order: /readyz reads them while Start appends
	services map[string]Service
	order    []string
}

// New prepares an App for the given targets (roles, or All).
func New(cfg *config.Config, log zerolog.Logger) *App {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a := &App{Config: cfg, Log: log, Registry: reg, APIMux: httpapi.NewMux(), services: map[string]Service{}}
	a.tenants.set(cfg.Tenants, cfg.Limits)
	a.keys = keyset.New(keyset.Params{Log: log.With().Str("module", Keys).Logger(), Registerer: reg,
		RefreshInterval: cfg.Auth.JWKSRefreshInterval}, cfg.Tenants)
	a.reload.live = cfg
	a.reload.lastOK, a.reload.failures = newReloadMetrics(reg)
	a.reload.weakSecrets = promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_tenant_secret_weak",
		Help: "1 for each HS256 secret of a tenant (jwt_secret, kid \"\", or a key's) that is accepted but weak, by reason: demo (a public demo secret) or short (under 32 bytes)."}, []string{"tenant", "kid", "reason"})
	promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{Name: "imshard_ready", Help: "1 when the process would answer /readyz 200 at this scrape, 0 when it would answer 503 (a dependency down, draining, shutting down)."}, a.readyValue)
	return a
}

// Start builds and starts every module the targets need. On failure the
// modules already started are stopped again.
func (a *App) Start(ctx context.Context, targets []string) error {
	order, err := StartOrder(targets)
	if err != nil {
		return err
	}
	// servers only: a one-shot command's output stays its own
	a.reportWeakSecrets(a.reload.live.Tenants)
	for _, name := range order {
		if err := a.startModule(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

func (a *App) startModule(ctx context.Context, name string) error {
	init, ok := inits[name]
	if !ok {
		a.stop(context.Background())
		return fmt.Errorf("module %s has no init function", name)
	}
	svc, err := init(ctx, a)
	if err != nil {
		a.stop(context.Background())
		return fmt.Errorf("start %s: %w", name, err)
	}
	a.mu.Lock()
	a.services[name] = svc
	a.order = append(a.order, name)
	a.mu.Unlock()
	a.Log.Debug().Str("module", name).Msg("module started")
	return nil
}

// Modules lists the modules started, in start order.
func (a *App) Modules() []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return append([]string(nil), a.order...)
}

// ErrStopNow, as the cause that ends Run's context, skips
// http.shutdown_delay: a Ctrl-C at a terminal, where no load balancer
// waits to see /readyz turn 503.
var ErrStopNow = errors.New("interrupted at the terminal")

// Run runs every started module until ctx ends (a signal) or one fails —
// returns an error, or returns at all, before it is asked to stop — then
// shuts down: /readyz turns 503 at once; a process serving the API keeps
// serving for http.shutdown_delay so load balancers drain it; then modules
// stop in reverse order (the API listener first), each first asked to finish
// (its Run's context cancelled) and, once its Run returned, stopped, all
// within http.shutdown_grace. It returns the first module failure, if any.
func (a *App) Run(ctx context.Context) error {
	runCtx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	a.watchReload(runCtx)
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(a.order))
	cancels := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	done := map[string]chan struct{}{}
	for _, name := range a.order {
		mctx, cancel := context.WithCancel(runCtx)
		cancels[name] = cancel
		ch := make(chan struct{})
		done[name] = ch
		wg.Add(1)
		go func(name string, svc Service) {
			defer wg.Done()
			defer close(ch)
			err := svc.Run(mctx)
			if mctx.Err() == nil {
				if err == nil {
					err = errors.New("returned before the process was stopping")
				}
				results <- result{name, err}
			}
		}(name, a.services[name])
	}

	var failure error
	select {
	case <-ctx.Done():
		a.Log.Info().Msg("shutdown requested")
	case r := <-results:
		failure = fmt.Errorf("module %s failed: %w", r.name, r.err)
		a.Log.Error().Err(r.err).Str("module", r.name).Msg("module failed; shutting down")
	}

	a.stopping.Store(true)
	if delay := a.Config.HTTP.ShutdownDelay; delay > 0 && slices.Contains(a.order, API) && !errors.Is(context.Cause(ctx), ErrStopNow) {
		// /readyz already answers 503; the API keeps serving until the load
		// balancer has seen that and stopped sending new requests here.
		a.Log.Info().Dur("shutdown_delay", delay).Msg("not ready: draining from the load balancer")
		time.Sleep(delay)
	}
	grace := a.Config.HTTP.ShutdownGrace
	stopCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	for i := len(a.order) - 1; i >= 0; i-- {
		name := a.order[i]
		cancels[name]()
		if !waitDone(stopCtx, done[name]) {
			// its Stop would race a Run still under way: leave both
			a.Log.Error().Str("module", name).Msg("module did not finish within the shutdown grace; not stopped")
			continue
		}
		if err := a.services[name].Stop(stopCtx); err != nil {
			a.Log.Warn().Err(err).Str("module", name).Msg("module stopped with an error")
		}
	}
	if stopCtx.Err() == nil {
		wg.Wait()
	}
	return failure
}

// waitDone reports whether done closes before ctx ends (a done already
// closed counts even when ctx has ended too).
func waitDone(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// stop stops started modules in reverse order (used when Start fails).
func (a *App) stop(ctx context.Context) {
	a.stopping.Store(true)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a.mu.Lock()
	services, order := a.services, a.order
	a.services, a.order = map[string]Service{}, nil
	a.mu.Unlock()
	for i := len(order) - 1; i >= 0; i-- {
		_ = services[order[i]].Stop(ctx)
	}
}

// Ready reports whether the process should receive traffic: not shutting
// down, and every started dependency that can be checked answers.
func (a *App) Ready(ctx context.Context) error {
	if a.stopping.Load() {
		return errors.New("shutting down")
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	var errs []error
	for _, name := range a.order {
		if rc, ok := a.services[name].(ReadyChecker); ok {
			if err := rc.Ready(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// toolModules are what one-shot operator commands need: no servers, no loops.
var toolModules = []string{MySQL, Redis, Routing}

// StartTools starts the clients and the routing core only, for one-shot
// commands (`imshard shard …`, `route …`), and the extra modules a command
// reads through (the benchmarks: readpath). Close stops them.
func (a *App) StartTools(ctx context.Context, extra ...string) error {
	for _, name := range append(slices.Clone(toolModules), extra...) {
		if err := a.startModule(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// Close stops whatever Start or StartTools started, in reverse order.
func (a *App) Close() { a.stop(context.Background()) }
