package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/imshard/imshard/modules/routing"
)

// legacyBranches is how many topics one statement of legacyNewest reads: a
// statement of fixed shape (absent topics pad it) is prepared once and
// reused.
const legacyBranches = 128

// legacyNewestQuery reads, for each of legacyBranches topics, the
// created_at of its newest legacy row (by seq, through the (topic, seqid)
// index: the legacy table may lack one led by created_at) up to the seq
// the legacy table answers for and created at or before a moment.
var legacyNewestQuery = strings.TrimSuffix(strings.Repeat("(SELECT ? AS i, l.created_at FROM "+routing.LegacyQuoted()+
	" AS l WHERE l.topic = ? AND l.seqid <= ? AND l.created_at <= ? ORDER BY l.seqid DESC LIMIT 1) UNION ALL ", legacyBranches), " UNION ALL ")

// legacyActivity sets, while the tenant migrates, the legacy activity of
// each of us whose route mirror holds no message: its newest legacy row
// created at or before snap. The mirror learns the legacy rows only in the
// pass after the copy, and until then such a topic would sort by when the
// caller joined; with it, the topic list orders it by its messages, as it
// will once the mirror is built.
func (s *Service) legacyActivity(ctx context.Context, db *sql.DB, tenant string, us []userTopic, snap time.Time) error {
	var idx []int
	var his []int64
	for i, u := range us {
		if !u.mirror.LastAt().IsZero() || !u.legacyAt.IsZero() {
			continue
		}
		leg, err := s.p.Migrations.Legacy(ctx, tenant, u.topic)
		if err != nil {
			return err
		}
		if leg.Hi > 0 {
			idx, his = append(idx, i), append(his, leg.Hi)
		}
	}
	var mu sync.Mutex
	return parallel(ctx, (len(idx)+legacyBranches-1)/legacyBranches, func(j int) error {
		args := make([]any, 0, 4*legacyBranches)
		for k := j * legacyBranches; k < (j+1)*legacyBranches; k++ {
			if k < len(idx) {
				args = append(args, idx[k], us[idx[k]].topic, his[k], snap.UTC())
			} else {
				args = append(args, -1, "", 0, snap.UTC()) // matches no row
			}
		}
		rows, err := s.st.Run(ctx, db, legacyNewestQuery, args)
		if err != nil {
			return fmt.Errorf("inbox: legacy activity: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var i int
			var at time.Time
			if err := rows.Scan(&i, &at); err != nil {
				return err
			}
			mu.Lock()
			us[i].legacyAt = at
			mu.Unlock()
		}
		return rows.Err()
	})
}
