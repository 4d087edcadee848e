package send

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/ratelimit"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
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
	// body is the response rendered already (a fresh 201: the same bytes
	// the post-ack call keeps for a retry), written as it is
	body []byte
}

func responseOf(ev *message.Event) Response {
	return Response{Topic: ev.Topic, Seq: ev.SeqID, MessageID: ev.MessageID, ShardMonth: ev.ShardMonth, CreatedAt: ev.CreatedAt}
}

// render is json.Marshal(r), written by hand for what a send answers (a
// valid topic and a month need no escape); anything else goes through
// encoding/json.
func (r Response) render() ([]byte, error) {
	if !plainJSON(r.Topic) || !plainJSON(r.ShardMonth) {
		return json.Marshal(r)
	}
	b := append(make([]byte, 0, 160), `{"topic":"`...)
	b = append(b, r.Topic...)
	b = strconv.AppendInt(append(b, `","seq":`...), r.Seq, 10)
	b = strconv.AppendInt(append(b, `,"message_id":"`...), int64(r.MessageID), 10)
	b = append(append(b, `","shard_month":"`...), r.ShardMonth...)
	b = r.CreatedAt.UTC().AppendFormat(append(b, `","created_at":"`...), message.TimeFormat)
	b = strconv.AppendBool(append(b, `","duplicate":`...), r.Duplicate)
	return append(b, '}'), nil
}

// plainJSON reports whether s is written in a JSON string as it is: the
// characters of a topic.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

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
	if resp.body == nil {
		httpapi.WriteJSON(w, status, resp)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(resp.body)
	return nil
}

// send runs every check before anything is claimed or allocated: a
// rejected request changes nothing (invariant 11, docs/invariants.md).
func (s *Service) send(w http.ResponseWriter, r *http.Request, p httpapi.Principal) (Response, error) {
	// in-process state, no round trip: 503 while a migration refuses sends
	// (the send call's gate refuses what a lagging copy lets through)
	if err := s.p.Migrations.GateSend(r.Context(), p.Tenant); err != nil {
		return Response{}, err
	}
	topic := r.PathValue("topic")
	if err := routing.ValidTopic(topic); err != nil {
		return Response{}, err
	}
	req, err := DecodeSend(http.MaxBytesReader(w, r.Body, s.p.Send.MaxBodyBytes), s.p.Send.MaxMentions)
	if err != nil {
		return Response{}, err
	}
	sender, err := senderOf(p, &req)
	if err != nil {
		return Response{}, err
	}
	keys, err := s.p.KeySpace.Tenant(p.Tenant)
	if err != nil {
		return Response{}, err
	}
	id, err := s.ids.Next()
	if err != nil {
		return Response{}, err
	}
	a := &attempt{s: s, tenant: p.Tenant, topic: topic, keys: keys, sender: sender,
		key: keys.Idempotency(topic, sender, req.ClientMsgID), owner: token(), member: strconv.FormatInt(sender, 10)}
	a.ev = message.Event{
		V: message.EventVersion, EventID: token(), Tenant: p.Tenant, Topic: topic, MessageID: message.ID(id),
		FromUser: message.ID(sender), ClientMsgID: req.ClientMsgID, MsgType: req.MsgType, Content: req.Content,
		Head: req.Head, MentionedUserIDs: req.MentionedUserIDs, MentionAll: req.MentionAll, ReplySeqID: req.ReplySeqID,
		RootSeqID: req.RootSeqID, CreatedAt: message.NewTime(time.Now()),
	}
	if a.stored, err = message.Unallocated(&a.ev); err != nil {
		return Response{}, fmt.Errorf("send: encode event: %w", err)
	}
	a.limits = s.p.Limits.Of(p.Tenant).Send
	resp, err := a.run(r.Context())
	if err == nil && a.rate != "" {
		ratelimit.SetHeaders(w.Header(), ratelimit.SendPolicies(a.limits), a.rate)
	}
	return resp, err
}

// senderOf resolves the sender and checks what the token's role allows; the
// membership is checked in the send's Redis call (or by checkMember).
func senderOf(p httpapi.Principal, req *Request) (int64, error) {
	sender := p.UserID
	if req.FromUser != nil {
		if p.Role != httpapi.RoleService {
			return 0, invalid("from_user may be set only by the service role")
		}
		sender = int64(*req.FromUser)
	}
	if req.MsgType == "system" && p.Role == httpapi.RoleUser {
		return 0, httpapi.Errorf(httpapi.CodePermissionDenied, "msg_type system is reserved to the service and admin roles")
	}
	return sender, nil
}

// checkMember decides on a membership looked up (and cached) by the ACL,
// when the send call found nothing cached: the answers the call gives
// (acl.Refusals), from the rule every post follows.
func checkMember(m acl.Membership, err error) error {
	switch {
	case errors.Is(err, acl.ErrNoGroup):
		return acl.Refusals["nogroup"]
	case err != nil:
		return unavailable("membership check failed", err)
	}
	return m.PostRefusal(time.Now())
}

// attempt is one send request past validation.
type attempt struct {
	s      *Service
	tenant string
	topic  string
	keys   routing.Keys
	sender int64
	key    string // idempotency record
	owner  string // this attempt's claim token

	ev     message.Event // without group, seq and month until allocated
	stored []byte        // ev as the record stores it (message.Unallocated)

	pending string    // the seq's pending entry as the call made it ("" after a retry)
	origin  time.Time // before the call that stamped the seq's pending time (ackDeadlines)
	member  string    // sender's id for the call's membership check; "" once checked against MySQL
	groupID string    // the group checkMember found
	asked   bool      // MySQL said no earlier send exists (or the earlier seq is a gap)
	held    bool      // the record holds this attempt's claim without an event

	limits config.SendLimits // the tenant's send buckets as the attempt began
	rate   string            // the RateLimit field of the allocation's tightest bucket ("" when none)
}

// log is the attempt's logger, made only when something is logged (a
// steady-state send logs nothing).
func (a *attempt) log() *zerolog.Logger {
	l := a.s.p.Log.With().Str("tenant", a.tenant).Str("topic", a.topic).Int64("from_user", a.sender).Logger()
	return &l
}

// claimWait is how often a retry polls a claim whose first attempt has not
// allocated yet (milliseconds of work, unless that attempt died).
const claimWait = 5 * time.Millisecond

// maxSlowSteps bounds the calls of one attempt: each reply other than a
// live claim fixes one cause (membership, MySQL dedup, a gap, and the
// allocation's own slow paths).
const maxSlowSteps = 12

// Replies of the send call (lua/fenced.lua, send); 1–4 and the gate's
// two are the allocation's slow paths (routing.Allocator.Resolve).
const (
	replySent        = 0
	replyRecord      = 5
	replyBusy        = 6
	replyRefused     = 7
	replyACLMiss     = 8
	replyAskDB       = 9
	replyGateShut    = 10
	replyGateUnknown = 11
	replyUnsettled   = 12
	replyLimited     = 13
)

// versionTTL is the message version's TTL the send call gives a topic that
// has none (routing.MessagesVersionTTL, in ms).
var versionTTL = strconv.FormatInt(routing.MessagesVersionTTL.Milliseconds(), 10)

// progressEvery is how often persist publishes its progress
// (persisted_before, operations.md "Persist"): a send refused until that
// progress passes a time asks the client to wait this much longer.
const progressEvery = time.Second

// run makes the one Redis call of the steady state; any other reply is a
// slow path that fixes its cause and calls again.
func (a *attempt) run(ctx context.Context) (Response, error) {
	s := a.s
	// past the stale bound the call takes a dead claim over
	deadline := time.Now().Add(s.p.Send.ProduceTimeout + time.Second)
	keys := a.keys.Send(a.topic, a.sender, a.ev.ClientMsgID)
	limits := ratelimit.SendArgs(a.limits)
	for steps := 0; ; {
		asked := ""
		if a.asked {
			asked = "1"
		}
		a.origin = time.Now()
		// detached: once Redis ran the call a seq may exist, and an
		// attempt that stopped listening would leave it to time out
		rep, err := s.p.Scripts.Fenced.Send(context.WithoutCancel(ctx), s.p.Redis, keys, append([]string{
			a.owner, s.idemTTL, s.stale, a.member, a.groupID, asked}, append(append(s.p.Allocator.Args(), string(a.stored), versionTTL), limits...)...)).ToArray()
		if err != nil {
			return a.fail(unavailable("send: redis call failed", err))
		}
		status, err := rep[0].AsInt64()
		if err != nil {
			return a.fail(fmt.Errorf("send: reply: %w", err))
		}
		switch status {
		case replySent:
			return a.sent(ctx, rep)
		case replyRecord:
			resp, again, err := a.record(ctx, rep)
			if !again {
				return resp, err
			}
		case replyBusy:
			if time.Now().After(deadline) {
				return Response{}, unavailable("a send with this client_msg_id is still being allocated; retry", nil)
			}
			select {
			case <-ctx.Done():
				return Response{}, unavailable("request cancelled", ctx.Err())
			case <-time.After(claimWait):
			}
			continue
		case replyRefused:
			reason, _ := rep[1].ToString()
			if err, ok := acl.Refusals[reason]; ok {
				return a.fail(err)
			}
			return a.fail(fmt.Errorf("send: unknown refusal %q", reason))
		case replyACLMiss:
			m, err := s.p.ACL.Lookup(ctx, a.tenant, a.topic, a.sender)
			if err := checkMember(m, err); err != nil {
				return a.fail(err)
			}
			a.member, a.groupID = "", strconv.FormatInt(m.GroupID, 10)
		case replyAskDB:
			a.held = true
			set, _ := rep[1].AsInt64()
			start, _ := rep[2].AsInt64()
			complete, _ := rep[3].AsInt64()
			if set == 0 && complete == 1 {
				s.establishHorizon(a.tenant, strconv.FormatInt(start, 10))
			}
			if resp, done, err := a.askMySQL(ctx); done {
				return resp, err
			}
		case replyLimited:
			return a.fail(a.limited(rep))
		case replyUnsettled:
			wait, _ := rep[1].AsInt64()
			return a.fail(httpapi.Errorf(httpapi.CodeUnavailable,
				"Redis lost its memory of sends and an earlier send of this message may not be stored yet; retry with the same client_msg_id after retry_after_ms").
				WithDetails(map[string]any{"retry_after_ms": wait + progressEvery.Milliseconds()}))
		case 1, 2, 3, 4, replyGateShut, replyGateUnknown:
			// the gate's replies come before the claim: a claim held now
			// is one an earlier reply left
			a.held = a.held || status <= 4
			if err := s.p.Allocator.Resolve(ctx, a.tenant, a.topic, status, rep); err != nil {
				if code, _ := httpapi.Classify(err); code == httpapi.CodeInternal {
					err = unavailable("seq allocation failed", err)
				}
				return a.fail(err)
			}
		default:
			return a.fail(fmt.Errorf("send: unknown reply %d", status))
		}
		if steps++; steps >= maxSlowSteps {
			return a.fail(fmt.Errorf("send: %s/%s: no allocation after %d slow paths", a.tenant, a.topic, steps))
		}
	}
}

// limited is the 429 of a send a rate-limit bucket refused (the call's
// reply {13, bucket, retry_us}); the refusal is counted.
func (a *attempt) limited(rep []rueidis.RedisMessage) error {
	b, _ := rep[1].AsInt64()
	wait, _ := rep[2].AsInt64()
	if b < 1 || int(b) > len(ratelimit.SendBuckets) {
		return fmt.Errorf("send: rate limit reply names bucket %d", b)
	}
	scope := ratelimit.SendBuckets[b-1]
	a.s.p.Limits.Counted(a.tenant, scope)
	return ratelimit.Refusal(scope, ratelimit.SendPolicies(a.limits), time.Duration(wait)*time.Microsecond)
}

// askMySQL looks for an earlier send of the message in MySQL: done when it
// answers the attempt (the stored message, or an error); otherwise the
// attempt may allocate (asked). The send call let it ask only while MySQL
// answers for the topic: no resume fence of it stands.
func (a *attempt) askMySQL(ctx context.Context) (Response, bool, error) {
	resp, ok, err := a.s.fromMySQL(ctx, a.tenant, a.topic, a.sender, a.ev.ClientMsgID)
	switch {
	case err != nil:
		resp, err = a.fail(unavailable("dedup lookup failed", err))
		return resp, true, err
	case ok:
		resp, err = a.s.restored(ctx, a, resp)
		return resp, true, err
	}
	a.asked = true
	return Response{}, false, nil
}

// fail gives up the attempt: a claim it holds without an event is dropped,
// so a retry starts afresh instead of waiting for it to go stale.
func (a *attempt) fail(err error) (Response, error) {
	if a.held {
		a.release()
	}
	return Response{}, err
}

// restored answers a retry from what MySQL stored, and puts the answer back
// into the idempotency record.
func (s *Service) restored(ctx context.Context, a *attempt, resp Response) (Response, error) {
	s.m.dedupHit.Inc()
	raw, _ := json.Marshal(resp)
	if err := s.p.Scripts.IdemAck.Exec(ctx, s.p.Redis, []string{a.key}, []string{"done", "", string(raw), s.idemTTL}).Error(); err != nil {
		s.m.postAck.WithLabelValues(stepIdempotency).Inc()
		a.log().Warn().Err(err).Msg("could not restore the idempotency record from MySQL")
	}
	resp.Duplicate = true
	return resp, nil
}

// sent produces the event the call allocated and stored.
func (a *attempt) sent(ctx context.Context, rep []rueidis.RedisMessage) (Response, error) {
	s := a.s
	al, err := s.p.Allocator.Allocated(a.tenant, a.topic, rep)
	if err != nil {
		return Response{}, err
	}
	gid, err := rep[4].AsInt64()
	if err != nil {
		return Response{}, fmt.Errorf("send: group id in reply: %w", err)
	}
	a.pending, _ = rep[5].ToString()
	if b, _ := rep[6].AsInt64(); b >= 1 && int(b) <= len(ratelimit.SendBuckets) {
		left, _ := rep[7].AsInt64()
		reset, _ := rep[8].AsInt64()
		a.rate = ratelimit.State(ratelimit.SendBuckets[b-1], left, time.Duration(reset)*time.Microsecond)
	}
	a.ev.GroupID, a.ev.SeqID, a.ev.ShardMonth = message.ID(gid), al.Seq, al.Month.String()
	raw, err := message.WithAllocation(a.stored, a.ev.GroupID, al.Seq, a.ev.ShardMonth)
	if err != nil {
		return Response{}, err
	}
	// from here a seq exists: finish detached from the client's connection
	return a.produce(context.WithoutCancel(ctx), &a.ev, raw, false)
}

// record handles a record that exists: a stored response (MySQL answered
// an earlier retry) or a stored event. again asks run to call once more
// (the earlier seq became a gap: this attempt now holds a fresh claim).
func (a *attempt) record(ctx context.Context, rep []rueidis.RedisMessage) (resp Response, again bool, err error) {
	status, _ := rep[1].ToString()
	if stored, err := rep[3].ToString(); err == nil {
		var out Response
		if err := json.Unmarshal([]byte(stored), &out); err != nil {
			return Response{}, false, fmt.Errorf("send: stored response of %s: %w", a.key, err)
		}
		out.Duplicate = true
		return out, false, nil
	}
	event, err := rep[2].ToString()
	if err != nil {
		return Response{}, false, fmt.Errorf("send: record of %s: %w", a.key, err)
	}
	a.stored = []byte(event)
	gid, _ := rep[4].ToString()
	seq, _ := rep[5].ToString()
	month, _ := rep[6].ToString()
	raw := a.stored
	if gid != "" { // else a whole event (a record of an older version)
		g, gerr := strconv.ParseInt(gid, 10, 64)
		n, serr := strconv.ParseInt(seq, 10, 64)
		if err := errors.Join(gerr, serr); err != nil {
			return Response{}, false, fmt.Errorf("send: record of %s: %w", a.key, err)
		}
		if raw, err = message.WithAllocation(a.stored, message.ID(g), n, month); err != nil {
			return Response{}, false, err
		}
	}
	return a.retry(ctx, status, raw)
}

// retry handles a record holding an event: answered from it once acked or
// persisted, re-produced (same seq, month, event_id) while pending or failed.
func (a *attempt) retry(ctx context.Context, status string, raw []byte) (Response, bool, error) {
	s := a.s
	var ev message.Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return Response{}, false, fmt.Errorf("send: stored event of %s: %w", a.key, err)
	}
	if status == "acked" || status == "done" {
		out := responseOf(&ev)
		out.Duplicate = true
		return out, false, nil
	}
	a.origin = time.Now()
	n, err := s.p.Scripts.IdemRetry.Exec(ctx, s.p.Redis,
		[]string{a.key, a.keys.Pending(a.topic), a.keys.Gaps(a.topic)},
		[]string{strconv.FormatInt(ev.SeqID, 10), a.owner, s.idemTTL}).AsInt64()
	if err != nil {
		return Response{}, false, unavailable("idempotency retry failed", err)
	}
	if n == 0 {
		// the first attempt's seq is a recorded gap, never stored under it:
		// it timed out (the message was never stored), or persist dropped
		// its event as a duplicate of the message stored under another seq
		// (Redis had lost the record that would have answered that send).
		// MySQL tells which; only in the first case is this retry the
		// message's first real send, under its own event
		a.held = true
		if resp, done, err := a.askMySQL(ctx); done {
			return resp, false, err
		}
		if a.stored, err = message.Unallocated(&a.ev); err != nil {
			return Response{}, false, err
		}
		return Response{}, true, nil
	}
	resp, err := a.produce(context.WithoutCancel(ctx), &ev, raw, true)
	return resp, false, err
}

// produce waits for the broker's ack until the handler's deadline
// (ackDeadlines). Past it the answer is 503 and the promise is settled in
// the background: a late ack still marks the seq acked unless readers
// recorded it as a gap first; a failure leaves the event for a retry, and
// the seq becomes a gap once pending past the timeout
// (routing.Flight.Settled).
func (a *attempt) produce(ctx context.Context, ev *message.Event, raw []byte, dup bool) (Response, error) {
	s := a.s
	recordBy, answerBy := ackDeadlines(a.origin, s.p.Send.ProduceTimeout)
	done := s.prod.produce(ev.Key(), raw, recordBy)
	// the record's own deadline normally settles it first; this is the
	// backstop for a record the client may not fail yet (sent, unanswered)
	timer := time.NewTimer(time.Until(answerBy))
	defer timer.Stop()
	select {
	case err := <-done:
		return a.settle(ctx, ev, err, dup)
	case <-timer.C:
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_, _ = a.settle(ctx, ev, <-done, dup)
		}()
		a.log().Warn().Int64("seq", ev.SeqID).Msg("kafka produce timed out")
		return Response{}, unavailable("message queue did not acknowledge in time", nil)
	}
}

// settle finishes a produce. Only an ack the call after it recorded in
// time answers as a stored message: one that came after readers recorded
// the seq as a gap, or one that could not be recorded (the seq may still
// time out into a gap), answers 503, and a retry with the same
// client_msg_id re-produces the event or, once its seq is a gap, sends the
// message afresh under a new seq.
func (a *attempt) settle(ctx context.Context, ev *message.Event, err error, dup bool) (Response, error) {
	s := a.s
	if err != nil {
		a.log().Warn().Err(err).Int64("seq", ev.SeqID).Msg("kafka produce failed; the event stays for a retry")
		if ferr := s.p.Scripts.IdemFail.Exec(ctx, s.p.Redis, []string{a.key}, nil).Error(); ferr != nil {
			a.log().Warn().Err(ferr).Int64("seq", ev.SeqID).Msg("could not mark the idempotency record failed")
		}
		return Response{}, unavailable("message queue unavailable", err)
	}
	resp := responseOf(ev)
	// rendered once: the record keeps it in case Redis lost the record
	// meanwhile, and a first send answers with it
	body, err := resp.render()
	if err != nil {
		return Response{}, fmt.Errorf("send: response: %w", err)
	}
	testhook.CrashAfterAck()
	// detached: the call may carry other sends' acks with this one
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), postAckTimeout)
	defer cancel()
	reply, err := s.postAck(ctx, a, ev, body)
	switch {
	case err != nil:
		return Response{}, unavailable("could not record the message queue's acknowledgement; retry", err)
	case reply == sentAbandoned:
		s.m.postAck.WithLabelValues(stepLateAfterGap).Inc()
		a.log().Warn().Int64("seq", ev.SeqID).Msg("kafka acknowledged a send after its seq was recorded as a gap; persist drops the event and a retry sends the message under a new seq")
		return Response{}, unavailable("message queue did not acknowledge in time", nil)
	}
	resp.Duplicate = dup
	if !dup {
		resp.body = append(body, '\n')
	}
	return resp, nil
}

// sentAbandoned is the reply of the call after the ack (lua/fenced.lua,
// sent) when readers had recorded the seq as a gap before it; its other
// replies (1 cached and published, 2 stored already) both mean recorded.
const sentAbandoned = 0

// postAck records the ack and feeds the readers in one call, the library's
// sent function: record acked, seq no longer pending, hot cache, realtime
// publish — none of it once the seq was recorded as a gap (sentAbandoned),
// and the last two only while no change of the message can have committed
// before the call. The message is rendered once: the hot-cache member is
// the frame's inner object. resp is the 201 body the record keeps if Redis
// lost it since the send call. The hot cache never rolls anything back; a
// reader falls back to MySQL by seq.
func (s *Service) postAck(ctx context.Context, a *attempt, ev *message.Event, resp []byte) (int64, error) {
	buf, err := message.FromEvent(ev).AppendJSON(append(make([]byte, 0, 512+len(ev.Content)+len(ev.Head)), framePrefix...))
	if err != nil {
		return 0, fmt.Errorf("send: render message: %w", err)
	}
	frame := string(append(buf, '}'))
	member, hotTTL, hotMax := "", "0", "0"
	if hc := s.p.HotCache; hc.TTL > 0 && hc.MaxPerTopic > 0 {
		member, hotTTL, hotMax = frame[len(framePrefix):len(frame)-1], s.hotTTL, s.hotMax
	}
	keys := []string{a.key, a.keys.Pending(a.topic), a.keys.HotMessages(a.topic), a.keys.Realtime(a.topic),
		a.keys.MessagesVersion(a.topic), a.keys.Abandoned(a.topic)}
	args := []string{strconv.FormatInt(ev.SeqID, 10), s.idemTTL, string(resp), member, hotTTL, hotMax, a.pending, frame}
	reply, err := s.acks.do(ctx, a.tenant, keys, args)
	if err != nil {
		for _, step := range []string{stepIdempotency, stepPending, stepHotCache, stepPublish} {
			s.m.postAck.WithLabelValues(step).Inc()
		}
		a.log().Warn().Err(err).Int64("seq", ev.SeqID).Msg("recording the kafka acknowledgement failed; the send answers 503")
		return 0, fmt.Errorf("send: after the ack: %w", err)
	}
	return reply, nil
}

// sentCall is the batcher's call: the sent function for the sends laid end
// to end in keys and args, one reply each.
func (s *Service) sentCall(ctx context.Context, keys, args []string) ([]ackReply, error) {
	msgs, err := s.p.Scripts.Fenced.Sent(ctx, s.p.Redis, keys, args).ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]ackReply, len(msgs))
	for i := range msgs {
		if n, err := msgs[i].ToInt64(); err == nil {
			out[i].n = n
			continue
		}
		msg, _ := msgs[i].ToString()
		out[i].err = errors.New(msg)
	}
	return out, nil
}

// framePrefix opens a new message's realtime frame; the message and "}"
// close it.
const framePrefix = `{"type":"message","message":`

// release drops this attempt's claim if it holds one without an event.
func (a *attempt) release() {
	s := a.s
	ctx, cancel := context.WithTimeout(context.Background(), postAckTimeout)
	defer cancel()
	if err := s.p.Scripts.IdemRelease.Exec(ctx, s.p.Redis, []string{a.key}, []string{a.owner}).Error(); err != nil {
		a.log().Warn().Err(err).Msg("could not release the idempotency claim; it goes stale after the produce timeout")
	}
}

// fromMySQL answers a send Redis has no record of from what MySQL stored:
// the month tables' unique key (topic, from_user, client_msg_id) in the
// active month and the one before — a retry within send.idempotency_ttl
// cannot reach further back.
//
// The active month is Redis's copy of the one MySQL recorded last (every
// activation is recorded there first). A send asks MySQL mostly because
// Redis lost its memory, and the active month went with it; nothing puts
// it back until an allocation asks, which comes after this probe. So a
// missing copy is read from the record: taken as "no month", the probe
// would look nowhere and answer "no earlier send" for a stored message,
// giving its retry a second seq.
func (s *Service) fromMySQL(ctx context.Context, tenant, topic string, from int64, clientMsgID string) (Response, bool, error) {
	db, err := s.p.DBs.DB(ctx, tenant)
	if err != nil {
		return Response{}, false, err
	}
	sender := sq.Eq{"topic": topic, "from_user": from, "client_msg_id": clientMsgID}
	out := Response{Topic: topic}
	var created time.Time
	active, err := s.p.Allocator.ActiveMonth(ctx, tenant)
	if err == nil && active.IsZero() {
		active, err = routing.RecordedActive(ctx, db)
	}
	if err != nil {
		return Response{}, false, fmt.Errorf("send: dedup probe of %s: %w", tenant, err)
	}
	if active.IsZero() {
		// no month was ever activated: nothing was allocated, so nothing
		// is stored
		return Response{}, false, nil
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
		if errors.Is(err, sql.ErrNoRows) || routing.IsNoSuchTable(err) {
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
// message MySQL stored can still be retried without finding its record,
// i.e. from the newest such message's created_at plus
// send.idempotency_ttl on — at once if there is none (newestUnrecorded).
// MySQL holds every message sent before Redis's memory start only once
// persist passed that start by the produce timeout, which the send call
// checked before asking for this: the horizon is set only while the memory
// is still the one of start (idem_since). One computation per tenant at a
// time, in the background: until it lands, each send asks MySQL itself.
func (s *Service) establishHorizon(tenant, start string) {
	if _, busy := s.horizons.LoadOrStore(tenant, struct{}{}); busy {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.horizons.Delete(tenant)
		ctx, cancel := context.WithTimeout(context.Background(), postAckTimeout)
		defer cancel()
		if err := s.horizon(ctx, tenant, start); err != nil {
			s.p.Log.Warn().Err(err).Str("tenant", tenant).Msg("idempotency horizon not set; sends keep asking MySQL")
		}
	}()
}

func (s *Service) horizon(ctx context.Context, tenant, start string) error {
	keys, err := s.p.KeySpace.Tenant(tenant)
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
	ms, err := strconv.ParseInt(start, 10, 64)
	if err != nil {
		return fmt.Errorf("send: memory start %q: %w", start, err)
	}
	last, ok, err := s.newestUnrecorded(ctx, db, keys, tenant, active, time.UnixMilli(ms))
	if err != nil {
		return err
	}
	h := now
	if ttl := s.p.Send.IdempotencyTTL; ok && last.Add(ttl).After(now) {
		h = last.Add(ttl)
	}
	return s.p.Scripts.Fenced.IdemSince(ctx, s.p.Redis, []string{keys.IdemSince(), keys.IdemMemory()},
		[]string{strconv.FormatInt(h.UnixMilli(), 10), start}).Error()
}

// unrecordedBatch is how many stored messages newestUnrecorded checks for
// an idempotency record per round trip.
const unrecordedBatch = 500

// newestUnrecorded finds the created_at of the newest message MySQL stored
// that a retry could reach without finding its idempotency record, in the
// months fromMySQL probes (a retriable message lives in one of them).
//
// A message whose send call came after the memory start has its record
// (made by that call, kept for the idempotency TTL): only one sent before
// the start can lack it. The start is Redis time and a message's id and
// created_at are its API process's clock, so the messages stamped within
// the produce timeout of the start (the bound the send call already allows
// between a send's stamp and its call) are checked one by one for a
// record; every one stamped earlier counts without looking. Taking the
// newest stored message whatever its record instead would make the
// horizon a whole idempotency TTL away whenever messages were stored just
// after the start — a new tenant's first sends, or any tenant under
// traffic — and every send would ask MySQL for a day.
func (s *Service) newestUnrecorded(ctx context.Context, db *sql.DB, keys routing.Keys, tenant string, active routing.Month, start time.Time) (time.Time, bool, error) {
	slack := s.p.Send.ProduceTimeout
	idAt := func(t time.Time) int64 { return Compose(t.Sub(Epoch).Milliseconds(), 0, 0) }
	lo, hi := idAt(start.Add(-slack)), idAt(start.Add(slack+time.Millisecond))
	var newest time.Time
	for _, m := range []routing.Month{active, active.Prev()} {
		t, _, err := s.p.Catalog.Table(ctx, tenant, m)
		if errors.Is(err, routing.ErrShardNotRegistered) {
			continue
		}
		if err != nil {
			return time.Time{}, false, err
		}
		at, found, err := s.unrecordedNear(ctx, db, keys, t, lo, hi)
		if err == nil && !found {
			err = sq.Select("created_at").From(t.Quoted()).Where(sq.Lt{"message_id": lo}).
				OrderBy("message_id DESC").Limit(1).RunWith(db).QueryRowContext(ctx).Scan(&at)
			found = err == nil
			if errors.Is(err, sql.ErrNoRows) {
				err = nil
			}
		}
		if routing.IsNoSuchTable(err) {
			continue
		}
		if err != nil {
			return time.Time{}, false, fmt.Errorf("send: idempotency horizon from %s: %w", t.Name(), err)
		}
		if found && at.After(newest) {
			newest = at
		}
	}
	return newest, !newest.IsZero(), nil
}

// unrecordedNear walks table t's messages with ids in [lo, hi), newest
// first, and returns the created_at of the first without an idempotency
// record.
func (s *Service) unrecordedNear(ctx context.Context, db *sql.DB, keys routing.Keys, t routing.Table, lo, hi int64) (time.Time, bool, error) {
	type stored struct {
		id      int64
		created time.Time
		key     string
	}
	for {
		rows, err := sq.Select("message_id", "topic", "from_user", "client_msg_id", "created_at").From(t.Quoted()).
			Where(sq.And{sq.GtOrEq{"message_id": lo}, sq.Lt{"message_id": hi}}).
			OrderBy("message_id DESC").Limit(unrecordedBatch).RunWith(db).QueryContext(ctx)
		if err != nil {
			return time.Time{}, false, err
		}
		var batch []stored
		for rows.Next() {
			var m stored
			var topic, cmid string
			var from int64
			if err := rows.Scan(&m.id, &topic, &from, &cmid, &m.created); err != nil {
				rows.Close()
				return time.Time{}, false, err
			}
			m.key = keys.Idempotency(topic, from, cmid)
			batch = append(batch, m)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return time.Time{}, false, err
		}
		if len(batch) == 0 {
			return time.Time{}, false, nil
		}
		cmds := make(rueidis.Commands, len(batch))
		for i, m := range batch {
			cmds[i] = s.p.Redis.B().Exists().Key(m.key).Build()
		}
		for i, r := range s.p.Redis.DoMulti(ctx, cmds...) {
			n, err := r.AsInt64()
			if err != nil {
				return time.Time{}, false, err
			}
			if n == 0 {
				return batch[i].created, true, nil
			}
		}
		hi = batch[len(batch)-1].id
	}
}
