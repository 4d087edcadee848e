package move

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
)

// Steps lists every step of a move, in order (the values of
// imshard_move_step's step label).
var Steps = []string{StepPlan, StepCopy, StepCatchUp, StepVerify, StepPreCheck, StepSwitch, StepDone, StepCancelling, StepCancelled, StepFinished}

// WatchInterval is how often the shard manager reads the tenants' move
// records into the imshard_move_* series.
const WatchInterval = 10 * time.Second

// DBs hands out a tenant's pool on its current placement.
type DBs interface {
	DB(ctx context.Context, tenant string) (*sql.DB, error)
}

// WatchParams configures a Watch: Tenants are the configured tenants,
// Moving those a move was begun for (placement.Store.Moving).
type WatchParams struct {
	Tenants    func() []string
	Moving     func(ctx context.Context) ([]string, error)
	DBs        DBs
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Watch exports each tenant's move, as recorded on the database of its
// current placement (the source until the switch, the target after), as
// the imshard_move_* series. It reads only the tenants the placement
// servers note a move for, so a poll opens no pool of a tenant that never
// moved, and such a tenant has no imshard_move_* series at all.
type Watch struct {
	p                                            WatchParams
	exported                                     map[string]bool
	step                                         *prometheus.GaugeVec
	rows, bytes, lag, paused, switchSec, updated *prometheus.GaugeVec
}

// NewWatch registers the series.
func NewWatch(p WatchParams) *Watch {
	f := promauto.With(p.Registerer)
	tenant := []string{"tenant"}
	return &Watch{p: p, exported: map[string]bool{},
		step: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_step",
			Help: "1 for the step the tenant's move is at (plan, copy, catchup, verify, precheck, switch, done, cancelling, cancelled, finished), 0 for the others (no series: the tenant never moved)."}, []string{"tenant", "step"}),
		rows:      f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_rows_copied", Help: "Rows the tenant's move copied (chunks copied again in catch-up count again)."}, tenant),
		bytes:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_bytes_copied", Help: "Bytes the tenant's move copied."}, tenant),
		lag:       f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_lag_chunks", Help: "Chunks of the tenant's move changed since their last copy, still to copy (the catch-up lag)."}, tenant),
		paused:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_paused", Help: "1 while the tenant's move is paused."}, tenant),
		switchSec: f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_switch_seconds", Help: "How long the tenant's switch held its writes (0 before the switch)."}, tenant),
		updated:   f.NewGaugeVec(prometheus.GaugeOpts{Name: "imshard_move_updated_timestamp_seconds", Help: "Unix time the tenant's move record last changed (a step, a chunk, a pause)."}, tenant),
	}
}

// Run reads the records every WatchInterval until ctx ends.
func (w *Watch) Run(ctx context.Context) error {
	t := time.NewTicker(WatchInterval)
	defer t.Stop()
	for {
		w.Poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll reads the move record of every configured tenant noted as moving,
// and drops the series of the others.
func (w *Watch) Poll(ctx context.Context) {
	moving, err := w.p.Moving(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.p.Log.Warn().Err(err).Msg("moving tenants unreadable; the move series keep their last values")
		}
		return
	}
	configured := map[string]bool{}
	for _, t := range w.p.Tenants() {
		configured[t] = true
	}
	polled := map[string]bool{}
	for _, tenant := range moving {
		if !configured[tenant] {
			continue
		}
		polled[tenant] = true
		if err := w.pollTenant(ctx, tenant); err != nil && ctx.Err() == nil {
			w.p.Log.Warn().Err(err).Str("tenant", tenant).Msg("move record unreadable; its series keep their last values")
		}
	}
	for tenant := range w.exported {
		if !polled[tenant] {
			w.drop(tenant)
		}
	}
}

// drop removes the tenant's series (no move known any more).
func (w *Watch) drop(tenant string) {
	for _, g := range []*prometheus.GaugeVec{w.step, w.rows, w.bytes, w.lag, w.paused, w.switchSec, w.updated} {
		g.DeletePartialMatch(prometheus.Labels{"tenant": tenant})
	}
	delete(w.exported, tenant)
}

func (w *Watch) pollTenant(ctx context.Context, tenant string) error {
	db, err := w.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	var st State
	var updated float64
	err = db.QueryRowContext(ctx, `SELECT role, step, paused, rows_copied, bytes_copied, switch_ms, UNIX_TIMESTAMP(updated_at)
		FROM im_tenant_move WHERE id = 1`).Scan(&st.Role, &st.Step, &st.Paused, &st.RowsCopied, &st.BytesCopied, &st.SwitchMS, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		w.drop(tenant) // noted, but no record (yet, or the database was replaced)
		return nil
	}
	if err != nil {
		return fmt.Errorf("move: read the move record: %w", err)
	}
	if st.Role == "source" {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_tenant_move_chunks WHERE copied = 0").Scan(&st.Lag); err != nil {
			return fmt.Errorf("move: read the move's chunks: %w", err)
		}
	}
	for _, s := range Steps {
		v := 0.0
		if s == st.Step {
			v = 1
		}
		w.step.WithLabelValues(tenant, s).Set(v)
	}
	paused := 0.0
	if st.Paused {
		paused = 1
	}
	w.rows.WithLabelValues(tenant).Set(float64(st.RowsCopied))
	w.bytes.WithLabelValues(tenant).Set(float64(st.BytesCopied))
	w.lag.WithLabelValues(tenant).Set(float64(st.Lag))
	w.paused.WithLabelValues(tenant).Set(paused)
	w.switchSec.WithLabelValues(tenant).Set(float64(st.SwitchMS) / 1000)
	w.updated.WithLabelValues(tenant).Set(updated)
	w.exported[tenant] = true
	return nil
}
