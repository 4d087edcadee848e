package changes

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"

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
	// refs are the messages the change applies to: a request's change
	// names one, (topic, seq). Every one gets the same change, so one
	// statement of each kind writes them all.
	refs []routing.MessageRef
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
	c.tenant, c.refs = p.Tenant, []routing.MessageRef{{Topic: c.topic, Seq: c.seq}}
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
	w, err := s.changeTx(ctx, db, keys, tables, c, flying, legacy)
	switch {
	case errors.Is(err, errUnchanged):
		return ChangeResult{Message: w.old[0]}, nil
	case err != nil:
		return ChangeResult{}, err
	}
	return ChangeResult{Message: w.changed[0].next, ChangeSeq: w.changed[0].changeSeq}, nil
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

// monthArchived answers a change of a message in an archived month while
// the tenant still migrates from its legacy table (the change would copy
// the legacy row into the month's table): nothing changed.
func monthArchived() error {
	return httpapi.Errorf(httpapi.CodeConflict, "the message's month is archived and its topic still migrates from the legacy table").
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
// (runChange).
func (s *Service) changeTx(ctx context.Context, db *sql.DB, keys routing.Keys, tables []routing.Table, c changeReq, flying, legacy bool) (written, error) {
	var w written
	err := runChange(ctx, db, func(tx *sql.Tx) error {
		var err error
		w, err = s.changeIn(ctx, tx, keys, tables, c, flying, legacy)
		return err
	}, false)
	if err != nil {
		return w, err
	}
	s.afterChange(context.WithoutCancel(ctx), keys, c, w)
	return w, nil
}

// runChange runs fn, a change's transaction, fenced (routing.Fenced: the
// placement fence is its first statement, so its shared lock covers the
// whole transaction; a refusal answers 409 tenant_moving, modules/httpapi),
// and again after a deadlock, which rolled it back before the caches were
// told (a change's statements come first), up to maxChangeAttempts. Its
// error is answered as a change answers it: a refusal, errUnchanged or
// not found as it is; with own, any other error but a deadlock as it is
// too (the caller's own refusal, or its statement's failure); the rest
// (begin, commit) as 503.
func runChange(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error, own bool) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = routing.Fenced(ctx, db, fn)
		if !tenantdb.IsDeadlock(err) || attempt == maxChangeAttempts {
			break
		}
	}
	var e *httpapi.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errUnchanged), errors.As(err, &e), errors.Is(err, routing.ErrPlacementMoved), errors.Is(err, readpath.ErrNotFound):
		return err
	case own && !tenantdb.IsDeadlock(err):
		return err
	default:
		return httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable: the change may not have been applied, retry", err)
	}
}

// written is what a change's transaction wrote, for what follows its
// commit.
type written struct {
	// old: the messages as they were, locked, in refs order
	old []message.Message
	// changed: those the change changed (a repeated delete changes
	// nothing), in refs order
	changed []changedMsg
	// versions: each changed topic's message version, as the change moved
	// it (lua/msg_change.lua)
	versions map[string]string
}

// changedMsg is one message a change changed.
type changedMsg struct {
	old, next message.Message
	table     routing.Table
	overlay   bool // an archived message: its overlay row changes, not the table
	changeSeq int64
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
	if legacy && len(archived) > 0 {
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
	locked, err := lockMessages(ctx, tx, tables, c.refs)
	if err != nil {
		return w, err
	}
	if len(archived) > 0 && len(locked) < len(c.refs) {
		more, err := s.lockArchived(ctx, tx, c.tenant, archived, unlocked(c.refs, locked))
		if err != nil {
			return w, err
		}
		locked = append(locked, more...)
		sortLocked(locked)
	}
	// a batch's message gone meanwhile has nothing left to change; a
	// request's is not found
	if len(locked) == 0 && flying {
		return w, httpapi.Errorf(httpapi.CodeConflict,
			"the message is not stored yet (still on its way from the queue); retry after retry_after_ms").
			WithDetails(map[string]any{"retry_after_ms": retryAfter.Milliseconds()})
	}
	if len(locked) == 0 {
		return w, readpath.ErrNotFound
	}
	for _, l := range locked {
		w.old = append(w.old, l.msg)
		next, err := s.apply(c, l.msg)
		if err != nil {
			return w, err
		}
		if next.Version != l.msg.Version {
			w.changed = append(w.changed, changedMsg{old: l.msg, next: next, table: l.table, overlay: l.overlay})
		}
	}
	if len(w.changed) == 0 {
		return w, errUnchanged
	}
	if err := writeChanges(ctx, tx, c, w.changed, legacy); err != nil {
		return w, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	refs := make([]routing.MessageRef, len(w.changed))
	for i, ch := range w.changed {
		refs[i] = routing.MessageRef{Topic: ch.next.Topic, Seq: ch.next.Seq}
	}
	if w.versions, err = s.tellCaches(ctx, keys, refs); err != nil {
		return w, httpapi.Wrap(httpapi.CodeUnavailable, "the caches cannot be told (Redis unavailable): nothing changed, retry", err)
	}
	return w, nil
}

// tellCaches takes the changed messages (refs, sorted) out of their
// topics' hot caches and moves each topic's message version forward
// (lua/msg_change.lua, one call per topic, all in one round trip),
// answering the versions set.
func (s *Service) tellCaches(ctx context.Context, keys routing.Keys, changed []routing.MessageRef) (map[string]string, error) {
	rdb, script := s.p.Redis, s.p.Scripts.MsgChange
	ttl := strconv.FormatInt(routing.MessagesVersionTTL.Milliseconds(), 10)
	type call struct {
		topic      string
		keys, args []string
	}
	var calls []call
	for i := 0; i < len(changed); {
		topic := changed[i].Topic
		args := []string{ttl}
		// one stretch per run of consecutive seqs (changed is in seq order)
		for i < len(changed) && changed[i].Topic == topic {
			first, last := changed[i].Seq, changed[i].Seq
			for i++; i < len(changed) && changed[i].Topic == topic && changed[i].Seq == last+1; i++ {
				last++
			}
			args = append(args, strconv.FormatInt(first, 10), strconv.FormatInt(last, 10))
		}
		calls = append(calls, call{topic, []string{keys.HotMessages(topic), keys.MessagesVersion(topic)}, args})
	}
	cmds := make(rueidis.Commands, len(calls))
	for i, c := range calls {
		cmds[i] = script.Cmd(rdb, c.keys, c.args)
	}
	versions := make(map[string]string, len(calls))
	for i, res := range rdb.DoMulti(ctx, cmds...) {
		v, err := script.Result(ctx, rdb, res, calls[i].keys, calls[i].args).ToString()
		if err != nil {
			return nil, err
		}
		versions[calls[i].topic] = v
	}
	return versions, nil
}

// lockedMsg is a message a change locked, and the table it is in (or,
// overlay, the archived month whose overlay row was locked).
type lockedMsg struct {
	msg     message.Message
	table   routing.Table
	overlay bool
}

// lockMessages reads the messages refs (sorted) from tables, locking
// their rows, each from the first of tables holding it (a request's change
// may name several months, most likely first); one in none is left out.
// The answer is in refs order.
func lockMessages(ctx context.Context, tx *sql.Tx, tables []routing.Table, refs []routing.MessageRef) ([]lockedMsg, error) {
	var out []lockedMsg
	left := refs
	for _, t := range tables {
		if len(left) == 0 {
			break
		}
		query, args, err := sq.Select(readpath.Columns...).From(t.Quoted()+" AS m").
			Where(routing.RefsCond(left, "m.topic", "m.seqid")).OrderBy("m.topic", "m.seqid").Suffix("FOR UPDATE").ToSql()
		if err != nil {
			return nil, err
		}
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
		}
		found := map[routing.MessageRef]bool{}
		for rows.Next() {
			m, err := readpath.ScanMessage(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, lockedMsg{msg: m, table: t})
			found[routing.MessageRef{Topic: m.Topic, Seq: m.Seq}] = true
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, err
		}
		left = slices.DeleteFunc(slices.Clone(left), func(r routing.MessageRef) bool { return found[r] })
	}
	sortLocked(out)
	return out, nil
}

// sortLocked puts locked messages in refs order.
func sortLocked(ls []lockedMsg) {
	slices.SortFunc(ls, func(a, b lockedMsg) int {
		return cmp.Or(cmp.Compare(a.msg.Topic, b.msg.Topic), cmp.Compare(a.msg.Seq, b.msg.Seq))
	})
}

// unlocked are the refs (sorted) none of locked is.
func unlocked(refs []routing.MessageRef, locked []lockedMsg) []routing.MessageRef {
	got := make(map[routing.MessageRef]bool, len(locked))
	for _, l := range locked {
		got[routing.MessageRef{Topic: l.msg.Topic, Seq: l.msg.Seq}] = true
	}
	return slices.DeleteFunc(slices.Clone(refs), func(r routing.MessageRef) bool { return got[r] })
}

// lockArchived locks the messages refs (sorted) of the archived months
// (each from the first month whose archive holds it; one in none is left
// out): their overlay rows, seeded from the archive where the overlay has
// none yet, then read locked — so a change that seeded the same row first
// is waited for and read as it committed. The answer is the archive's rows
// with their overlay rows over them. The archive is never written.
func (s *Service) lockArchived(ctx context.Context, tx *sql.Tx, tenant string, months []routing.Table, refs []routing.MessageRef) ([]lockedMsg, error) {
	type found struct {
		row   readpath.Row
		table routing.Table
	}
	var rows []found
	var seed []routing.OverlayRow
	left := refs
	for _, t := range months {
		got := map[routing.MessageRef]bool{}
		rs, err := s.r.ArchiveRows(ctx, tenant, t.Month(), left)
		if err != nil {
			return nil, httpapi.Wrap(httpapi.CodeUnavailable, "archive unavailable", err)
		}
		for _, r := range rs {
			rows = append(rows, found{r, t})
			seed = append(seed, routing.OverlayRow{Topic: r.Topic, Seq: r.Seq, Month: t.Month(), MessageID: r.MessageID,
				Status: r.Status, Content: r.Content, Head: r.Head, Version: r.Version, UpdatedAt: r.UpdatedAt})
			got[routing.MessageRef{Topic: r.Topic, Seq: r.Seq}] = true
		}
		left = slices.DeleteFunc(slices.Clone(left), func(r routing.MessageRef) bool { return got[r] })
	}
	if len(rows) == 0 {
		return nil, nil
	}
	// before the seed commits: a reader that finds the month unmarked has
	// no overlay row of it to miss
	var seeded []routing.Month
	for _, o := range seed {
		if !slices.Contains(seeded, o.Month) {
			seeded = append(seeded, o.Month)
		}
	}
	if err := s.r.MarkOverlay(ctx, tenant, seeded); err != nil {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "cache unavailable", err)
	}
	if err := routing.SeedOverlay(ctx, tx, seed); err != nil {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	lockRefs := make([]routing.MessageRef, len(rows))
	for i, f := range rows {
		lockRefs[i] = routing.MessageRef{Topic: f.row.Topic, Seq: f.row.Seq}
	}
	routing.SortRefs(lockRefs)
	ov, err := routing.LockOverlay(ctx, tx, lockRefs)
	if err != nil {
		return nil, httpapi.Wrap(httpapi.CodeUnavailable, "message store unavailable", err)
	}
	out := make([]lockedMsg, 0, len(rows))
	for _, f := range rows {
		o, ok := ov[routing.MessageRef{Topic: f.row.Topic, Seq: f.row.Seq}]
		if !ok {
			return nil, fmt.Errorf("changes: overlay row of %s/%d missing after its seed", f.row.Topic, f.row.Seq)
		}
		r := f.row
		readpath.Overlaid(&r, o)
		m, err := r.Message()
		if err != nil {
			return nil, err
		}
		out = append(out, lockedMsg{msg: m, table: f.table, overlay: true})
	}
	return out, nil
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

// writeChanges updates the changed rows to their next state (with legacy,
// the legacy table's row too, alike), drops the mention index entries of
// messages that stop being normal, allocates each topic's next change_seqs
// and records the revisions (the content and head before the change) and
// the change events, all in tx: one statement of each kind (the
// change_seqs of several topics take two). The changes share their
// action, content and head, so one UPDATE per table sets them all; each
// row's version moves on by one, as apply computed.
func writeChanges(ctx context.Context, tx *sql.Tx, c changeReq, changed []changedMsg, legacy bool) error {
	next := changed[0].next
	at := next.UpdatedAt.Time
	up := sq.Update("").Set("status", next.Status).Set("content", message.JSONColumn(next.Content)).
		Set("head", message.JSONColumn(next.Head)).Set("version", sq.Expr("version + 1")).Set("updated_at", at)
	switch c.action {
	case message.ActionRecall:
		up = up.Set("recalled_at", at).Set("recalled_by", c.actor)
	case message.ActionDelete:
		up = up.Set("deleted_at", at)
	}
	byTable := map[tableOf][]routing.MessageRef{}
	var tables []tableOf
	var mentions []routing.Mention
	for _, ch := range changed {
		t := tableOf{ch.table, ch.overlay}
		if _, ok := byTable[t]; !ok {
			tables = append(tables, t)
		}
		byTable[t] = append(byTable[t], routing.MessageRef{Topic: ch.old.Topic, Seq: ch.old.Seq})
		if ch.old.Status == message.StatusNormal && ch.next.Status != message.StatusNormal {
			// a recalled or deleted message no longer counts in anyone's
			// mention_unread
			mentions = append(mentions, mentionsOf(ch.old)...)
		}
	}
	for _, t := range tables {
		if err := t.update(ctx, tx, up, byTable[t], legacy); err != nil {
			return err
		}
	}
	if err := routing.DropMentions(ctx, tx, mentions); err != nil {
		return err
	}
	var revs []readpath.NewRevision
	evs := make([]feed.Event, len(changed))
	// each topic's run of changes takes its change_seqs at once, in seq
	// order (changed is sorted), all topics in one allocation
	var runs []readpath.ChangeRun
	for i, ch := range changed {
		if i == 0 || changed[i-1].old.Topic != ch.old.Topic {
			runs = append(runs, readpath.ChangeRun{Topic: ch.old.Topic})
		}
		runs[len(runs)-1].N++
	}
	starts, err := readpath.NextChangeSeqs(ctx, tx, runs)
	if err != nil {
		return err
	}
	k := 0
	for r, run := range runs {
		for i := range run.N {
			ch := &changed[k]
			ch.changeSeq = starts[r] + i
			revs = append(revs, readpath.NewRevision{Topic: run.Topic, Month: ch.table.Month(), Seq: ch.old.Seq, MessageID: ch.old.MessageID,
				Action: c.action, Version: ch.next.Version, Content: ch.old.Content, Head: ch.old.Head, Actor: c.actor, Reason: c.reason,
				ChangeSeq: ch.changeSeq, At: at})
			evs[k] = feed.Event{Tenant: c.tenant, Topic: run.Topic, ChangeSeq: ch.changeSeq, Action: c.action,
				SeqID: ch.old.Seq, MessageID: ch.old.MessageID, ShardMonth: ch.table.Month().String(), Version: ch.next.Version,
				Actor: message.ID(c.actor), Reason: c.reason, At: ch.next.UpdatedAt, Message: &ch.next}
			k++
		}
	}
	if err := readpath.RecordRevisions(ctx, tx, revs); err != nil {
		return err
	}
	return feed.RecordAll(ctx, tx, evs)
}

// tableOf is where a changed message's row is: its month table, or (overlay)
// its archived month's overlay.
type tableOf struct {
	table   routing.Table
	overlay bool
}

// update runs up on the rows refs of t (with legacy, the legacy table's
// too, alike).
func (t tableOf) update(ctx context.Context, tx *sql.Tx, up sq.UpdateBuilder, refs []routing.MessageRef, legacy bool) error {
	if t.overlay {
		_, err := routing.OverlayUpdate(up, refs).RunWith(tx).ExecContext(ctx)
		return err
	}
	q := up.Where(routing.RefsCond(refs, "topic", "seqid"))
	if _, err := q.Table(t.table.Quoted()).RunWith(tx).ExecContext(ctx); err != nil {
		return err
	}
	if legacy {
		_, err := q.Table(routing.LegacyQuoted()).RunWith(tx).ExecContext(ctx)
		return err
	}
	return nil
}

// mentionsOf are m's mention index entries.
func mentionsOf(m message.Message) []routing.Mention {
	users := make([]int64, len(m.MentionedUserIDs))
	for i, id := range m.MentionedUserIDs {
		users[i] = int64(id)
	}
	return routing.MentionsOf(m.Topic, m.Seq, users, m.MentionAll)
}

// afterChange puts the changed messages back into their topics' hot
// caches (unless a later change moved a topic's message version on) and
// publishes the change events, all in one round trip. Both are best
// effort: the change is committed and no cache serves its old version; a
// failure costs a cache miss or a missed event (a consumer resumes from
// the revisions by change_seq).
// markOverlaidAgain marks the archived months a committed change overlaid
// in the tenant's set of overlaid months (routing.MarkOverlay) a second
// time. The mark before the commit is what readers rely on; this one
// covers Redis losing the set between that mark and the commit: a reader
// that refilled the set from MySQL then, before the commit, left the month
// out and marked the set complete, and without this mark every later
// reader would skip the month's overlay. After it, no reader after the
// change's answer misses it.
func (s *Service) markOverlaidAgain(ctx context.Context, keys routing.Keys, months []routing.Month) {
	if err := routing.MarkOverlay(ctx, s.p.Redis, keys, months); err != nil {
		s.m.changeFollowups.WithLabelValues(stepOverlayMark).Inc()
		s.p.Log.Warn().Err(err).Msg("archived months overlaid by a change not marked again after its commit")
	}
}

func (s *Service) afterChange(ctx context.Context, keys routing.Keys, c changeReq, w written) {
	ctx, cancel := context.WithTimeout(ctx, afterChangeTimeout)
	defer cancel()
	var overlaid []routing.Month
	for _, ch := range w.changed {
		if m := ch.table.Month(); ch.overlay && !slices.Contains(overlaid, m) {
			overlaid = append(overlaid, m)
		}
	}
	s.markOverlaidAgain(ctx, keys, overlaid)
	rdb, script := s.p.Redis, s.p.Scripts.HotPut
	type put struct {
		topic      string
		keys, args []string
	}
	var puts []put
	var pubs rueidis.Commands
	for i, ch := range w.changed {
		topic, next := ch.next.Topic, testhook.Break(testhook.StaleVersion, ch.old, ch.next)
		if i == 0 || w.changed[i-1].next.Topic != topic {
			puts = append(puts, put{topic, []string{keys.HotMessages(topic), keys.MessagesVersion(topic)}, []string{w.versions[topic]}})
		}
		member, _ := json.Marshal(next)
		p := &puts[len(puts)-1]
		p.args = append(p.args, strconv.FormatInt(next.Seq, 10), string(member))
		ev := message.ChangeFrame(message.Change{Topic: topic, Seq: next.Seq, MessageID: next.MessageID, Action: c.action,
			Version: next.Version, ChangeSeq: ch.changeSeq, Actor: message.ID(c.actor), At: next.UpdatedAt})
		pubs = append(pubs, rdb.B().Spublish().Channel(keys.Realtime(topic)).Message(string(ev)).Build())
	}
	cmds := make(rueidis.Commands, 0, len(puts)+len(pubs))
	for _, p := range puts {
		cmds = append(cmds, script.Cmd(rdb, p.keys, p.args))
	}
	res := rdb.DoMulti(ctx, append(cmds, pubs...)...)
	for i, p := range puts {
		if err := script.Result(ctx, rdb, res[i], p.keys, p.args).Error(); err != nil {
			s.m.changeFollowups.WithLabelValues(stepHotPut).Inc()
			s.p.Log.Warn().Err(err).Str("topic", p.topic).Int("messages", len(p.args)/2).Msg("changed messages not put back into the hot cache; pages read MySQL for them")
		}
	}
	for i, r := range res[len(puts):] {
		if err := r.Error(); err != nil {
			s.m.changeFollowups.WithLabelValues(stepPublish).Inc()
			ch := w.changed[i]
			s.p.Log.Warn().Err(err).Str("topic", ch.next.Topic).Int64("change_seq", ch.changeSeq).Msg("change event not published; consumers resume from the revisions")
		}
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
