package send

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

// Response is the 201 body of a send; a retry answers 200 with the original
// body and Duplicate set.
type Response struct {
	Topic      string       `json:"topic"`
	Seq        int64        `json:"seq"`
	MessageID  message.ID   `json:"message_id"`
	ShardMonth string       `json:"shard_month"`
	CreatedAt  message.Time `json:"created_at"`
	Duplicate  bool         `json:"duplicate"`
}

func responseOf(ev *message.Event) Response {
	return Response{Topic: ev.Topic, Seq: ev.SeqID, MessageID: ev.MessageID, ShardMonth: ev.ShardMonth, CreatedAt: ev.CreatedAt}
}

// produceGrace lets the client fail a record at its deadline before the
// handler gives up on the promise.
const produceGrace = 250 * time.Millisecond

// postAckTimeout bounds the Redis work after the ack; it runs detached from
// the request so a client hanging up cannot leave it half done.
const postAckTimeout = 5 * time.Second

func unavailable(msg string, err error) error {
	return httpapi.Wrap(httpapi.CodeUnavailable, msg, err)
}

func (s *Service) handleSend(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	start := time.Now()
	resp, err := s.send(w, r, p)
	result, status := resultOK, http.StatusCreated
	switch {
	case err != nil:
		result, _ = httpapi.Classify(err)
	case resp.Duplicate:
		result, status = resultDuplicate, http.StatusOK
	}
	s.m.total.WithLabelValues(result).Inc()
	s.m.latency.WithLabelValues(result).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, status, resp)
	return nil
}

// send runs every check before anything is claimed or allocated: a
// rejected request changes nothing (invariant 11, docs/invariants.md).
func (s *Service) send(w http.ResponseWriter, r *http.Request, p httpapi.Principal) (Response, error) {
	topic := r.PathValue("topic")
	if err := routing.ValidTopic(topic); err != nil {
		return Response{}, err
	}
	req, err := DecodeSend(http.MaxBytesReader(w, r.Body, s.p.Send.MaxBodyBytes), s.p.Send.MaxMentions)
	if err != nil {
		return Response{}, err
	}
	ctx := r.Context()
	sender, groupID, err := s.authorize(ctx, p, topic, &req)
	if err != nil {
		return Response{}, err
	}
	keys, err := routing.KeysFor(p.Tenant)
	if err != nil {
		return Response{}, err
	}
	a := &attempt{s: s, tenant: p.Tenant, topic: topic, keys: keys, req: &req, sender: sender, groupID: groupID,
		key: keys.Idempotency(topic, sender, req.ClientMsgID), owner: token()}
	a.log = s.p.Log.With().Str("tenant", p.Tenant).Str("topic", topic).Int64("from_user", sender).Logger()
	return a.run(ctx)
}

// authorize resolves the sender and checks the group and the membership.
func (s *Service) authorize(ctx context.Context, p httpapi.Principal, topic string, req *Request) (sender, groupID int64, err error) {
	sender = p.UserID
	if req.FromUser != nil {
		if p.Role != httpapi.RoleService {
			return 0, 0, invalid("from_user may be set only by the service role")
		}
		sender = int64(*req.FromUser)
	}
	if req.MsgType == "system" && p.Role == httpapi.RoleUser {
		return 0, 0, httpapi.Errorf(httpapi.CodePermissionDenied, "msg_type system is reserved to the service and admin roles")
	}
	m, err := s.p.ACL.Lookup(ctx, p.Tenant, topic, sender)
	switch {
	case errors.Is(err, acl.ErrNoGroup):
		return 0, 0, httpapi.Errorf(httpapi.CodeNotFound, "topic has no group")
	case err != nil:
		return 0, 0, unavailable("membership check failed", err)
	case m.GroupStatus == acl.GroupDissolved:
		return 0, 0, httpapi.Errorf(httpapi.CodePermissionDenied, "group is dissolved")
	case !m.Member:
		return 0, 0, httpapi.Errorf(httpapi.CodePermissionDenied, "sender is not a member of the group")
	case m.Muted(time.Now()):
		return 0, 0, httpapi.Errorf(httpapi.CodePermissionDenied, "sender is muted")
	}
	return sender, m.GroupID, nil
}

// attempt is one send request past validation.
type attempt struct {
	s       *Service
	tenant  string
	topic   string
	keys    routing.Keys
	req     *Request
	sender  int64
	groupID int64
	key     string // idempotency record
	owner   string // this attempt's claim token
	log     zerolog.Logger
}

// claimWait is how often a retry polls a claim whose first attempt has not
// allocated yet (milliseconds of work, unless that attempt died).
const claimWait = 5 * time.Millisecond

func (a *attempt) run(ctx context.Context) (Response, error) {
	s := a.s
	// past the stale bound the claim script takes a dead claim over
	deadline := time.Now().Add(s.p.Send.ProduceTimeout + time.Second)
	for {
		rep, err := s.p.Scripts.Fenced.IdemClaim(ctx, s.p.Redis, []string{a.key, a.keys.IdemSince()},
			[]string{a.owner, s.idemTTL, s.stale}).ToArray()
		if err != nil {
			return Response{}, unavailable("idempotency claim failed", err)
		}
		if n, _ := rep[0].AsInt64(); n == 1 {
			trusted, _ := rep[1].AsInt64()
			horizon, _ := rep[2].AsInt64()
			if horizon == 0 {
				s.establishHorizon(a.tenant)
			}
			return a.fresh(ctx, trusted == 1)
		}
		status, _ := rep[1].ToString()
		event, evErr := rep[2].ToString()
		resp, respErr := rep[3].ToString()
		switch {
		case respErr == nil:
			var out Response
			if err := json.Unmarshal([]byte(resp), &out); err != nil {
				return Response{}, fmt.Errorf("send: stored response of %s: %w", a.key, err)
			}
			out.Duplicate = true
			return out, nil
		case evErr == nil:
			return a.retry(ctx, status, event)
		}
		if time.Now().After(deadline) {
			return Response{}, unavailable("a send with this client_msg_id is still being allocated; retry", nil)
		}
		select {
		case <-ctx.Done():
			return Response{}, unavailable("request cancelled", ctx.Err())
		case <-time.After(claimWait):
		}
	}
}

// fresh sends under a new claim: MySQL first unless Redis is trusted to
// remember every earlier send of the key (its horizon has passed), then id,
// seq and month, the stored event, produce.
func (a *attempt) fresh(ctx context.Context, trusted bool) (Response, error) {
	s := a.s
	if trusted {
		return a.allocate(ctx)
	}
	resp, ok, err := s.fromMySQL(ctx, a.tenant, a.topic, a.sender, a.req.ClientMsgID)
	switch {
	case err != nil:
		a.release()
		return Response{}, unavailable("dedup lookup failed", err)
	case ok:
		s.m.dedupHit.Inc()
		raw, _ := json.Marshal(resp)
		if err := s.p.Scripts.IdemAck.Exec(ctx, s.p.Redis, []string{a.key}, []string{"done", "", string(raw), s.idemTTL}).Error(); err != nil {
			s.m.postAck.WithLabelValues(stepIdempotency).Inc()
			a.log.Warn().Err(err).Msg("could not restore the idempotency record from MySQL")
		}
		resp.Duplicate = true
		return resp, nil
	}
	return a.allocate(ctx)
}

// allocate takes id, seq and month, stores the event in the claim and
// produces it.
func (a *attempt) allocate(ctx context.Context) (Response, error) {
	s := a.s
	id, err := s.ids.Next()
	if err != nil {
		a.release()
		return Response{}, err
	}
	al, err := s.p.Allocator.Allocate(ctx, a.tenant, a.topic)
	if err != nil {
		a.release()
		if code, _ := httpapi.Classify(err); code == httpapi.CodeInternal {
			return Response{}, unavailable("seq allocation failed", err)
		}
		return Response{}, err
	}
	// from here a seq exists: finish detached from the client's connection
	ctx = context.WithoutCancel(ctx)
	ev := &message.Event{
		V: message.EventVersion, EventID: token(), Tenant: a.tenant, Topic: a.topic, GroupID: message.ID(a.groupID),
		SeqID: al.Seq, ShardMonth: al.Month.String(), MessageID: message.ID(id), FromUser: message.ID(a.sender),
		ClientMsgID: a.req.ClientMsgID, MsgType: a.req.MsgType, Content: a.req.Content, Head: a.req.Head,
		MentionedUserIDs: a.req.MentionedUserIDs, MentionAll: a.req.MentionAll, ReplySeqID: a.req.ReplySeqID,
		RootSeqID: a.req.RootSeqID, CreatedAt: message.NewTime(time.Now()),
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		a.abandon(ctx, al.Seq, err)
		return Response{}, fmt.Errorf("send: encode event: %w", err)
	}
	ok, err := s.p.Scripts.IdemEvent.Exec(ctx, s.p.Redis, []string{a.key}, []string{a.owner, string(raw), s.idemTTL}).AsInt64()
	if err != nil || ok != 1 {
		// never produced: nothing will persist this seq
		a.abandon(ctx, al.Seq, err)
		return Response{}, unavailable("idempotency record could not take the event", err)
	}
	return a.produce(ctx, ev, raw, false)
}

// retry handles a record holding an event: answered from it once acked or
// persisted, re-produced (same seq, month, event_id) while pending or failed.
func (a *attempt) retry(ctx context.Context, status, raw string) (Response, error) {
	s := a.s
	var ev message.Event
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		return Response{}, fmt.Errorf("send: stored event of %s: %w", a.key, err)
	}
	if status == "acked" || status == "done" {
		out := responseOf(&ev)
		out.Duplicate = true
		return out, nil
	}
	n, err := s.p.Scripts.IdemRetry.Exec(ctx, s.p.Redis,
		[]string{a.key, a.keys.Pending(a.topic), a.keys.Gaps(a.topic)},
		[]string{strconv.FormatInt(ev.SeqID, 10), a.owner, s.idemTTL}).AsInt64()
	if err != nil {
		return Response{}, unavailable("idempotency retry failed", err)
	}
	if n == 0 {
		// the first attempt's seq timed out into a gap and was never stored:
		// this retry is the message's first real send
		return a.allocate(ctx)
	}
	return a.produce(context.WithoutCancel(ctx), &ev, []byte(raw), true)
}

// produce waits for the broker's ack within the produce timeout. Past it the
// answer is 503 and the promise is settled in the background: a late ack
// still marks the seq acked; a failure leaves the event for a retry, and the
// seq becomes a gap once pending past the timeout (routing.Flight.Settled).
func (a *attempt) produce(ctx context.Context, ev *message.Event, raw []byte, dup bool) (Response, error) {
	s := a.s
	done := s.prod.produce(ev.Key(), raw)
	// the record's own deadline normally settles it first; this is the
	// backstop for a record the client may not fail yet (sent, unanswered)
	timer := time.NewTimer(s.p.Send.ProduceTimeout + produceGrace)
	defer timer.Stop()
	select {
	case err := <-done:
		return a.settle(ctx, ev, raw, err, dup, false)
	case <-timer.C:
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_, _ = a.settle(ctx, ev, raw, <-done, dup, true)
		}()
		a.log.Warn().Int64("seq", ev.SeqID).Msg("kafka produce timed out")
		return Response{}, unavailable("message queue did not acknowledge in time", nil)
	}
}

// settle finishes a produce; late is an ack that came after the handler
// answered 503.
func (a *attempt) settle(ctx context.Context, ev *message.Event, raw []byte, err error, dup, late bool) (Response, error) {
	s := a.s
	if err != nil {
		a.log.Warn().Err(err).Int64("seq", ev.SeqID).Msg("kafka produce failed; the event stays for a retry")
		if ferr := s.p.Scripts.IdemFail.Exec(ctx, s.p.Redis, []string{a.key}, nil).Error(); ferr != nil {
			a.log.Warn().Err(ferr).Int64("seq", ev.SeqID).Msg("could not mark the idempotency record failed")
		}
		return Response{}, unavailable("message queue unavailable", err)
	}
	resp := responseOf(ev)
	ctx, cancel := context.WithTimeout(ctx, postAckTimeout)
	defer cancel()
	s.postAck(ctx, a, ev, raw, resp)
	if late {
		// the timeout may already have made this seq a gap that readers
		// walked past (invariant 12, docs/invariants.md); the message is stored anyway
		if gaps, err := s.p.Flight.Gaps(ctx, a.tenant, a.topic, ev.SeqID, ev.SeqID); err == nil && len(gaps) > 0 {
			s.m.postAck.WithLabelValues(stepLateAfterGap).Inc()
			a.log.Error().Int64("seq", ev.SeqID).Msg("kafka acknowledged a send after its seq was recorded as a gap")
		}
	}
	resp.Duplicate = dup
	return resp, nil
}

// postAck records the ack and feeds the readers. Everything here is best
// effort (the hot cache never rolls anything back; a reader falls back to
// MySQL by seq), issued concurrently so the auto-pipeline carries it in
// about one round trip.
func (s *Service) postAck(ctx context.Context, a *attempt, ev *message.Event, raw []byte, resp Response) {
	fail := func(step string, err error) {
		s.m.postAck.WithLabelValues(step).Inc()
		a.log.Warn().Err(err).Int64("seq", ev.SeqID).Str("step", step).Msg("post-ack step failed; the send succeeded")
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := s.p.Flight.MarkAcked(ctx, a.tenant, a.topic, ev.SeqID); err != nil {
			fail(stepPending, err)
		}
	}()
	go func() {
		defer wg.Done()
		body, _ := json.Marshal(resp)
		if err := s.p.Scripts.IdemAck.Exec(ctx, s.p.Redis, []string{a.key}, []string{"acked", string(raw), string(body), s.idemTTL}).Error(); err != nil {
			fail(stepIdempotency, err)
		}
	}()
	msg, _ := json.Marshal(message.FromEvent(ev))
	pub := `{"type":"message","message":` + string(msg) + `}`
	rdb, hot := s.p.Redis, a.keys.HotMessages(a.topic)
	cmds := make(rueidis.Commands, 0, 4)
	steps := make([]string, 0, 4)
	if hc := s.p.HotCache; hc.TTL > 0 && hc.MaxPerTopic > 0 {
		cmds = append(cmds,
			rdb.B().Zadd().Key(hot).ScoreMember().ScoreMember(float64(ev.SeqID), string(msg)).Build(),
			rdb.B().Pexpire().Key(hot).Milliseconds(hc.TTL.Milliseconds()).Build(),
			rdb.B().Zremrangebyrank().Key(hot).Start(0).Stop(int64(-hc.MaxPerTopic-1)).Build())
		steps = append(steps, stepHotCache, stepHotCache, stepHotCache)
	}
	cmds = append(cmds, rdb.B().Spublish().Channel(a.keys.Realtime(a.topic)).Message(pub).Build())
	steps = append(steps, stepPublish)
	for i, r := range rdb.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			fail(steps[i], err)
		}
	}
	wg.Wait()
}

// abandon records a seq that will never be produced as a gap and drops the
// claim, so a retry allocates afresh.
func (a *attempt) abandon(ctx context.Context, seq int64, cause error) {
	s := a.s
	a.log.Warn().Err(cause).Int64("seq", seq).Msg("allocated seq abandoned before produce")
	if err := s.p.Flight.RecordGap(ctx, a.tenant, a.topic, seq); err != nil {
		a.log.Warn().Err(err).Int64("seq", seq).Msg("could not record the gap; the produce timeout will")
	} else {
		s.m.gaps.Inc()
	}
	a.release()
}

// release drops this attempt's claim if it holds one without an event.
func (a *attempt) release() {
	s := a.s
	ctx, cancel := context.WithTimeout(context.Background(), postAckTimeout)
	defer cancel()
	if err := s.p.Scripts.IdemRelease.Exec(ctx, s.p.Redis, []string{a.key}, []string{a.owner}).Error(); err != nil {
		a.log.Warn().Err(err).Msg("could not release the idempotency claim; it goes stale after the produce timeout")
	}
}

// fromMySQL answers a send Redis has no record of from what MySQL stored:
// the month tables' unique key (topic, from_user, client_msg_id) in the
// active month and the one before — a retry within send.idempotency_ttl
// cannot reach further back.
func (s *Service) fromMySQL(ctx context.Context, tenant, topic string, from int64, clientMsgID string) (Response, bool, error) {
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Response{}, false, err
	}
	sender := sq.Eq{"topic": topic, "from_user": from, "client_msg_id": clientMsgID}
	out := Response{Topic: topic}
	var created time.Time
	active, err := s.p.Allocator.ActiveMonth(ctx, tenant)
	if err != nil || active.IsZero() {
		return Response{}, false, err
	}
	for _, m := range []routing.Month{active, active.Prev()} {
		t, _, err := s.p.Catalog.Table(ctx, tenant, m)
		if errors.Is(err, routing.ErrShardNotRegistered) {
			continue
		}
		if err != nil {
			return Response{}, false, err
		}
		var id int64
		err = sq.Select("seqid", "message_id", "created_at").From(t.Quoted()).Where(sender).
			RunWith(db).QueryRowContext(ctx).Scan(&out.Seq, &id, &created)
		if errors.Is(err, sql.ErrNoRows) || tenantdb.IsNoSuchTable(err) {
			// a month table that is not there (yet, or any more) holds no
			// earlier send; persist waits for it (shard_missing)
			continue
		}
		if err != nil {
			return Response{}, false, fmt.Errorf("send: dedup probe %s: %w", t.Name(), err)
		}
		out.ShardMonth, out.MessageID, out.CreatedAt = m.String(), message.ID(id), message.NewTime(created)
		return out, true, nil
	}
	return Response{}, false, nil
}

// establishHorizon sets the tenant's idempotency horizon after Redis lost
// it (or never had it): a claim is trusted without asking MySQL once no
// message MySQL stored can still be retried, i.e. from the newest stored
// created_at plus send.idempotency_ttl on — at once if nothing was stored
// that recently. One computation per tenant at a time, in the background:
// until it lands, each send asks MySQL itself.
func (s *Service) establishHorizon(tenant string) {
	if _, busy := s.horizons.LoadOrStore(tenant, struct{}{}); busy {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.horizons.Delete(tenant)
		ctx, cancel := context.WithTimeout(context.Background(), postAckTimeout)
		defer cancel()
		if err := s.horizon(ctx, tenant); err != nil {
			s.p.Log.Warn().Err(err).Str("tenant", tenant).Msg("idempotency horizon not set; sends keep asking MySQL")
		}
	}()
}

func (s *Service) horizon(ctx context.Context, tenant string) error {
	keys, err := routing.KeysFor(tenant)
	if err != nil {
		return err
	}
	now, err := routing.NewClock(s.p.Redis).Now(ctx)
	if err != nil {
		return err
	}
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		return err
	}
	active, err := s.p.Allocator.ActiveMonth(ctx, tenant)
	if err != nil {
		return err
	}
	if active.IsZero() {
		return routing.ErrNoActiveMonth
	}
	// the months fromMySQL probes: a retriable message lives in one of them
	ttl := s.p.Send.IdempotencyTTL
	last, ok, err := routing.NewestMirrored(ctx, db, active.Prev())
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	h := now
	if ok && last.Add(ttl).After(now) {
		h = last.Add(ttl)
	}
	return s.p.Scripts.Fenced.IdemSince(ctx, s.p.Redis, []string{keys.IdemSince()},
		[]string{strconv.FormatInt(h.UnixMilli(), 10)}).Error()
}
