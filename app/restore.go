package app

import (
	"context"
	"fmt"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// RestoreOptions steer RestoreTenant.
type RestoreOptions struct {
	// KafkaSince is where the scan of the message topic starts: at or before
	// the moment the dump began. Zero reads the whole retention.
	KafkaSince time.Time
	// SeqMargin is added above the highest seq found for each topic.
	SeqMargin int64
	// Progress is told about each step.
	Progress func(format string, args ...any)
}

// RestoreReport is what RestoreTenant did.
type RestoreReport struct {
	Events int   // the tenant's events read from Kafka
	Topics int   // topics whose reservation was raised
	MaxHi  int64 // the highest reservation afterwards
	Active routing.Month
}

// RestoreTenant fits the rest of the system to a tenant database just
// restored from a dump (`imshard route restore`); the tenant must not be
// served meanwhile. The dump's seq reservations are as old as the dump, and
// seqs went on being handed out after it (for topics the dump does not even
// know), so first every topic's durable reservation is raised above the
// highest seq the dump or the Kafka message topic holds for it, plus
// SeqMargin. Then the tenant's Redis keys — which describe the state before
// the restore — are dropped, and what Redis needs is rebuilt from MySQL: the
// active and ready months now, the topic routes from the mirror; counters
// re-seed above the raised reservations on their first allocation, caches
// refill on use. It starts the tool modules and Kafka; Close stops them.
func (a *App) RestoreTenant(ctx context.Context, tenant string, o RestoreOptions) (RestoreReport, error) {
	var rep RestoreReport
	say := o.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	tool, err := a.DLQTool(ctx)
	if err != nil {
		return rep, err
	}
	issued, events, err := tool.IssuedSeqs(ctx, tenant, o.KafkaSince)
	if err != nil {
		return rep, err
	}
	rep.Events = events
	say("read %d events from %s (%d topics)", events, a.Config.Kafka.Topic, len(issued))
	his, err := a.clients.alloc.RaiseReservations(ctx, tenant, issued, o.SeqMargin)
	if err != nil {
		return rep, err
	}
	rep.Topics = len(his)
	for _, hi := range his {
		rep.MaxHi = max(rep.MaxHi, hi)
	}
	say("raised the seq reservations of %d topics (margin %d, highest now %d)", rep.Topics, o.SeqMargin, rep.MaxHi)
	if err := a.clients.keys.DropTenantKeys(ctx, a.clients.redis, tenant); err != nil {
		return rep, fmt.Errorf("drop the Redis keys of %s: %w", tenant, err)
	}
	say("dropped the Redis keys")
	if rep.Active, err = a.clients.alloc.RecoverActive(ctx, tenant); err != nil {
		return rep, err
	}
	say("active month %s, ready months restored from MySQL", rep.Active)
	err = a.NewRouteCheck().Rebuild(ctx, tenant, nil, func(done, total int) {
		if done == total {
			say("rebuilt %d topic routes from the mirror", total)
		}
	})
	return rep, err
}
