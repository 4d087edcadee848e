package message

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestDecodeJSONIsUnmarshal(t *testing.T) {
	seq := int64(-7)
	at := NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456e6, time.UTC))
	base := Message{Topic: "g_1", Seq: 42, MessageID: 1 << 60, GroupID: 9, FromUser: -3, ClientMsgID: "c-1",
		MsgType: "text", Status: StatusNormal, Content: json.RawMessage(`{"text":"a,b}c]\"d"}`), Version: 2,
		CreatedAt: at, UpdatedAt: NewTime(at.Add(time.Hour))}
	encoded := func(change func(m *Message)) string {
		m := base
		change(&m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	canonical := map[string]string{
		"plain":      encoded(func(*Message) {}),
		"normalized": encoded(func(m *Message) { *m = m.Normalized() }),
		"tombstone":  encoded(func(m *Message) { m.Status = StatusDeleted; *m = m.Normalized() }),
		"nil fields": encoded(func(m *Message) { m.Content, m.Head, m.MentionedUserIDs = nil, nil, nil }),
		"full": encoded(func(m *Message) {
			m.Head = json.RawMessage(`[{"a":[1,{}]},"]"]`)
			m.MentionedUserIDs, m.MentionAll, m.ReplySeqID, m.RootSeqID = IDs{1, 0, -2}, true, &seq, &seq
		}),
		"zero": encoded(func(m *Message) { *m = Message{} }),
	}
	other := map[string]string{
		"escaped string":  encoded(func(m *Message) { m.Topic = "a\"b<" }),
		"non-ascii":       encoded(func(m *Message) { m.ClientMsgID = "ünï" }),
		"reordered":       `{"seq":5,"topic":"x"}`,
		"whitespace":      ` {"topic":"x"}`,
		"numbers as ids":  `{"topic":"x","seq":1,"message_id":5,"group_id":"007","from_user":"+1"}`,
		"leading zero":    `{"topic":"x","seq":01}`,
		"bad time":        `{"topic":"x","seq":1,"created_at":"yesterday"}`,
		"february 30":     `{"topic":"x","seq":1,"created_at":"2026-02-30T00:00:00.000Z"}`,
		"second 60":       `{"topic":"x","seq":1,"created_at":"2026-02-03T00:00:60.000Z"}`,
		"offset time":     `{"topic":"x","seq":1,"created_at":"2026-02-03T08:00:00.123456+08:00"}`,
		"bad content":     `{"topic":"x","seq":1,"message_id":"1","group_id":"1","from_user":"1","client_msg_id":"","msg_type":"","status":"","content":{"a":}`,
		"trailing":        encoded(func(*Message) {}) + "x",
		"truncated":       encoded(func(*Message) {})[:90],
		"float version":   `{"topic":"x","version":1.5}`,
		"not an object":   `[1]`,
		"empty":           ``,
		"unknown field":   `{"topic":"x","extra":1}`,
		"null ids member": `{"topic":"x","mentioned_user_ids":null}`,
	}
	check := func(name, in string, wantFast bool) {
		t.Run(name, func(t *testing.T) {
			var want Message
			werr := json.Unmarshal([]byte(in), &want)
			got, gerr := DecodeJSON([]byte(in))
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("error %v, json.Unmarshal's %v", gerr, werr)
			}
			if werr == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
			if _, fast := decodeCanonical([]byte(in)); fast != wantFast {
				t.Fatalf("read without reflection: %v, want %v", fast, wantFast)
			}
		})
	}
	for name, in := range canonical {
		check(name, in, true)
	}
	for name, in := range other {
		check(name, in, false)
	}
}
