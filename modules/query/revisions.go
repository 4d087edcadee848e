package query

import (
	"context"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/readpath"
)

// ChangesSince reads up to limit changes of topic with change_seq > after
// from the revisions (kept as long as the tenant's data), for members of
// the topic and admins: how a follower that missed change events catches
// up.
func (s *Service) ChangesSince(ctx context.Context, p httpapi.Principal, topic string, after int64, limit int) (readpath.Changes, error) {
	if err := s.r.Authorize(ctx, p, topic); err != nil {
		return readpath.Changes{}, err
	}
	db, err := s.p.DBs.DB(ctx, p.Tenant)
	if err != nil {
		return readpath.Changes{}, err
	}
	return readpath.ChangesAfter(ctx, db, topic, after, limit)
}
