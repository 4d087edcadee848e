package changes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

// Hide records that p no longer sees topic's seqs [low, hi) (POST
// …/deletions, DELETE …/messages/{seq}?scope=me). The range must lie
// within the seqs issued so far: a hide never reaches messages not sent
// yet. The cache entry is invalidated before and after the insert, and a
// failure is returned rather than reporting a hide the cache may not show.
func (s *Service) Hide(ctx context.Context, p httpapi.Principal, topic string, low, hi int64) error {
	if err := s.r.Authorize(ctx, p, topic); err != nil {
		return err
	}
	if low < 1 || hi <= low {
		return httpapi.Errorf(httpapi.CodeInvalidArgument, "a deletion range needs 1 <= low < hi")
	}
	keys, db, err := s.r.Open(ctx, p, topic)
	if err != nil {
		return err
	}
	last, err := s.lastSeq(ctx, keys, p.Tenant, topic)
	if err != nil {
		return err
	}
	if hi > last+1 {
		return httpapi.Errorf(httpapi.CodeInvalidArgument,
			fmt.Sprintf("hi %d is past the topic's last seq %d + 1: a deletion range cannot reach messages not sent yet", hi, last))
	}
	if err := s.r.InvalidateHidden(ctx, keys, topic, p.UserID); err != nil {
		return err
	}
	if err := s.addHidden(ctx, db, topic, p.UserID, low, hi); err != nil {
		return err
	}
	// the caller's unread count and last message of the topic may change:
	// their devices' next sync reports the topic
	if err := acl.TouchReadState(ctx, db, p.UserID, topic); err != nil {
		return httpapi.Wrap(httpapi.CodeUnavailable, "read state store unavailable", err)
	}
	return s.r.InvalidateHidden(ctx, keys, topic, p.UserID)
}

// addHidden records the range, merged with the caller's ranges it
// overlaps or touches (readpath.AddHiddenRange), in a transaction run again
// after a deadlock: two hides of one caller that find no range of theirs
// both insert into the same gap.
func (s *Service) addHidden(ctx context.Context, db *sql.DB, topic string, user, low, hi int64) error {
	for attempt := 1; ; attempt++ {
		err := hideTx(ctx, db, topic, user, low, hi)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, readpath.ErrTooManyHidden):
			return httpapi.Errorf(httpapi.CodeConflict, fmt.Sprintf(
				"this range would leave more than %d separate deletion ranges in the topic; hide a range that joins some of them",
				readpath.MaxHiddenRanges)).WithDetails(map[string]any{"max_ranges": readpath.MaxHiddenRanges})
		case errors.Is(err, routing.ErrPlacementMoved):
			return err // 409 tenant_moving (modules/httpapi)
		case !tenantdb.IsDeadlock(err) || attempt == maxChangeAttempts:
			return httpapi.Wrap(httpapi.CodeUnavailable, "deletion store unavailable", err)
		}
	}
}

func hideTx(ctx context.Context, db *sql.DB, topic string, user, low, hi int64) error {
	return routing.Fenced(ctx, db, func(tx *sql.Tx) error { return readpath.AddHiddenRange(ctx, tx, topic, user, low, hi) })
}

// lastSeq is the topic's last issued seq: the Redis counter, or, when Redis
// lost it, the highest seq the topic's route knows.
func (s *Service) lastSeq(ctx context.Context, keys routing.Keys, tenant, topic string) (int64, error) {
	return s.lastSeqResolve(ctx, tenant, topic, s.p.Redis.Do(ctx, s.p.Redis.B().Get().Key(keys.Seq(topic)).Build()))
}

// lastSeqResolve finishes lastSeq from the counter's GET, pipelined by a
// caller with reads of its own.
func (s *Service) lastSeqResolve(ctx context.Context, tenant, topic string, res rueidis.RedisResult) (int64, error) {
	last, err := res.AsInt64()
	if err == nil {
		return last, nil
	}
	if !rueidis.IsRedisNil(err) {
		return 0, httpapi.Wrap(httpapi.CodeUnavailable, "seq counter unavailable", err)
	}
	tr, err := s.p.Router.Route(ctx, tenant, topic)
	if err != nil {
		return 0, err
	}
	return tr.MaxSeq(), nil
}
