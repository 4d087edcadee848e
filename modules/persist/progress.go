package persist

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/imshard/imshard/modules/routing"
)

// progressInterval is how often persist looks whether its consumer group
// passed the end offsets it noted (progressLoop).
const progressInterval = time.Second

// progressMark is a moment of kafka.topic: the Redis time read first, then
// every partition's end offset — so every record Kafka took before that
// time lies below the offsets.
type progressMark struct {
	at   time.Time
	ends map[int32]int64
}

// progressLoop publishes, for every tenant, the Redis time before which
// every record produced to kafka.topic is stored, compensated or
// dead-lettered (routing.Keys.PersistedBefore): once the group's committed
// offsets reach the end offsets of a mark, the mark's time is such a time.
// Readers lift a topic's resume fence by it (routing fence.go). It compares
// the group's offsets, not this process's: any persist process tells the
// truth about all partitions, so every one runs the loop and none needs to
// own them all; a value written by another process that lags only holds
// fences a little longer.
func (s *Service) progressLoop(ctx context.Context) {
	adm := kadm.NewClient(s.cl)
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	var mark *progressMark
	for {
		if mark != nil {
			passed, err := s.passed(ctx, adm, mark)
			if err == nil && passed {
				err = s.publishProgress(ctx, mark.at)
				mark = nil
			}
			if err != nil && ctx.Err() == nil {
				s.p.Log.Warn().Err(err).Msg("persist: progress not published; resume fences stand until it is")
			}
		}
		if mark == nil {
			var err error
			if mark, err = s.progressMark(ctx, adm); err != nil && ctx.Err() == nil {
				s.p.Log.Warn().Err(err).Msg("persist: progress mark not taken; resume fences stand until it is")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// progressMark reads the Redis time, then the end offsets.
func (s *Service) progressMark(ctx context.Context, adm *kadm.Client) (*progressMark, error) {
	at, err := routing.NewClock(s.p.Redis).Now(ctx)
	if err != nil {
		return nil, err
	}
	ends, err := adm.ListEndOffsets(ctx, s.p.Kafka.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("persist: end offsets of %s: %w", s.p.Kafka.Topic, err)
	}
	m := &progressMark{at: at, ends: map[int32]int64{}}
	ends.Each(func(o kadm.ListedOffset) { m.ends[o.Partition] = o.Offset })
	return m, nil
}

// passed reports whether the group committed every partition up to the
// mark's end offsets: persist commits an offset only after every record
// below it is stored, compensated or dead-lettered.
func (s *Service) passed(ctx context.Context, adm *kadm.Client, m *progressMark) (bool, error) {
	committed, err := adm.FetchOffsets(ctx, s.p.Kafka.Group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return false, fmt.Errorf("persist: committed offsets of %s: %w", s.p.Kafka.Group, err)
	}
	for p, end := range m.ends {
		if end == 0 {
			continue
		}
		if c, ok := committed.Lookup(s.p.Kafka.Topic, p); !ok || c.At < end {
			return false, nil
		}
	}
	return true, nil
}

// publishProgress writes the time to every configured tenant's key (each
// under its tenant's hash tag, where the tenant's fences are).
func (s *Service) publishProgress(ctx context.Context, at time.Time) error {
	ms := strconv.FormatInt(at.UnixMilli(), 10)
	var cmds rueidis.Commands
	for _, t := range s.p.Tenants() {
		keys, err := s.p.KeySpace.Tenant(t)
		if err != nil {
			continue
		}
		cmds = append(cmds, s.p.Redis.B().Set().Key(keys.PersistedBefore()).Value(ms).Build())
	}
	for _, r := range s.p.Redis.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("persist: publish progress: %w", err)
		}
	}
	s.m.progress.Set(float64(at.UnixMilli()) / 1000)
	return nil
}
