package bench

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/imshard/imshard/lua"
)

// reference is the yardstick of `imshard bench send`: the simplest send
// that still keeps the send contract, written here from plain Redis and
// Kafka client calls and none of the product's send code. Per request: the
// HS256 token checked by hand, a strict JSON decode, an in-process
// membership map, ONE script call (lua/bench_send.lua: claim, stored
// request, seq, month, pending mark), the produce awaited (the send path's
// producer settings), ONE pipeline after the ack (record done, pending
// cleared, hot cache, publish), 201. A duplicate answers 200 with the
// original seq. It leaves out what the product adds on top: the durable
// seq reservation and its fencing, a membership that can change, the
// settled watermark's gap handling, Snowflake ids.
type reference struct {
	rdb     rueidis.Client
	cl      *kgo.Client
	script  *rueidis.Lua
	secret  []byte
	tenant  string
	prefix  string // routing.Keys.BenchReference: the run's keys start here
	topics  []string
	members map[string]bool // "topic/uid"
	nextID  atomic.Int64
	month   string // the month when none is set (the Redis key is not)
	ttl     string // idempotency TTL, seconds

	srv *http.Server
	url string
}

func startReference(p SendParams, prefix, run string, topics int) (*reference, error) {
	cl, err := kgo.NewClient(p.Producer...)
	if err != nil {
		return nil, err
	}
	r := &reference{rdb: p.Redis, cl: cl, script: rueidis.NewLuaScript(lua.BenchSend), secret: p.Secret,
		tenant: p.Tenant, prefix: prefix, members: map[string]bool{},
		month: time.Now().UTC().Format("200601"), ttl: "86400"}
	r.nextID.Store(time.Now().UnixMilli() << 22)
	for i := range topics {
		t := fmt.Sprintf("ref-%s-%d", run, i)
		r.topics = append(r.topics, t)
		for u := 1; u <= benchMembers; u++ {
			r.members[t+"/"+strconv.Itoa(u)] = true
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cl.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/topics/{topic}/messages", r.send)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	r.url = "http://" + ln.Addr().String()
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *reference) close() {
	_ = r.srv.Close()
	r.cl.Close()
}

func (r *reference) idemKey(topic string, uid int64, clientMsgID string) string {
	return r.prefix + "idem:" + topic + ":" + strconv.FormatInt(uid, 10) + ":" + clientMsgID
}

// verify checks an HS256 token by hand: signature, tenant, expiry.
func (r *reference) verify(tok string) (sub string, ok bool) {
	i := strings.LastIndexByte(tok, '.')
	j := strings.IndexByte(tok, '.')
	if i <= j || j < 0 {
		return "", false
	}
	m := hmac.New(sha256.New, r.secret)
	m.Write([]byte(tok[:i]))
	sig, err := base64.RawURLEncoding.DecodeString(tok[i+1:])
	if err != nil || !hmac.Equal(sig, m.Sum(nil)) {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(tok[j+1 : i])
	if err != nil {
		return "", false
	}
	var c struct {
		Tid string `json:"tid"`
		Sub string `json:"sub"`
		Exp int64  `json:"exp"`
	}
	if json.Unmarshal(payload, &c) != nil || c.Tid != r.tenant || c.Exp < time.Now().Unix() {
		return "", false
	}
	return c.Sub, true
}

type refRequest struct {
	ClientMsgID string          `json:"client_msg_id"`
	MsgType     string          `json:"msg_type"`
	Content     json.RawMessage `json:"content"`
}

type refEvent struct {
	Tenant      string          `json:"tenant"`
	Topic       string          `json:"topic"`
	Seq         int64           `json:"seq_id"`
	Month       string          `json:"shard_month"`
	MessageID   string          `json:"message_id"`
	FromUser    string          `json:"from_user"`
	ClientMsgID string          `json:"client_msg_id"`
	MsgType     string          `json:"msg_type"`
	Content     json.RawMessage `json:"content"`
	CreatedAt   string          `json:"created_at"`
}

func (r *reference) send(w http.ResponseWriter, req *http.Request) {
	fail := func(code int, msg string) {
		http.Error(w, `{"error":{"code":"`+msg+`"}}`, code)
	}
	sub, ok := r.verify(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "))
	if !ok {
		fail(http.StatusUnauthorized, "unauthenticated")
		return
	}
	topic := req.PathValue("topic")
	if !r.members[topic+"/"+sub] {
		fail(http.StatusForbidden, "permission_denied")
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<10))
	if err != nil {
		fail(http.StatusBadRequest, "invalid_argument")
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var in refRequest
	if dec.Decode(&in) != nil || in.ClientMsgID == "" || !json.Valid(in.Content) {
		fail(http.StatusBadRequest, "invalid_argument")
		return
	}
	ctx := req.Context()
	uid, _ := strconv.ParseInt(sub, 10, 64)
	idem, pending := r.idemKey(topic, uid, in.ClientMsgID), r.prefix+"pending:"+topic
	id := strconv.FormatInt(r.nextID.Add(1), 10)
	at := time.Now().UTC().Format(time.RFC3339Nano)
	reply, err := r.script.Exec(ctx, r.rdb, []string{idem, r.prefix + "seq:" + topic, r.prefix + "active_month", pending},
		[]string{id, at, string(body), r.ttl, strconv.FormatInt(time.Now().UnixMilli(), 10), r.month}).ToArray()
	if err != nil {
		fail(http.StatusServiceUnavailable, "unavailable")
		return
	}
	first, _ := reply[0].AsInt64()
	if first < 0 {
		mid, _ := reply[1].ToString()
		seq, _ := reply[2].ToString()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"topic":%q,"seq":%s,"message_id":%q,"duplicate":true}`, topic, seq, mid)
		return
	}
	month, _ := reply[3].ToString()
	ev, _ := json.Marshal(refEvent{Tenant: r.tenant, Topic: topic, Seq: first, Month: month, MessageID: id, FromUser: sub,
		ClientMsgID: in.ClientMsgID, MsgType: in.MsgType, Content: in.Content, CreatedAt: at})
	if err := r.cl.ProduceSync(ctx, &kgo.Record{Key: []byte(r.tenant + "/" + topic), Value: ev}).FirstErr(); err != nil {
		fail(http.StatusServiceUnavailable, "unavailable")
		return
	}
	seq, hot := strconv.FormatInt(first, 10), r.prefix+"hot:"+topic
	var errs []error
	for _, res := range r.rdb.DoMulti(context.WithoutCancel(ctx),
		r.rdb.B().Hset().Key(idem).FieldValue().FieldValue("st", "done").Build(),
		r.rdb.B().Zrem().Key(pending).Member(seq).Build(),
		r.rdb.B().Zadd().Key(hot).ScoreMember().ScoreMember(float64(first), string(ev)).Build(),
		r.rdb.B().Pexpire().Key(hot).Milliseconds(24*time.Hour.Milliseconds()).Build(),
		r.rdb.B().Spublish().Channel(r.prefix+"rt:"+topic).Message(seq).Build()) {
		errs = append(errs, res.Error())
	}
	if err := errors.Join(errs...); err != nil {
		fail(http.StatusServiceUnavailable, "unavailable")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"topic":%q,"seq":%d,"message_id":%q,"shard_month":%q,"created_at":%q,"duplicate":false}`, topic, first, id, month, at)
}
