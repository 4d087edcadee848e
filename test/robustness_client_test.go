package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/robustness"
)

// rbRequestTimeout bounds every request of the workload: no answer within
// it is an op with Status 0, whose effect is unknown.
const rbRequestTimeout = 3 * time.Second

// The token subjects of the workload's non-member roles.
const (
	rbService = int64(900) // groups and members (role service)
	rbAdmin   = int64(999) // deletes for everyone, admin walks (role admin)
)

// rbClient is the workload's side of the API: every request, answer and
// stream frame goes into the history.
type rbClient struct {
	t       *testing.T
	h       *robustness.History
	tenant  string
	secret  []byte
	bases   []string
	hc      *http.Client
	streams atomic.Int64

	mu     sync.Mutex
	tokens map[string]string
}

func newRBClient(t *testing.T, c *rbCluster, h *robustness.History) *rbClient {
	return &rbClient{t: t, h: h, tenant: c.tenant, secret: c.secret, bases: c.apis, tokens: map[string]string{},
		hc: &http.Client{Timeout: rbRequestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// token is uid's token, as a plain user unless role is set.
func (c *rbClient) token(uid int64, role string) string {
	key := fmt.Sprint(uid, role)
	c.mu.Lock()
	defer c.mu.Unlock()
	if tok, ok := c.tokens[key]; ok {
		return tok
	}
	tok, err := httpapi.Sign(c.secret, c.tenant, uid, role, time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	c.tokens[key] = tok
	return tok
}

// roleOf is the token role of a workload subject.
func rbRoleOf(uid int64) string {
	switch uid {
	case rbService:
		return "service"
	case rbAdmin:
		return "admin"
	}
	return ""
}

// call sends one request as op describes (on API process node), records
// it and returns the op with its answer; a 2xx body is decoded into out.
// as is the token's subject (op.User for every kind but join and leave).
func (c *rbClient) call(op robustness.Op, node int, as int64, method, path string, body, out any) robustness.Op {
	op.Tenant, op.Role, op.Start = c.tenant, rbRoleOf(as), time.Now()
	op.ID = c.h.Begin(op)
	id := op.ID
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	req, err := http.NewRequest(method, c.bases[node%len(c.bases)]+path, bytes.NewReader(raw))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token(as, rbRoleOf(as)))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	op.End = time.Now()
	if err != nil {
		op.Err = err.Error()
		c.h.Finish(id, op)
		return op
	}
	op.Status = resp.StatusCode
	harness.CheckExchange(c.t, req, raw, resp, answer)
	if op.Acked() && out != nil && len(answer) > 0 {
		if err := json.Unmarshal(answer, out); err != nil {
			op.Err = "decode: " + err.Error()
		}
	} else if !op.Acked() {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
				Details struct {
					CurrentVersion int64  `json:"current_version"`
					RetryAfterMS   int64  `json:"retry_after_ms"`
					Reason         string `json:"reason"`
				} `json:"details"`
			} `json:"error"`
		}
		_ = json.Unmarshal(answer, &e)
		op.Code, op.Err = e.Error.Code, e.Error.Message
		op.CurrentVersion, op.RetryAfterMS = e.Error.Details.CurrentVersion, e.Error.Details.RetryAfterMS
		op.Reason = e.Error.Details.Reason
	}
	c.h.Finish(id, op)
	return op
}

// rbMsg is a message of an answer or a frame as the history holds it.
func rbMsg(m message.Message) robustness.Msg {
	var content struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &content)
	return robustness.Msg{Topic: m.Topic, Seq: m.Seq, MessageID: strconv.FormatInt(int64(m.MessageID), 10),
		SenderID: int64(m.FromUser), ClientID: m.ClientMsgID, Status: m.Status, Version: int64(m.Version), Text: content.Text}
}

func rbMsgs(ms []message.Message) []robustness.Msg {
	out := make([]robustness.Msg, len(ms))
	for i, m := range ms {
		out[i] = rbMsg(m)
	}
	return out
}

func rbTopics(ts []rbInboxTopic) []robustness.TopicEntry {
	out := make([]robustness.TopicEntry, len(ts))
	for i, e := range ts {
		out[i] = robustness.TopicEntry{Topic: e.Topic, Removed: e.Removed, LastSeq: e.LastSeq, ReadSeq: e.ReadSeq,
			Unread: int64(e.Unread), UnreadCapped: e.UnreadCapped, MentionUnread: int64(e.MentionUnread)}
		if e.LastMessage != nil {
			m := rbMsg(*e.LastMessage)
			out[i].LastMessage = &m
		}
	}
	return out
}

// rbInboxTopic is an entry of the topic list, unread badges or sync.
type rbInboxTopic struct {
	Topic         string           `json:"topic"`
	Removed       bool             `json:"removed"`
	LastSeq       int64            `json:"last_seq"`
	LastMessage   *message.Message `json:"last_message"`
	ReadSeq       int64            `json:"read_seq"`
	Unread        int              `json:"unread"`
	UnreadCapped  bool             `json:"unread_capped"`
	MentionUnread int              `json:"mention_unread"`
}

func rbTopicPath(topic string) string { return "/v1/topics/" + url.PathEscape(topic) }

// send posts one text message; mentions and mentionAll are its
// mentioned_user_ids and mention_all (left out when empty).
func (c *rbClient) send(actor, node int, user int64, topic, cmid, text string, mentions []int64, mentionAll bool) robustness.Op {
	var r struct {
		Seq       int64      `json:"seq"`
		MessageID message.ID `json:"message_id"`
		Duplicate bool       `json:"duplicate"`
	}
	body := map[string]any{"client_msg_id": cmid, "msg_type": "text", "content": map[string]any{"text": text}}
	if len(mentions) > 0 {
		body["mentioned_user_ids"] = mentions
	}
	if mentionAll {
		body["mention_all"] = true
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.Send, Topic: topic, User: user, ClientMsgID: cmid, Text: text,
		Mentions: mentions, MentionAll: mentionAll},
		node, user, "POST", rbTopicPath(topic)+"/messages", body, &r)
	if op.Acked() {
		m := robustness.Msg{Topic: topic, Seq: r.Seq, MessageID: strconv.FormatInt(int64(r.MessageID), 10), SenderID: user,
			ClientID: cmid, Status: message.StatusNormal, Version: 1}
		if !r.Duplicate {
			m.Text = text
		}
		op.Messages = []robustness.Msg{m}
		c.h.Finish(op.ID, op)
	}
	return op
}

// change is a recall, edit or delete for everyone and its answer.
func (c *rbClient) change(op robustness.Op, node int, as int64, method, path string, body any) robustness.Op {
	var r struct {
		Message   message.Message `json:"message"`
		ChangeSeq int64           `json:"change_seq"`
	}
	op = c.call(op, node, as, method, path, body, &r)
	if op.Acked() {
		action := map[robustness.Kind]string{robustness.Recall: "recall", robustness.Edit: "edit", robustness.DeleteAll: "delete"}[op.Kind]
		op.Messages = []robustness.Msg{rbMsg(r.Message)}
		op.Change = &robustness.Change{Topic: op.Topic, Seq: op.Seq, MessageID: op.Messages[0].MessageID, Action: action,
			Version: int64(r.Message.Version), ChangeSeq: r.ChangeSeq}
		c.h.Finish(op.ID, op)
	}
	return op
}

func (c *rbClient) recall(actor, node int, user int64, topic string, seq int64) robustness.Op {
	return c.change(robustness.Op{Client: actor, Kind: robustness.Recall, Topic: topic, User: user, Seq: seq},
		node, user, "POST", fmt.Sprintf("%s/messages/%d/recall", rbTopicPath(topic), seq), map[string]any{})
}

func (c *rbClient) edit(actor, node int, user int64, topic string, seq, version int64, text string) robustness.Op {
	return c.change(robustness.Op{Client: actor, Kind: robustness.Edit, Topic: topic, User: user, Seq: seq, ExpectedVersion: version, Text: text},
		node, user, "PATCH", fmt.Sprintf("%s/messages/%d", rbTopicPath(topic), seq),
		map[string]any{"content": map[string]any{"text": text}, "expected_version": version})
}

func (c *rbClient) deleteAll(actor, node int, topic string, seq int64) robustness.Op {
	return c.change(robustness.Op{Client: actor, Kind: robustness.DeleteAll, Topic: topic, User: rbAdmin, Seq: seq},
		node, rbAdmin, "DELETE", fmt.Sprintf("%s/messages/%d?scope=all", rbTopicPath(topic), seq), nil)
}

// hide hides [low, hi) of topic for user.
func (c *rbClient) hide(actor, node int, user int64, topic string, low, hi int64) robustness.Op {
	return c.call(robustness.Op{Client: actor, Kind: robustness.Hide, Topic: topic, User: user, Seq: low, HideHi: hi},
		node, user, "POST", rbTopicPath(topic)+"/deletions", map[string]any{"low": low, "hi": hi}, nil)
}

// member adds (join) or removes (leave) user, as the service.
func (c *rbClient) member(actor, node int, topic string, user int64, join bool) robustness.Op {
	path := fmt.Sprintf("%s/members/%d", rbTopicPath(topic), user)
	if join {
		return c.call(robustness.Op{Client: actor, Kind: robustness.Join, Topic: topic, User: user},
			node, rbService, "PUT", path, map[string]any{"role": "member"}, nil)
	}
	return c.call(robustness.Op{Client: actor, Kind: robustness.Leave, Topic: topic, User: user}, node, rbService, "DELETE", path, nil, nil)
}

// group creates, reactivates (status active) or dissolves topic's group.
func (c *rbClient) group(actor, node int, topic string, gid int64, status string) robustness.Op {
	kind := robustness.GroupPut
	if status == "dissolved" {
		kind = robustness.Dissolve
	}
	return c.call(robustness.Op{Client: actor, Kind: kind, Topic: topic, User: rbService},
		node, rbService, "PUT", rbTopicPath(topic), map[string]any{"group_id": gid, "status": status}, nil)
}

// cursor moves user's read cursor of topic from device.
func (c *rbClient) cursor(actor, node int, user int64, device int, topic string, seq int64) robustness.Op {
	var r struct {
		ReadSeq int64 `json:"read_seq"`
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.CursorPut, Topic: topic, User: user, Device: device, Seq: seq},
		node, user, "PUT", rbTopicPath(topic)+"/read", map[string]any{"seq": seq}, &r)
	if op.Acked() {
		op.ReadSeq = r.ReadSeq
		c.h.Finish(op.ID, op)
	}
	return op
}

// since reads one page of topic above since.
func (c *rbClient) since(actor, node int, user int64, topic string, since int64, limit int) robustness.Op {
	var r struct {
		Messages  []message.Message `json:"messages"`
		NextSince int64             `json:"next_since"`
		HasMore   bool              `json:"has_more"`
		Gaps      []int64           `json:"gaps"`
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.PageSince, Topic: topic, User: user, Since: since, Limit: limit},
		node, user, "GET", fmt.Sprintf("%s/messages?since=%d&limit=%d", rbTopicPath(topic), since, limit), nil, &r)
	if op.Acked() {
		op.Messages, op.NextSince, op.HasMore, op.Gaps = rbMsgs(r.Messages), r.NextSince, r.HasMore, r.Gaps
		c.h.Finish(op.ID, op)
	}
	return op
}

// before reads one page of topic below before (0: the latest page).
func (c *rbClient) before(actor, node int, user int64, topic string, before int64, limit int) robustness.Op {
	var r struct {
		Messages []message.Message `json:"messages"`
		HasMore  bool              `json:"has_more"`
	}
	q := fmt.Sprintf("limit=%d", limit)
	if before > 0 {
		q += fmt.Sprintf("&before=%d", before)
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.PageBefore, Topic: topic, User: user, Before: before, Limit: limit},
		node, user, "GET", rbTopicPath(topic)+"/messages?"+q, nil, &r)
	if op.Acked() {
		op.Messages, op.HasMore = rbMsgs(r.Messages), r.HasMore
		c.h.Finish(op.ID, op)
	}
	return op
}

// one reads one message by seq (topic set) or by id.
func (c *rbClient) one(actor, node int, user int64, topic string, seq int64, id string) robustness.Op {
	var m message.Message
	op := robustness.Op{Client: actor, Kind: robustness.BySeq, Topic: topic, User: user, Seq: seq}
	path := fmt.Sprintf("%s/messages/%d", rbTopicPath(topic), seq)
	if id != "" {
		op = robustness.Op{Client: actor, Kind: robustness.ByID, User: user, MessageID: id}
		path = "/v1/messages/" + id
	}
	op = c.call(op, node, user, "GET", path, nil, &m)
	if op.Acked() {
		op.Messages = []robustness.Msg{rbMsg(m)}
		c.h.Finish(op.ID, op)
	}
	return op
}

// list reads user's topic list (one page holds every topic of a run).
func (c *rbClient) list(actor, node int, user int64) robustness.Op {
	var r struct {
		Topics []rbInboxTopic `json:"topics"`
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.List, User: user}, node, user, "GET", "/v1/me/topics?limit=200", nil, &r)
	if op.Acked() {
		op.Topics = rbTopics(r.Topics)
		c.h.Finish(op.ID, op)
	}
	return op
}

// unread reads user's badges.
func (c *rbClient) unread(actor, node int, user int64) robustness.Op {
	var r struct {
		Topics []rbInboxTopic `json:"topics"`
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.Unread, User: user}, node, user, "GET", "/v1/me/unread", nil, &r)
	if op.Acked() {
		op.Topics = rbTopics(r.Topics)
		c.h.Finish(op.ID, op)
	}
	return op
}

// sync reads user's changes since token (device's) and returns the next
// token ("" when the answer did not come).
func (c *rbClient) sync(actor, node int, user int64, device int, token string) (robustness.Op, string, bool) {
	var r struct {
		Topics  []rbInboxTopic `json:"topics"`
		Token   string         `json:"token"`
		HasMore bool           `json:"has_more"`
	}
	path := "/v1/me/sync?limit=200"
	if token != "" {
		path += "&token=" + url.QueryEscape(token)
	}
	op := c.call(robustness.Op{Client: actor, Kind: robustness.Sync, User: user, Device: device}, node, user, "GET", path, nil, &r)
	if op.Acked() {
		op.Topics, op.HasMore = rbTopics(r.Topics), r.HasMore
		c.h.Finish(op.ID, op)
		return op, r.Token, r.HasMore
	}
	return op, token, false
}

// rbCursors are what a stream client keeps per topic to resume with.
type rbCursors struct {
	seq     int64 // last message, gap or live seq
	changes int64 // last change_seq; -1 before the first
}

// rbControl is what a multi-topic socket's client sends while its frames
// are read: subscribe and unsubscribe requests, each passed to send, which
// records the op (Kind, Topic, Since, ChangesSince set by the caller) and
// then writes the frame. It returns when ctx ends.
type rbControl func(ctx context.Context, send func(op robustness.Op, frame any) error)

// stream opens one socket on path as user and records its frames until
// ctx ends, the socket ends or d passed; cursors are updated from the
// frames. A single-topic socket names its topic and cursors (-1: none
// passed) in open; a multi-topic one its topics, and ctl (nil: none) sends
// its requests meanwhile.
func (c *rbClient) stream(ctx context.Context, open robustness.Op, node int, path string, d time.Duration,
	cursors map[string]*rbCursors, ctl rbControl) {
	sid := c.streams.Add(1)
	user := open.User
	open.Kind, open.Tenant, open.Role, open.Stream = robustness.StreamOpen, c.tenant, rbRoleOf(user), sid
	open.Start = time.Now()
	id := c.h.Begin(open)
	dctx, cancel := context.WithTimeout(ctx, rbRequestTimeout)
	ws, resp, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(c.bases[node%len(c.bases)], "http")+path,
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + c.token(user, rbRoleOf(user))}}})
	cancel()
	if resp != nil {
		open.Status = resp.StatusCode
	}
	if err != nil {
		open.Err = err.Error()
		c.h.Finish(id, open)
		return
	}
	c.h.Finish(id, open)
	ws.SetReadLimit(1 << 22)
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	closing := robustness.Op{Client: open.Client, Kind: robustness.StreamClose, Tenant: c.tenant, User: user, Role: open.Role, Stream: sid, Topic: open.Topic}
	if ctl != nil {
		var wg sync.WaitGroup
		// the requests stop with the socket (cancel, then wait)
		defer wg.Wait()
		defer cancel()
		wg.Go(func() {
			ctl(rctx, func(op robustness.Op, frame any) error {
				raw, err := json.Marshal(frame)
				if err != nil {
					return err
				}
				op.Client, op.Tenant, op.User, op.Role, op.Stream = open.Client, c.tenant, user, open.Role, sid
				// recorded before it is written: every frame it causes
				// arrives after it
				c.h.Record(op)
				return ws.Write(rctx, websocket.MessageText, raw)
			})
		})
	}
	for {
		_, b, err := ws.Read(rctx)
		if err != nil {
			var ce websocket.CloseError
			switch {
			case errors.As(err, &ce):
				closing.CloseCode, closing.Err = int(ce.Code), ce.Reason
			case rctx.Err() != nil:
				closing.Err = "closed by the client"
			default:
				closing.Err = err.Error()
			}
			_ = ws.CloseNow()
			c.h.Record(closing)
			return
		}
		var f stFrame
		if err := json.Unmarshal(b, &f); err != nil {
			c.t.Errorf("stream frame %q: %v", b, err)
			continue
		}
		if f.Type == "ping" {
			continue
		}
		c.h.Record(rbFrameOp(closing, f, cursors))
	}
}

// rbFrameOp is frame f of a socket as an op (base carries the socket's
// ids), the socket's cursors moved past it.
func rbFrameOp(base robustness.Op, f stFrame, cursors map[string]*rbCursors) robustness.Op {
	op := base
	op.Kind, op.FrameType, op.Topic, op.Code = robustness.Frame, f.Type, f.Topic, f.Code
	seq, changes := int64(-1), int64(-1)
	switch f.Type {
	case "message":
		op.Topic, op.Seq, op.Messages = f.Message.Topic, f.Message.Seq, []robustness.Msg{rbMsg(f.Message)}
		seq = f.Message.Seq
	case "change":
		op.Topic, op.Seq = f.Change.Topic, f.Change.Seq
		op.Change = &robustness.Change{Topic: f.Change.Topic, Seq: f.Change.Seq, MessageID: strconv.FormatInt(int64(f.Change.MessageID), 10),
			Action: f.Change.Action, Version: int64(f.Change.Version), ChangeSeq: f.Change.ChangeSeq}
		changes = f.Change.ChangeSeq
	case "gap":
		op.GapFrom, op.GapTo = f.From, f.To
		seq = f.To
	case "live":
		op.Seq, op.ChangeSeq = f.Seq, f.ChangeSeq
		seq, changes = f.Seq, f.ChangeSeq
	case "reset":
		op.ChangeSeq = f.ChangeSeq
		changes = f.ChangeSeq
	case "read":
		op.Seq, op.ReadSeq = f.Seq, f.Seq
	}
	op.Start, op.End = time.Time{}, time.Time{}
	if cur := cursors[op.Topic]; cur != nil {
		cur.seq = max(cur.seq, seq)
		if changes >= 0 {
			cur.changes = changes
		}
	}
	return op
}
