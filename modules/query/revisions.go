package query

import (
	sq "github.com/Masterminds/squirrel"

	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
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
	var out readpath.Changes
	err = sq.Select("change_seq").From(readpath.TopicChangesTable).Where(sq.Eq{"topic": topic}).
		RunWith(db).QueryRowContext(ctx).Scan(&out.Last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return readpath.Changes{}, fmt.Errorf("query: topic changes: %w", err)
	}
	if out.Last <= after {
		return out, nil
	}
	rows, err := sq.Select("change_seq", "seqid", "message_id", "action", "version", "actor", "created_at").
		From(readpath.RevisionsTable).Where(sq.And{sq.Eq{"topic": topic}, sq.Gt{"change_seq": after}}).
		OrderBy("change_seq").Limit(uint64(limit) + 1).RunWith(db).QueryContext(ctx)
	if err != nil {
		return readpath.Changes{}, fmt.Errorf("query: changes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		c := message.Change{Topic: topic}
		var id, actor int64
		if err := rows.Scan(&c.ChangeSeq, &c.Seq, &id, &c.Action, &c.Version, &actor, &c.At.Time); err != nil {
			return readpath.Changes{}, fmt.Errorf("query: changes: %w", err)
		}
		c.MessageID, c.Actor, c.At = message.ID(id), message.ID(actor), message.NewTime(c.At.Time)
		out.Changes = append(out.Changes, c)
	}
	if len(out.Changes) > limit {
		out.Changes, out.More = out.Changes[:limit], true
	}
	return out, rows.Err()
}
