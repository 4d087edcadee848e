package readpath

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// An archived month (catalog status archived) is read from its archive
// object, never from its table: the catalog status alone decides the
// tier, so a month is answered by one of them whatever step an archive or
// a restore stopped at. The read path knows archives only through
// ColdMonths (modules/archive implements it; app wires it) and applies to
// their rows what a month table's statement applies: seq bounds, order,
// deleted-for-everyone rows, the caller's deletion ranges, the limit; the
// retention floor and the rest are applied after either tier alike. The
// changes of archived messages (recall, edit, delete for everyone) are in
// the month's overlay (routing.LoadOverlay), put over the archive's rows
// before anything else looks at them.

// ColdRange is one archived month's share of a read: the rows of Topic
// with Lo <= seq <= Hi, in seq order (descending when Desc), at most Limit
// of those Keep accepts.
type ColdRange struct {
	Topic  string
	Lo, Hi int64
	Desc   bool
	Limit  int
	// Patch, when set, changes each row before Keep sees it (the month's
	// overlay)
	Patch func(*Row)
	Keep  func(*Row) bool
}

// ColdMonths reads archived months.
type ColdMonths interface {
	// Rows lists what r asks of tenant's archived month m.
	Rows(ctx context.Context, tenant string, m routing.Month, r ColdRange) ([]Row, error)
	// RowsAt are the rows of refs (sorted by topic and seq) the month
	// holds, in refs' order.
	RowsAt(ctx context.Context, tenant string, m routing.Month, refs []routing.MessageRef) ([]Row, error)
	// ByID is the row of message id in the month, if it holds it.
	ByID(ctx context.Context, tenant string, m routing.Month, id int64) (Row, bool, error)
	// IDRange is the month's lowest and highest message id (ok false: no
	// rows).
	IDRange(ctx context.Context, tenant string, m routing.Month) (lo, hi int64, ok bool, err error)
}

// ErrNoColdTier answers a read of an archived month in a process built
// without an archive reader.
var ErrNoColdTier = errors.New("readpath: the month is archived and no archive reader is configured")

// Archived reports whether tenant's month m is read from its archive.
func (s *Reader) Archived(ctx context.Context, tenant string, m routing.Month) (bool, error) {
	_, st, err := s.p.Catalog.Table(ctx, tenant, m)
	if err != nil {
		return false, err
	}
	if st == routing.StatusArchived && s.p.Cold == nil {
		return true, ErrNoColdTier
	}
	return st == routing.StatusArchived, nil
}

// coldList is a list query's share of an archived month, filtered as
// ListQuery.build filters a table's rows.
func (s *Reader) coldList(ctx context.Context, db *sql.DB, tenant string, m routing.Month, q ListQuery) ([]message.Message, error) {
	var match func(*Row) bool
	if q.Match != nil {
		var err error
		if match, err = q.Match.rows(); err != nil {
			return nil, err
		}
	}
	r := ColdRange{Topic: q.Topic, Lo: math.MinInt64, Hi: math.MaxInt64, Desc: q.Order == Desc, Limit: q.Limit}
	if q.Order == Desc {
		r.Hi = q.Bound - 1
		if q.Floor > 0 {
			r.Lo = q.Floor + 1
		}
	} else {
		r.Lo = q.Bound + 1
		r.Hi = q.UpTo
	}
	if r.Lo > r.Hi {
		return nil, nil
	}
	// the caller's deletion ranges and the month's overlay are read from
	// MySQL while the archive's rows are fetched; Patch and Keep wait for
	// them, and the read fails with their error
	type mysqlSide struct {
		hidden Hidden
		patch  func(*Row)
		err    error
	}
	ch := make(chan mysqlSide, 1)
	go func() {
		var sd mysqlSide
		if sd.hidden, sd.err = s.coldHidden(ctx, db, q.Topic, q.User, r.Lo, q.HidNothing); sd.err == nil {
			sd.patch, sd.err = s.overlay(ctx, db, tenant, m, q.Topic, r.Lo, r.Hi)
		}
		ch <- sd
	}()
	side := sync.OnceValue(func() mysqlSide { return <-ch })
	r.Patch = func(row *Row) {
		if p := side().patch; p != nil {
			p(row)
		}
	}
	r.Keep = func(row *Row) bool {
		sd := side()
		return sd.err == nil && (q.KeepDeleted || row.Status != message.StatusDeleted) && !sd.hidden.Hides(row.Seq) && (match == nil || match(row))
	}
	rows, err := s.p.Cold.Rows(ctx, tenant, m, r)
	if err := errors.Join(err, side().err); err != nil {
		return nil, err
	}
	s.m.coldReads.Inc()
	return messagesOf(rows)
}

// overlay puts month m's overlay rows of topic with lo <= seq <= hi over
// the archive's rows (nil: there are none). A month the tenant's set of
// overlaid months does not list (routing.MayHaveOverlay) is not looked
// for in MySQL; one it lists is remembered, and read from MySQL from then
// on. Redis failing, MySQL is asked.
func (s *Reader) overlay(ctx context.Context, db *sql.DB, tenant string, m routing.Month, topic string, lo, hi int64) (func(*Row), error) {
	tm := tenant + "/" + m.String()
	if _, known := s.overlaid.Load(tm); !known {
		may := true
		keys, err := s.p.KeySpace.Tenant(tenant)
		if err == nil {
			may, err = routing.MayHaveOverlay(ctx, s.p.Redis, keys, db, m)
		}
		switch {
		case err != nil:
			s.m.overlay.WithLabelValues(overlayError).Inc()
		case !may:
			s.m.overlay.WithLabelValues(overlaySkipped).Inc()
			return nil, nil
		default:
			s.overlaid.Store(tm, true)
		}
	}
	s.m.overlay.WithLabelValues(overlayRead).Inc()
	ov, err := routing.LoadOverlay(ctx, db, m, topic, lo, hi)
	if err != nil || len(ov) == 0 {
		return nil, err
	}
	return func(r *Row) {
		if o, ok := ov[r.Seq]; ok {
			Overlaid(r, o)
		}
	}, nil
}

// MarkOverlay records that tenant's months are about to have overlay
// rows (routing.MarkOverlay): a change calls it before the transaction
// that seeds them commits.
func (s *Reader) MarkOverlay(ctx context.Context, tenant string, months []routing.Month) error {
	keys, err := s.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	return routing.MarkOverlay(ctx, s.p.Redis, keys, months)
}

// Overlaid puts an overlay row (a change of the archived message r) over r.
func Overlaid(r *Row, o routing.OverlayRow) {
	r.Status, r.Content, r.Head, r.Version, r.UpdatedAt = o.Status, o.Content, o.Head, o.Version, o.UpdatedAt
}

// ArchiveRows are the rows of refs (sorted by topic and seq) in archived
// month m as the archive holds them (no overlay), in refs' order; a
// message the month does not hold is left out.
func (s *Reader) ArchiveRows(ctx context.Context, tenant string, m routing.Month, refs []routing.MessageRef) ([]Row, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	if s.p.Cold == nil {
		return nil, ErrNoColdTier
	}
	return s.p.Cold.RowsAt(ctx, tenant, m, refs)
}

// coldHidden is the caller's deletion ranges of topic reaching above lo
// (none when the caller is known to have none).
func (s *Reader) coldHidden(ctx context.Context, db *sql.DB, topic string, user, lo int64, none bool) (Hidden, error) {
	if none {
		return nil, nil
	}
	return s.st.HiddenRanges(ctx, db, topic, user, lo, 0)
}

// OneIn reads (topic, seq) from month table t, or from its archive when
// the month is archived, unless the caller hid it.
func (s *Reader) OneIn(ctx context.Context, db *sql.DB, tenant string, t routing.Table, topic string, user, seq int64) (message.Message, bool, error) {
	cold, err := s.Archived(ctx, tenant, t.Month())
	if err != nil || !cold {
		if err != nil {
			return message.Message{}, false, err
		}
		return s.st.One(ctx, db, t.Quoted(), topic, user, seq)
	}
	hidden, err := s.coldHidden(ctx, db, topic, user, seq, false)
	if err != nil || hidden.Hides(seq) {
		return message.Message{}, false, err
	}
	patch, err := s.overlay(ctx, db, tenant, t.Month(), topic, seq, seq)
	if err != nil {
		return message.Message{}, false, err
	}
	rows, err := s.p.Cold.Rows(ctx, tenant, t.Month(), ColdRange{Topic: topic, Lo: seq, Hi: seq, Limit: 1, Patch: patch})
	if err != nil || len(rows) == 0 {
		return message.Message{}, false, err
	}
	s.m.coldReads.Inc()
	m, err := rows[0].Message()
	return m, err == nil, err
}

// ByIDIn reads message id from month table t, or from its archive when
// the month is archived.
func (s *Reader) ByIDIn(ctx context.Context, db *sql.DB, tenant string, t routing.Table, id int64) (message.Message, bool, error) {
	cold, err := s.Archived(ctx, tenant, t.Month())
	if err != nil {
		return message.Message{}, false, err
	}
	if !cold {
		ms, err := s.st.Messages(ctx, db, SelectByID(t.Quoted(), id))
		if err != nil || len(ms) == 0 {
			return message.Message{}, false, err
		}
		return ms[0], true, nil
	}
	row, ok, err := s.p.Cold.ByID(ctx, tenant, t.Month(), id)
	if err != nil || !ok {
		return message.Message{}, false, err
	}
	patch, err := s.overlay(ctx, db, tenant, t.Month(), row.Topic, row.Seq, row.Seq)
	if err != nil {
		return message.Message{}, false, err
	}
	if patch != nil {
		patch(&row)
	}
	s.m.coldReads.Inc()
	m, err := row.Message()
	return m, err == nil, err
}

// IDRangeIn is month table t's lowest and highest message id (ok false:
// the month holds no rows), from the archive's manifest when the month is
// archived.
func (s *Reader) IDRangeIn(ctx context.Context, db *sql.DB, tenant string, t routing.Table) (lo, hi int64, ok bool, err error) {
	cold, err := s.Archived(ctx, tenant, t.Month())
	if err != nil {
		return 0, 0, false, err
	}
	if cold {
		return s.p.Cold.IDRange(ctx, tenant, t.Month())
	}
	var l, h sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MIN(message_id), MAX(message_id) FROM "+t.Quoted()).Scan(&l, &h); err != nil {
		return 0, 0, false, fmt.Errorf("readpath: message ids of %s: %w", t.Name(), err)
	}
	return l.Int64, h.Int64, l.Valid, nil
}

// rows is the search's condition on rows, as ListQuery.build states it in
// SQL: a normal message created in [From, To) whose content's text
// (JSON_UNQUOTE(JSON_EXTRACT(content, '$.text')), compared as utf8mb4_bin:
// case-sensitive, a character per _) is LIKE the pattern, ESCAPE '!'.
func (m *TextMatch) rows() (func(*Row) bool, error) {
	re, err := likeRegexp(m.Like)
	if err != nil {
		return nil, err
	}
	return func(row *Row) bool {
		if row.Status != message.StatusNormal || row.CreatedAt.Before(m.From) || !row.CreatedAt.Before(m.To) {
			return false
		}
		var doc map[string]json.RawMessage
		if json.Unmarshal(row.Content, &doc) != nil {
			return false
		}
		raw, ok := doc["text"]
		if !ok || string(raw) == "null" {
			return false // NULL is LIKE nothing
		}
		text := string(raw)
		var str string
		if json.Unmarshal(raw, &str) == nil {
			text = str
		}
		return re.MatchString(text)
	}, nil
}

// likeRegexp is a LIKE pattern with ESCAPE '!' as an anchored regexp.
func likeRegexp(pattern string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString(`(?s)\A`)
	escaped := false
	for _, r := range pattern {
		switch {
		case escaped:
			b.WriteString(regexp.QuoteMeta(string(r)))
			escaped = false
		case r == '!':
			escaped = true
		case r == '%':
			b.WriteString(".*")
		case r == '_':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString(`\z`)
	re, err := regexp.Compile(b.String())
	if err != nil {
		return nil, fmt.Errorf("readpath: search pattern: %w", err)
	}
	return re, nil
}

func messagesOf(rows []Row) ([]message.Message, error) {
	out := make([]message.Message, 0, len(rows))
	for i := range rows {
		m, err := rows[i].Message()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}
