package test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/move"
)

// TestMoveSwitchPreChecksAndMetrics: a switch whose last catch-up round
// finds more chunks changed than the move allows, or whose target is at
// another schema version, is refused before the fence rises — nothing
// held, the move back in catch-up — and the same move switches once the
// cause is gone; the shard manager's imshard_move_* series follow the
// move record from catch-up to done.
func TestMoveSwitchPreChecksAndMetrics(t *testing.T) {
	t.Parallel()
	l := mvStartLive(t, 0)
	tenant, targetDSN, env, store, src := l.tenant, l.targetDSN, l.env, l.store, l.src
	ctx := context.Background()
	month := env.Now().String()
	mvInsert(t, src, month, "g_p", 1, 100)
	reg := prometheus.NewRegistry()
	watch := move.NewWatch(move.WatchParams{Tenants: func() []string { return []string{tenant} }, Moving: store.Moving, DBs: env.App.Pools(),
		Log: zerolog.Nop(), Registerer: reg})
	// a tenant never noted as moving has no move series
	watch.Poll(ctx)
	if families, err := reg.Gather(); err != nil || len(families) != 0 {
		t.Fatalf("series of a tenant that never moved: %d families, %v", len(families), err)
	}

	at := l.at
	changed := false
	o := move.Options{ChunkRows: 10, MaxSwitchLag: 2, StepHook: func(step string) error {
		if step == move.StepPreCheck && !changed {
			// writes touch every chunk of the month table just before the pre-checks
			changed = true
			_, err := src.Exec("UPDATE im_group_messages_" + month + " SET status = 'recalled' WHERE topic = 'g_p' AND seqid % 10 = 1")
			return err
		}
		return nil
	}}
	m, err := move.Begin(ctx, tenant, at, targetDSN, store, o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	err = m.Run(ctx)
	if !errors.Is(err, move.ErrSwitchRefused) || !strings.Contains(err.Error(), "catch-up lag") {
		t.Fatalf("switch with 10 chunks changed, at most 2 allowed: %v, want refused for its lag", err)
	}
	if e := mvFence(t, src); e != at.Epoch || m.State().Step != move.StepCatchUp {
		t.Fatalf("after the refusal: source fence %d, step %s; want %d and catchup", e, m.State().Step, at.Epoch)
	}
	watch.Poll(ctx)
	if v := mvGauge(t, reg, "imshard_move_step", "step", move.StepCatchUp); v != 1 {
		t.Fatalf("imshard_move_step{step=catchup} %v, want 1", v)
	}
	if v := mvGauge(t, reg, "imshard_move_rows_copied", "", ""); v < 100 {
		t.Fatalf("imshard_move_rows_copied %v, want at least 100", v)
	}

	// the target at another schema version: refused too
	dst, _, err := move.OpenDB(targetDSN, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := dst.Exec("INSERT INTO im_schema_migrations (version, name) VALUES (9999, 'newer')"); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); !errors.Is(err, move.ErrSwitchRefused) || !strings.Contains(err.Error(), "schema version") {
		t.Fatalf("switch to a target at another schema version: %v, want refused", err)
	}
	if e := mvFence(t, src); e != at.Epoch {
		t.Fatalf("source fence %d after the refusal, want %d", e, at.Epoch)
	}
	if _, err := dst.Exec("DELETE FROM im_schema_migrations WHERE version = 9999"); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); err != nil {
		t.Fatalf("switch once the causes are gone: %v", err)
	}
	mvWaitEpoch(t, env, at.Epoch+1)
	watch.Poll(ctx)
	if v := mvGauge(t, reg, "imshard_move_step", "step", move.StepDone); v != 1 {
		t.Fatalf("imshard_move_step{step=done} %v after the switch, want 1", v)
	}
	if v := mvGauge(t, reg, "imshard_move_switch_seconds", "", ""); v <= 0 {
		t.Fatalf("imshard_move_switch_seconds %v after the switch, want > 0", v)
	}
}

// mvGauge is the value of the gauge name in reg (of the series whose
// label has value, when label is set).
func mvGauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			match := label == ""
			for _, l := range s.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if match {
				return s.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}
