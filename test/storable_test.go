package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// Content that storage would refuse is refused at the door (400, nothing
// allocated, nothing produced), and content at the limits is acknowledged,
// stored by MariaDB and read back byte-identical — from the hot cache and
// from the month table. client_msg_id values differing only by white space
// at the ends are refused instead of colliding in MariaDB's PAD SPACE
// collation while Redis sees two keys: nothing acknowledged is lost.
func TestSendRefusesWhatStorageRefuses(t *testing.T) {
	e := writepathStart(t, harness.Options{})
	const topic = "room"
	e.group(topic, 1, "active")
	e.member(topic, 1, "member", time.Time{})
	user := e.Token(1, "")
	deep := func(n int) string { return strings.Repeat(`{"a":`, n-1) + `{}` + strings.Repeat(`}`, n-1) }
	body := func(cmid, content, extra string) []byte {
		return []byte(`{"client_msg_id":"` + cmid + `","msg_type":"text","content":` + content + extra + `}`)
	}

	for _, tc := range []struct{ name, body, msg string }{
		{"content nested 32 deep", string(body("bad", deep(32), "")), "content nests objects and arrays deeper than 31 levels"},
		{"head nested 40 deep", string(body("bad", `{}`, `,"head":`+deep(40))), "head nests objects and arrays deeper than 31 levels"},
		{"lone surrogate", string(body("bad", `{"text":"\ud800"}`, "")), `body holds a lone UTF-16 surrogate escape (\ud800)`},
		{"invalid UTF-8", string(body("bad", "{\"text\":\"\xff\xfe\"}", "")), "body holds bytes that are not UTF-8"},
		{"repeated key in content", string(body("bad", `{"text":"a","text":"b"}`, "")), `body repeats the key "text" in one object`},
		{"repeated client_msg_id", `{"client_msg_id":"x",` + string(body("bad", `{}`, ""))[1:], `body repeats the key "client_msg_id" in one object`},
		{"wrong type", string(body("bad", `{}`, `,"reply_seqid":"7"`)), `field "reply_seqid": expected an integer, got string`},
	} {
		code, raw := e.Do("POST", "/v1/topics/"+topic+"/messages", user, []byte(tc.body))
		var r struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(raw, &r)
		if code != 400 || r.Error.Code != "invalid_argument" || r.Error.Message != tc.msg {
			t.Errorf("%s: %d %s, want 400 %q", tc.name, code, raw, tc.msg)
		}
	}
	if e.seqKeyExists(topic) {
		t.Fatal("a refused send allocated a seq")
	}

	// at the limits: acknowledged, stored, read back as stored
	good := []string{
		deep(31),
		`{"text":"😀 \ud83d\ude00 \u00e9 <b>&amp;</b> \u2028","n":[1e400,-0,0.5],"":{"x":null}}`,
		`{"a":1,"b":{"a":2},"c":[{"a":3},{"a":3}]}`,
	}
	var sent []sendResp
	for i, content := range good {
		code, r := e.send(user, topic, body(fmt.Sprint("ok-", i), content, `,"head":`+deep(31)))
		if code != 201 {
			t.Fatalf("%.40s: %d %+v", content, code, r)
		}
		sent = append(sent, r)
	}
	first := e.mustSend(user, topic, body("pad-1", `{"text":"one"}`, ""))
	for _, id := range []string{"pad-1 ", " pad-1", "pad-1\t", "pad-1\u00a0"} {
		if code, r := e.send(user, topic, body(id, `{"text":"two"}`, "")); code != 400 || r.Error.Code != "invalid_argument" {
			t.Errorf("client_msg_id %q: %d %+v, want 400", id, code, r)
		}
	}
	if code, r := e.send(user, topic, body("pad-1", `{"text":"retry"}`, "")); code != 200 || !r.Duplicate || r.Seq != first.Seq {
		t.Fatalf("retry of pad-1: %d %+v, want the first send %+v", code, r, first)
	}
	n := len(good) + 1
	persistWaitCount(t, e.Env, n, 20*time.Second, e.Start)

	// what each was stored as: the event's rendering of content and head
	want := map[int64][2][]byte{}
	for i, content := range good {
		c, _ := json.Marshal(json.RawMessage(content))
		h, _ := json.Marshal(json.RawMessage(deep(31)))
		want[sent[i].Seq] = [2][]byte{c, h}
	}
	want[first.Seq] = [2][]byte{[]byte(`{"text":"one"}`), []byte("null")}
	checkOne := func(from string, m message.Message) {
		t.Helper()
		w := want[m.Seq]
		if !bytes.Equal(m.Content, w[0]) || !bytes.Equal(m.Head, w[1]) {
			t.Errorf("%s: seq %d content %.60s head %.60s, stored %.60s %.60s", from, m.Seq, m.Content, m.Head, w[0], w[1])
		}
	}
	check := func(from string, msgs []message.Message) {
		t.Helper()
		if len(msgs) != n {
			t.Fatalf("%s: %d messages, want %d", from, len(msgs), n)
		}
		for _, m := range msgs {
			checkOne(from, m)
		}
	}
	ctx := context.Background()
	rows, err := e.DB.QueryContext(ctx, "SELECT seqid, content, COALESCE(head, 'null'), JSON_VALID(content) FROM "+
		"im_group_messages_"+e.Start.String()+" WHERE topic = ?", topic)
	if err != nil {
		t.Fatal(err)
	}
	var stored []message.Message
	for rows.Next() {
		var m message.Message
		var valid bool
		if err := rows.Scan(&m.Seq, &m.Content, &m.Head, &valid); err != nil || !valid {
			t.Fatalf("row: %v, json_valid %v", err, valid)
		}
		stored = append(stored, m)
	}
	rows.Close()
	check("month table", stored)
	check("hot cache", rpList(t, e.Env, 1, topic, nil).Messages)
	check("since page", rpList(t, e.Env, 1, topic, url.Values{"since": {"0"}}).Messages)
	if err := e.Redis.Do(ctx, e.Redis.B().Del().Key(e.Keys().HotMessages(topic)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	q := rpNoCopies(t, e.Env)
	check("MySQL", rpList(t, q, 1, topic, nil).Messages)
	for seq := range want {
		var one message.Message
		if code := rpGet(t, q, 1, "", fmt.Sprintf("/v1/topics/%s/messages/%d", topic, seq), &one); code != 200 {
			t.Fatalf("exact lookup of %d: %d", seq, code)
		}
		checkOne("exact lookup", one)
	}
	if dl := persistDeadLetters(t, e.Env); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
}
