package persist

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/modules/routing"
)

// Dead-letter record headers: why and where from, for `imshard dlq list`.
const (
	HeaderReason = "imshard-reason"
	HeaderError  = "imshard-error"
	HeaderSource = "imshard-source" // topic/partition/offset of the original
	HeaderTenant = "imshard-tenant"
	HeaderAt     = "imshard-failed-at"
)

// Dead-letter reasons.
const (
	reasonMalformed = "malformed"
)

// deadLetter sends recs to the dead-letter topic with the reason, retrying
// until the broker has them (they are never dropped), then marks them done.
func (s *Service) deadLetter(ctx context.Context, recs []*record, reason string, cause error) {
	errText := ""
	if cause != nil {
		errText = truncate(cause.Error(), 1000)
	}
	at := time.Now().UTC().Format(time.RFC3339Nano)
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		tenant := tenantOfKey(r.key)
		if r.ev != nil {
			tenant = r.ev.Tenant
		}
		out[i] = &kgo.Record{Topic: s.p.Kafka.DLQTopic, Key: r.key, Value: r.value, Headers: []kgo.RecordHeader{
			{Key: HeaderReason, Value: []byte(reason)},
			{Key: HeaderError, Value: []byte(errText)},
			{Key: HeaderSource, Value: []byte(s.p.Kafka.Topic + "/" + strconv.Itoa(int(r.partition)) + "/" + strconv.FormatInt(r.offset, 10))},
			{Key: HeaderTenant, Value: []byte(tenant)},
			{Key: HeaderAt, Value: []byte(at)},
		}}
	}
	for n := 0; ; n++ {
		err := s.cl.ProduceSync(ctx, out...).FirstErr()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		s.p.Log.Warn().Err(err).Int("events", len(out)).Msg("persist: dead-letter produce failed; retrying")
		if !sleep(ctx, s.retryDelay(n)) {
			return
		}
	}
	s.m.deadLetter.WithLabelValues(reason).Add(float64(len(recs)))
	// a tenant this deployment does not serve has no readers to unblock and
	// no key space: a gap would write Redis keys for any tenant id an
	// event names
	served := reason != fatal.String()
	noted := map[string][]routing.DeadLetterRow{}
	for _, r := range recs {
		month := ""
		if r.ev != nil {
			month = r.month.String()
			if served {
				s.gap(ctx, r)
				noted[r.ev.Tenant] = append(noted[r.ev.Tenant], routing.DeadLetterRow{Topic: r.ev.Topic, Seq: r.ev.SeqID, Month: r.month, Reason: reason})
			}
		}
		s.m.persisted.WithLabelValues(month, statusDeadLetter).Inc()
	}
	for tenant, rows := range noted {
		s.noteDeadLetters(ctx, tenant, rows)
	}
	s.p.Log.Error().Str("reason", reason).Str("error", errText).Int("events", len(recs)).Msg("persist: events sent to the dead-letter topic")
	s.finish(recs)
}

// noteDeadLetterAttempts bounds how often persist tries to note dead
// letters in the tenant's database before it gives up with an error log.
const noteDeadLetterAttempts = 3

// noteDeadLetters records the tenant's dead-lettered events in its
// database, where sealing a month looks for them: a month with a dead
// letter not stored since is not sealed (routing.ProveComplete).
func (s *Service) noteDeadLetters(ctx context.Context, tenant string, rows []routing.DeadLetterRow) {
	var err error
	for n := 0; n < noteDeadLetterAttempts; n++ {
		var db *sql.DB
		if db, err = s.p.DBs.DB(ctx, tenant); err == nil {
			if err = routing.RecordDeadLetters(ctx, db, rows); err == nil {
				return
			}
		}
		if !sleep(ctx, s.retryDelay(n)) {
			break
		}
	}
	s.m.deadLetterUnnoted.Add(float64(len(rows)))
	s.p.Log.Error().Err(err).Str("tenant", tenant).Int("events", len(rows)).
		Msg("persist: dead letters not noted in the tenant database; a seal will not see them (check imshard dlq list before sealing)")
}

// gap records a seq that has no row (dead-lettered, compensated, duplicate)
// so readers' settled watermark does not wait for it (invariant 12, docs/invariants.md);
// a later replay that stores it makes it visible again.
func (s *Service) gap(ctx context.Context, r *record) {
	rctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	if err := s.p.Flight.RecordGap(rctx, r.ev.Tenant, r.ev.Topic, r.ev.SeqID); err != nil {
		s.p.Log.Warn().Err(err).Str("tenant", r.ev.Tenant).Str("topic", r.ev.Topic).Msg("persist: record gap failed")
	}
}

// compensate queues events of a sealed month in the tenant's compensation
// table, byte for byte, until an operator unseals the month
// and replays them with `imshard dlq replay`.
func (s *Service) compensate(ctx context.Context, key batchKey, recs []*record, status routing.Status) error {
	db, err := s.p.DBs.DB(ctx, key.tenant)
	if err != nil {
		return err
	}
	q := sq.Insert(compensationTable).Columns("event_id", "topic", "seqid", "shard_month", "event", "reason")
	for _, r := range recs {
		q = q.Values(r.ev.EventID, r.ev.Topic, r.ev.SeqID, key.month.String(), r.value, "month "+string(status))
	}
	if err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		_, err := q.Suffix("ON DUPLICATE KEY UPDATE status = 'pending', reason = VALUES(reason)").
			RunWith(tx).ExecContext(ctx)
		return err
	}); err != nil {
		return err
	}
	for _, r := range recs {
		s.gap(ctx, r)
	}
	s.m.persisted.WithLabelValues(key.month.String(), statusCompensated).Add(float64(len(recs)))
	s.m.lateEvents.WithLabelValues(key.tenant).Add(float64(len(recs)))
	s.p.Log.Error().Str("tenant", key.tenant).Str("month", key.month.String()).Int("events", len(recs)).
		Msg("persist: late events for a sealed month queued for compensation; replay them with imshard dlq replay --tenant --month")
	s.finish(recs)
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// tenantOfKey is the tenant of a record key "tenant/topic" when it is a
// valid tenant id: a malformed event is still listed under its tenant.
func tenantOfKey(key []byte) string {
	t, _, ok := strings.Cut(string(key), "/")
	if !ok || routing.ValidTenant(t) != nil {
		return ""
	}
	return t
}
