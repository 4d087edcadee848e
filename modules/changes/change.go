package changes

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/feed"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/readpath"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
	"github.com/imshard/imshard/modules/testhook"
)

// The message-change path: recall, edit and delete for everyone, for a
// message in any month. Every change runs the same steps (change):
//
//  1. who may change the message at all (membership, role) — before
//     anything is read or locked;
//  2. a message still in flight (acknowledged to its sender, not yet
//     stored: its seq is in the pending set and in no month table) answers
//     409 with details.retry_after_ms — never a wrong 404, never a lost
//     change; the pending set is read before the month tables, and persist
//     clears a seq there only after its row committed, so a seq in neither
//     was never stored (a stored row is changed whatever the pending set
//     still says);
//  3. one transaction: the row, locked (SELECT … FOR UPDATE) in the month
//     the routing core names; the checks that need it (sender, recall
//     window, status, expected version); the UPDATE; a recall or delete
//     drops the message's mention index entries (routing.DropMentions);
//     the topic's next change_seq (im_topic_changes); the revision row;
//     the change event the relay role produces to the change feed
//     (modules/feed: an outbox row, so the event exists exactly when the
//     change committed);
//  4. before the commit, one Redis script takes the message out of the hot
//     cache and moves the topic's message version forward, which every
//     query process's copy of the newest messages is checked against on
//     the next page — if Redis cannot be reached the transaction rolls back
//     and the answer is 503: nothing changed;
//  5. the commit, then (best effort) the changed message back into the hot
//     cache and the change event on the topic's realtime channel.

// retryAfter is what a change of a message still in flight asks the client
// to wait: persist stores a message within a batch linger and a commit of
// its acknowledgement in the normal case.
const retryAfter = 250 * time.Millisecond

// MaxReason is the longest reason a change may record (VARCHAR(255)).
const MaxReason = 255

// ChangeResult is the answer of a change: the message as it is now (a
// tombstone after a recall or delete) and the change_seq of the change, 0
// (left out) when a repeated recall or delete changed nothing.
type ChangeResult struct {
	Message   message.Message `json:"message"`
	ChangeSeq int64           `json:"change_seq,omitempty"`
}

// changeReq is one change past its request's validation.
type changeReq struct {
	tenant string
	action string
	topic  string
	seq    int64
	actor  int64 // recorded in the revision: the caller, or the member a service token acts for
	reason string
	// anyTime: the caller may recall any message at any time (group
	// owner/admin, admin and service tokens); otherwise only their own,
	// within the recall window
	anyTime bool
	// edit
	content, head json.RawMessage // head nil: keep it
	expected      int
}

// Recall withdraws a message: its sender within send.recall_window; a
// group owner or admin, and admin or service tokens, at any time; members
// of a dissolved group not at all. A repeated recall answers the
// tombstone again.
func (s *Service) Recall(ctx context.Context, p httpapi.Principal, topic string, seq int64, reason string) (ChangeResult, error) {
	c := changeReq{action: message.ActionRecall, topic: topic, seq: seq, actor: p.UserID, reason: reason}
	if p.Role == httpapi.RoleAdmin || p.Role == httpapi.RoleService {
		c.anyTime = true
	} else {
		m, err := s.member(ctx, p.Tenant, topic, p.UserID)
		if err != nil {
			return ChangeResult{}, err
		}
		// a dissolved group takes nothing more from its members; a mute
		// forbids new text, not taking one's own back
		if m.GroupStatus == acl.GroupDissolved {
			return ChangeResult{}, acl.ErrDissolved
		}
		c.anyTime = m.Role == acl.RoleOwner || m.Role == acl.RoleAdmin
	}
	return s.change(ctx, p, c)
}

// EditRequest is the body of PATCH /v1/topics/{topic}/messages/{seq}.
type EditRequest struct {
	Content         json.RawMessage `json:"content"`
	Head            json.RawMessage `json:"head"`
	ExpectedVersion *int            `json:"expected_version"`
	FromUser        *message.ID     `json:"from_user"`
}

// Edit replaces a message's content (and head, when given): only its
// sender, or a service token acting for the sender (from_user), while the
// sender may post (acl.Membership.PostRefusal) and expected_version is the
// message's version.
func (s *Service) Edit(ctx context.Context, p httpapi.Principal, topic string, seq int64, req EditRequest) (ChangeResult, error) {
	actor := p.UserID
	switch {
	case req.FromUser != nil && p.Role != httpapi.RoleService:
		return ChangeResult{}, readpath.Invalid("from_user may be set only by the service role")
	case req.FromUser != nil:
		actor = int64(*req.FromUser)
	case p.Role != httpapi.RoleUser:
		return ChangeResult{}, httpapi.Errorf(httpapi.CodePermissionDenied, "only the sender may edit a message (a service token names the sender in from_user)")
	}
	m, err := s.member(ctx, p.Tenant, topic, actor)
	if err != nil {
		return ChangeResult{}, err
	}
	// an edit puts new text in the group as a send does: a muted member, or
	// one of a dissolved group, is refused as their send would be
	if err := m.PostRefusal(time.Now()); err != nil {
		return ChangeResult{}, err
	}
	return s.change(ctx, p, changeReq{action: message.ActionEdit, topic: topic, seq: seq, actor: actor,
		content: req.Content, head: req.Head, expected: *req.ExpectedVersion})
}

// DeleteAll deletes a message for everyone (role admin only): status
// deleted, content and head cleared. A repeated delete answers the
// tombstone again.
func (s *Service) DeleteAll(ctx context.Context, p httpapi.Principal, topic string, seq int64, reason string) (ChangeResult, error) {
	if p.Role != httpapi.RoleAdmin {
		return ChangeResult{}, httpapi.Errorf(httpapi.CodePermissionDenied, "deleting a message for everyone needs the admin role")
	}
	return s.change(ctx, p, changeReq{action: message.ActionDelete, topic: topic, seq: seq, actor: p.UserID, reason: reason})
}

// member is the caller's membership of topic; anyone else is refused.
func (s *Service) member(ctx context.Context, tenant, topic string, user int64) (acl.Membership, error) {
	if err := routing.ValidTopic(topic); err != nil {
		return acl.Membership{}, err
	}
	m, err := s.p.ACL.Lookup(ctx, tenant, topic, user)
	if err := acl.Allowed(m, err); err != nil {
		return acl.Membership{}, err
	}
	return m, nil
}

// counted runs one change request — its parsing included — and counts it
// by action and result.
func (s *Service) counted(action string, fn func() (ChangeResult, error)) (ChangeResult, error) {
	start := time.Now()
	res, err := fn()
	result := changeOK
	var e *httpapi.Error
	switch {
	case errors.As(err, &e) && e.Details["retry_after_ms"] != nil && e.Details["reason"] == nil:
		result = changeInFlight
	case err != nil:
		result, _ = httpapi.Classify(err)
	case res.ChangeSeq == 0:
		result = changeUnchanged
	}
	s.m.changes.WithLabelValues(action, result).Inc()
	s.m.changeLatency.WithLabelValues(action).Observe(time.Since(start).Seconds())
	return res, err
}

// change runs steps 2 to 5 of a change whose caller may change messages of
// the topic at all.
func (s *Service) change(ctx context.Context, p httpapi.Principal, c changeReq) (ChangeResult, error) {
	// 503 while a migration refuses changes: this process's copy, then the
	// gate in Redis the migrate commands set
	if err := s.p.Migrations.GateChange(ctx, p.Tenant); err != nil {
		return ChangeResult{}, err
	}
	c.tenant = p.Tenant
	keys, db, err := s.r.Open(ctx, p, c.topic)
	if err != nil {
		return ChangeResult{}, err
	}
	// the pending set is read before the month tables (see step 2), in one
	// round trip with the route
	flight := s.p.Flight.InFlightCmds(keys, c.topic, c.seq)
	res := s.p.Redis.DoMulti(ctx, append(flight, s.p.Router.RouteCmds(keys, c.topic)...)...)
	flying, err := s.p.Flight.InFlightResolve(ctx, p.Tenant, c.topic, c.seq, res[:len(flight)])
	if err != nil {
		return ChangeResult{}, httpapi.Wrap(httpapi.CodeUnavailable, "in-flight check unavailable", err)
	}
	tr, err := s.p.Router.RouteResolve(ctx, p.Tenant, c.topic, res[len(flight):])
	if err != nil {
		return ChangeResult{}, err
	}
	tables, legacy, err := s.changeTables(ctx, db, p.Tenant, tr, c)
	if err != nil {
		return ChangeResult{}, err
	}
	for attempt := 1; ; attempt++ {
		res, err := s.changeTx(ctx, db, keys, tables, c, flying, legacy)
		// a deadlock rolled the transaction back before the caches were
		// told (its statements come first): run it again
		if !tenantdb.IsDeadlock(err) || attempt == maxChangeAttempts {
			return res, err
		}
	}
}

// changeTables are the month tables that may hold the changed message,
// most likely first. After cutover a seq the legacy table still answers
// for (up to the topic's cutover_seq, until finish) is changed in the
// month its recorded splits assign it, copied there from the legacy table
// first and written in both (legacy true): the dual read reads it from the
// legacy table, the backfill finds it present, the verification equal.
func (s *Service) changeTables(ctx context.Context, db *sql.DB, tenant string, tr routing.TopicRoute, c changeReq) ([]routing.Table, bool, error) {
	if !tr.Legacy.Split || c.seq > tr.Legacy.Hi {
		tables, err := s.p.Router.Tables(ctx, tenant, tr.BySeq(c.seq))
		return tables, false, err
	}
	m, err := routing.LegacyMonth(ctx, db, c.topic, c.seq)
	if err != nil {
		return nil, false, err
	}
	tables, err := s.p.Router.Tables(ctx, tenant, []routing.Month{m})
	if err != nil || len(tables) == 0 {
		return nil, false, errors.Join(err, readpath.ErrNotFound)
	}
	return tables, true, nil
}

// monthArchived answers a change of a message in an archived month: the
// archive is never rewritten in place, and nothing changed.
func monthArchived() error {
	return httpapi.Errorf(httpapi.CodeConflict, "the message's month is archived; archived messages cannot be changed").
		WithDetails(map[string]any{"reason": "month_archived"})
}

// monthRestoring answers a change of a month just restored from its
// archive: it is retried once every process reads the month from its table
// again (routing.RestoreSettle), and nothing changed.
func monthRestoring() error {
	return httpapi.Errorf(httpapi.CodeConflict, "the message's month was just restored from its archive; retry after retry_after_ms").
		WithDetails(map[string]any{"reason": "month_restoring", "retry_after_ms": routing.RestoreSettle.Milliseconds()})
}

// maxChangeAttempts is how often a change's transaction runs when MySQL
// resolves deadlocks against it.
const maxChangeAttempts = 3

// errUnchanged rolls back a change that changes nothing (the message is
// already as asked): a legacy row copied for it stays where it was.
var errUnchanged = errors.New("changes: nothing to change")

// changeTx is steps 3 to 5 of a change, in a fenced transaction
// (routing.Fenced: the placement fence is its first statement, so its
// shared lock covers the whole transaction; a refusal answers 409
// tenant_moving, modules/httpapi).
func (s *Service) changeTx(ctx context.Context, db *sql.DB, keys routing.Keys, tables []routing.Table, c changeReq, flying, legacy bool) (ChangeResult, error) {
	var w written
	err := routing.Fenced(ctx, db, func(tx *sql.Tx) error {
		var err error
		w, err = s.changeIn(ctx, tx, keys, tables, c, flying, legacy)
		return err
	})
	var e *httpapi.Error
	switch {
	case errors.Is(err, errUnchanged):
		return ChangeResult{Message: w.old}, nil
	case err == nil:
	case errors.As(err, &e), errors.Is(err, routing.ErrPlacementMoved), errors.Is(err, readpath.ErrNotFound):
		return ChangeResult{}, err
	default: // begin or commit
		return ChangeResult{}, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable: the change may not have been applied, retry", err)
	}
	s.afterChange(context.WithoutCancel(ctx), keys, c, testhook.Break(testhook.StaleVersion, w.old, w.next), w.changeSeq, w.version)
	return ChangeResult{Message: w.next, ChangeSeq: w.changeSeq}, nil
}

// written is what a change's transaction wrote, for what follows its
// commit.
type written struct {
	old, next message.Message
	changeSeq int64
	version   string
}

func (s *Service) changeIn(ctx context.Context, tx *sql.Tx, keys routing.Keys, tables []routing.Table, c changeReq, flying, legacy bool) (written, error) {
	var w written
	// the months' catalog rows, shared: an archive's mark waits for this
	// change, and a change after the mark leaves the archived table alone
	tables, archived, err := routing.LockForChange(ctx, tx, tables)
	if errors.Is(err, routing.ErrMonthRestoring) {
		return w, monthRestoring()
	}
	if err != nil {
		return w, err
	}
	if legacy && archived {
		return w, monthArchived()
	}
	if legacy {
		found, err := routing.CopyLegacyRow(ctx, tx, tables[0], c.topic, c.seq)
		if err != nil {
			return w, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
		}
		if !found {
			return w, readpath.ErrNotFound
		}
	}
	old, table, err := lockMessage(ctx, tx, tables, c.topic, c.seq)
	if errors.Is(err, readpath.ErrNotFound) && archived {
		return w, monthArchived()
	}
	if errors.Is(err, readpath.ErrNotFound) && flying {
		return w, httpapi.Errorf(httpapi.CodeConflict,
			"the message is not stored yet (still on its way from the queue); retry after retry_after_ms").
			WithDetails(map[string]any{"retry_after_ms": retryAfter.Milliseconds()})
	}
	if err != nil {
		return w, err
	}
	w.old = old
	next, err := s.apply(c, old)
	if err != nil {
		return w, err
	}
	if next.Version == old.Version {
		return w, errUnchanged
	}
	w.next = next
	if w.changeSeq, err = writeChange(ctx, tx, table, c, old, next, legacy); err != nil {
		return w, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	w.version, err = s.p.Scripts.MsgChange.Exec(ctx, s.p.Redis,
		[]string{keys.HotMessages(c.topic), keys.MessagesVersion(c.topic)},
		[]string{strconv.FormatInt(c.seq, 10), strconv.FormatInt(routing.MessagesVersionTTL.Milliseconds(), 10)}).ToString()
	if err != nil {
		return w, httpapi.Wrap(httpapi.CodeUnavailable, "the caches cannot be told (Redis unavailable): nothing changed, retry", err)
	}
	return w, nil
}

// lockMessage reads (topic, seq) from the first of tables holding it,
// locking the row; 404 when none does.
func lockMessage(ctx context.Context, tx *sql.Tx, tables []routing.Table, topic string, seq int64) (message.Message, routing.Table, error) {
	for _, t := range tables {
		query, args, err := sq.Select(readpath.Columns...).From(t.Quoted() + " AS m").
			Where(sq.Eq{"m.topic": topic, "m.seqid": seq}).Suffix("FOR UPDATE").ToSql()
		if err != nil {
			return message.Message{}, routing.Table{}, err
		}
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return message.Message{}, routing.Table{}, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
		}
		found := rows.Next()
		var m message.Message
		if found {
			m, err = readpath.ScanMessage(rows)
		}
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return message.Message{}, routing.Table{}, err
		}
		if found {
			return m, t, nil
		}
	}
	return message.Message{}, routing.Table{}, readpath.ErrNotFound
}

// apply checks c against the locked message and returns its new state; the
// same version as old means nothing to change (a repeated recall or
// delete).
func (s *Service) apply(c changeReq, old message.Message) (message.Message, error) {
	now := message.NewTime(time.Now())
	next := old
	next.Version, next.UpdatedAt = old.Version+1, now
	switch c.action {
	case message.ActionRecall:
		if !c.anyTime {
			if int64(old.FromUser) != c.actor {
				return old, httpapi.Errorf(httpapi.CodePermissionDenied, "only the sender or a group owner or admin may recall a message")
			}
			if w := s.p.RecallWindow; now.Sub(old.CreatedAt.Time) > w {
				return old, httpapi.Errorf(httpapi.CodePermissionDenied,
					fmt.Sprintf("the recall window (send.recall_window = %s) has passed for this message", w))
			}
		}
		switch old.Status {
		case message.StatusRecalled:
			return old, nil
		case message.StatusDeleted:
			return old, httpapi.Errorf(httpapi.CodeConflict, "the message was deleted for everyone")
		}
		next.Status = message.StatusRecalled
	case message.ActionEdit:
		if int64(old.FromUser) != c.actor {
			return old, httpapi.Errorf(httpapi.CodePermissionDenied, "only the sender may edit a message")
		}
		if old.Status != message.StatusNormal {
			return old, httpapi.Errorf(httpapi.CodeConflict, "a "+old.Status+" message cannot be edited")
		}
		if old.Version != testhook.Break(testhook.CASIgnore, old.Version, c.expected) {
			return old, httpapi.Errorf(httpapi.CodeConflict, "expected_version is not the message's version (details.current_version)").
				WithDetails(map[string]any{"current_version": old.Version})
		}
		next.Content = c.content
		if c.head != nil {
			next.Head = c.head
		}
	case message.ActionDelete:
		if old.Status == message.StatusDeleted {
			return old, nil
		}
		next.Status = message.StatusDeleted
	}
	return next.Normalized(), nil
}

// writeChange updates the row to next (with legacy, the legacy table's
// row too, alike), drops the mention index entries of a message that stops
// being normal, allocates the topic's next change_seq and records the
// revision (the content and head before the change), all in tx.
func writeChange(ctx context.Context, tx *sql.Tx, t routing.Table, c changeReq, old, next message.Message, legacy bool) (int64, error) {
	at := next.UpdatedAt.Time
	up := sq.Update(t.Quoted()).Set("status", next.Status).Set("content", message.JSONColumn(next.Content)).
		Set("head", message.JSONColumn(next.Head)).Set("version", next.Version).Set("updated_at", at)
	switch c.action {
	case message.ActionRecall:
		up = up.Set("recalled_at", at).Set("recalled_by", c.actor)
	case message.ActionDelete:
		up = up.Set("deleted_at", at)
	}
	up = up.Where(sq.Eq{"topic": c.topic, "seqid": c.seq})
	if _, err := up.RunWith(tx).ExecContext(ctx); err != nil {
		return 0, err
	}
	if legacy {
		if _, err := up.Table(routing.LegacyQuoted()).RunWith(tx).ExecContext(ctx); err != nil {
			return 0, err
		}
	}
	if old.Status == message.StatusNormal && next.Status != message.StatusNormal {
		// a recalled or deleted message no longer counts in anyone's
		// mention_unread
		users := make([]int64, len(old.MentionedUserIDs))
		for i, id := range old.MentionedUserIDs {
			users[i] = int64(id)
		}
		if err := routing.DropMentions(ctx, tx, routing.MentionsOf(c.topic, c.seq, users, old.MentionAll)); err != nil {
			return 0, err
		}
	}
	changeSeq, err := readpath.NextChangeSeq(ctx, tx, c.topic)
	if err != nil {
		return 0, err
	}
	if err := readpath.RecordRevision(ctx, tx, readpath.NewRevision{
		Topic: c.topic, Month: t.Month(), Seq: c.seq, MessageID: old.MessageID, Action: c.action, Version: next.Version,
		Content: old.Content, Head: old.Head, Actor: c.actor, Reason: c.reason, ChangeSeq: changeSeq, At: at,
	}); err != nil {
		return 0, err
	}
	if err := feed.Record(ctx, tx, feed.Event{Tenant: c.tenant, Topic: c.topic, ChangeSeq: changeSeq, Action: c.action,
		SeqID: c.seq, MessageID: old.MessageID, ShardMonth: t.Month().String(), Version: next.Version,
		Actor: message.ID(c.actor), Reason: c.reason, At: next.UpdatedAt, Message: &next}); err != nil {
		return 0, err
	}
	return changeSeq, nil
}

// afterChange puts the changed message back into the hot cache (unless a
// later change moved the topic's message version on) and publishes the
// change event. Both are best effort: the change is committed and no cache
// serves its old version; a failure costs a cache miss or a missed event
// (a consumer resumes from the revisions by change_seq).
func (s *Service) afterChange(ctx context.Context, keys routing.Keys, c changeReq, next message.Message, changeSeq int64, version string) {
	ctx, cancel := context.WithTimeout(ctx, afterChangeTimeout)
	defer cancel()
	member, _ := json.Marshal(next)
	ev, _ := json.Marshal(struct {
		Type   string         `json:"type"`
		Change message.Change `json:"change"`
	}{"change", message.Change{Topic: c.topic, Seq: c.seq, MessageID: next.MessageID, Action: c.action, Version: next.Version,
		ChangeSeq: changeSeq, Actor: message.ID(c.actor), At: next.UpdatedAt}})
	rdb := s.p.Redis
	// both in one round trip: issued together, the client pipelines them
	published := make(chan error, 1)
	go func() {
		published <- rdb.Do(ctx, rdb.B().Spublish().Channel(keys.Realtime(c.topic)).Message(string(ev)).Build()).Error()
	}()
	if err := s.p.Scripts.HotPut.Exec(ctx, rdb, []string{keys.HotMessages(c.topic), keys.MessagesVersion(c.topic)},
		[]string{strconv.FormatInt(c.seq, 10), string(member), version}).Error(); err != nil {
		s.m.changeFollowups.WithLabelValues(stepHotPut).Inc()
		s.p.Log.Warn().Err(err).Str("topic", c.topic).Int64("seq", c.seq).Msg("changed message not put back into the hot cache; pages read MySQL for it")
	}
	if err := <-published; err != nil {
		s.m.changeFollowups.WithLabelValues(stepPublish).Inc()
		s.p.Log.Warn().Err(err).Str("topic", c.topic).Int64("change_seq", changeSeq).Msg("change event not published; consumers resume from the revisions")
	}
}

// defaultMaxEditBody is send.max_body_bytes' default.
const defaultMaxEditBody = 64 << 10

func (s *Service) maxEditBody() int64 {
	if s.p.MaxEditBody > 0 {
		return s.p.MaxEditBody
	}
	return defaultMaxEditBody
}

// afterChangeTimeout bounds the best-effort steps after a commit.
const afterChangeTimeout = 5 * time.Second
