package placement

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/tenantdb"
)

// Placer is what follows the records: the process's tenant pools.
type Placer interface {
	SetPlacements(placed map[string]tenantdb.Placement) (changed []string)
	Placement(tenant string) (tenantdb.Placement, error)
}

// Watcher reads the records every poll interval and re-points the pools,
// so every role of every process follows a move within one interval,
// without a restart. A poll that reaches no server changes nothing.
type Watcher struct {
	store  *Store
	pools  Placer
	poll   time.Duration
	log    zerolog.Logger
	epoch  *prometheus.GaugeVec
	polls  *prometheus.CounterVec
	lastOK prometheus.Gauge
	// seen is the highest record read so far per tenant: a poll that
	// reaches only servers an interrupted switch did not write to yet
	// must not take the tenant back to an older epoch
	seen map[string]Record
}

// NewWatcher builds the watcher; reg gets its series.
func NewWatcher(store *Store, pools Placer, poll time.Duration, log zerolog.Logger, reg prometheus.Registerer) *Watcher {
	f := promauto.With(reg)
	w := &Watcher{store: store, pools: pools, poll: poll, log: log, seen: map[string]Record{},
		epoch: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_tenant_placement_epoch",
			Help: "The placement epoch this process writes a tenant with (0: the configured DSN; raised by each move's switch)."}, []string{"tenant"}),
		polls: f.NewCounterVec(prometheus.CounterOpts{Name: "imshard_placement_polls_total",
			Help: "Reads of a placement server by result (ok, failed): a failed server is skipped while another answers."}, []string{"server", "result"}),
		lastOK: f.NewGauge(prometheus.GaugeOpts{Name: "imshard_placement_last_sync_timestamp_seconds",
			Help: "When this process last read the placement records from at least one server (Unix seconds)."}),
	}
	for _, s := range store.Servers() {
		w.polls.WithLabelValues(s, "ok")
		w.polls.WithLabelValues(s, "failed")
	}
	return w
}

// Sync reads the records once and applies them. Sync and Run are not
// meant to run at once (start calls Sync, then Run polls).
func (w *Watcher) Sync(ctx context.Context) error {
	recs, failed, err := w.store.Load(ctx)
	failedSet := map[string]bool{}
	for _, f := range failed {
		failedSet[f.Server] = true
		w.polls.WithLabelValues(f.Server, "failed").Inc()
		w.log.Warn().Err(f.Err).Str("server", f.Server).Msg("placement server not readable; following the others")
	}
	for _, s := range w.store.Servers() {
		if !failedSet[s] {
			w.polls.WithLabelValues(s, "ok").Inc()
		}
	}
	if err != nil {
		return err
	}
	for id, r := range recs {
		if cur, ok := w.seen[id]; !ok || r.Epoch > cur.Epoch {
			w.seen[id] = r
		}
	}
	placed := make(map[string]tenantdb.Placement, len(w.seen))
	for id, r := range w.seen {
		placed[id] = tenantdb.Placement{DSN: r.DSN, Epoch: r.Epoch}
	}
	for _, id := range w.pools.SetPlacements(placed) {
		at, err := w.pools.Placement(id)
		if err != nil {
			continue
		}
		w.log.Info().Str("tenant", id).Int64("epoch", at.Epoch).Msg("tenant placement changed: its handles now point at the new placement")
		w.epoch.WithLabelValues(id).Set(float64(at.Epoch))
	}
	w.lastOK.SetToCurrentTime()
	return nil
}

// ExportTenants sets the epoch series of tenants (at start and after a
// reload), so a dashboard shows every tenant's epoch, 0 included.
func (w *Watcher) ExportTenants(ids []string) {
	for _, id := range ids {
		if at, err := w.pools.Placement(id); err == nil {
			w.epoch.WithLabelValues(id).Set(float64(at.Epoch))
		}
	}
}

// Run polls until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := w.Sync(ctx); err != nil && ctx.Err() == nil {
				w.log.Error().Err(err).Msg("placement records unreadable; keeping the placements this process follows")
			}
		}
	}
}
