package message

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
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
		b, err := json.Marshal(plain(m))
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

// peekAgrees checks a peeked member against its full decoding: the same
// seq, version, updated_at, sender and mentions, and, as a page's message,
// a rendering equal to the decoded, normalized message's.
func peekAgrees(t *testing.T, in []byte, p Peeked) {
	t.Helper()
	full, err := DecodeJSON(in)
	if err != nil {
		t.Fatalf("%s peeked but does not decode: %v", in, err)
	}
	full = full.Normalized()
	m := p.Message()
	if m.Seq != full.Seq || m.Version != full.Version || !m.UpdatedAt.Equal(full.UpdatedAt.Time) || m.Status != full.Status ||
		m.FromUser != full.FromUser || m.MentionAll != full.MentionAll || !slices.Equal(m.MentionedUserIDs, full.MentionedUserIDs) {
		t.Fatalf("peek %+v, decoded %+v", p, full)
	}
	got, err := m.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := full.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal(want, &b) != nil || !reflect.DeepEqual(a, b) {
		t.Fatalf("peeked rendering\n%s\ndecoded rendering\n%s", got, want)
	}
}

func TestPeek(t *testing.T) {
	seq := int64(3)
	at := NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456e6, time.UTC))
	base := Message{Topic: "g_1", Seq: 42, MessageID: 1 << 60, GroupID: 9, FromUser: 3, ClientMsgID: "c-1",
		MsgType: "text", Status: StatusNormal, Content: json.RawMessage(`{"text":"a,b}c]\"d <&>"}`), Version: 2,
		CreatedAt: at, UpdatedAt: NewTime(at.Add(time.Hour))}
	encoded := func(change func(m *Message)) []byte {
		m := base
		change(&m)
		b, err := json.Marshal(plain(m))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, in := range map[string][]byte{
		"normalized": encoded(func(m *Message) { *m = m.Normalized() }),
		"full": encoded(func(m *Message) {
			m.Head = json.RawMessage(`[{"a":[1,{}]},"]"]`)
			m.MentionedUserIDs, m.MentionAll, m.ReplySeqID, m.RootSeqID = IDs{1, 2}, true, &seq, &seq
		}),
		"null content": encoded(func(m *Message) { m.Content, m.MentionedUserIDs = nil, IDs{} }),
	} {
		t.Run(name, func(t *testing.T) {
			p, ok := Peek(in)
			if !ok {
				t.Fatalf("%s not peeked", in)
			}
			m := p.Message()
			if string(m.Encoded) != string(in) {
				t.Fatal("the member is not passed through as it is")
			}
			if r, _ := m.AppendJSON([]byte("x")); string(r) != "x"+string(in) {
				t.Fatalf("AppendJSON wrote %s", r)
			}
			if r, _ := json.Marshal(m); string(r) != string(in) {
				t.Fatalf("json.Marshal wrote %s", r)
			}
			if n := m.Normalized(); string(n.Encoded) != string(in) {
				t.Fatal("Normalized dropped the rendering")
			}
			peekAgrees(t, in, p)
		})
	}
	for name, in := range map[string]string{
		"tombstone":      string(encoded(func(m *Message) { m.Status = StatusRecalled })),
		"null mentions":  string(encoded(func(m *Message) { m.MentionedUserIDs = nil })),
		"escaped string": string(encoded(func(m *Message) { m.ClientMsgID = "a\"b" })),
		"offset time":    strings.Replace(string(encoded(func(*Message) {})), "04.456Z", "04.456+00:00", 1),
		"trailing":       string(encoded(func(*Message) {})) + " ",
		"truncated":      string(encoded(func(*Message) {}))[:120],
		"reordered":      `{"seq":5,"topic":"x"}`,
		"bad content":    strings.Replace(string(encoded(func(*Message) {})), `"content":{`, `"content":{{`, 1),
		"empty":          ``,
	} {
		if _, ok := Peek([]byte(in)); ok {
			t.Errorf("%s: %s peeked", name, in)
		}
	}
}

// FuzzPeek: whatever Peek accepts decodes to the same seq, version,
// update time, sender and mentions, and renders as the decoded message does; nothing panics.
func FuzzPeek(f *testing.F) {
	at := NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456e6, time.UTC))
	m := Message{Topic: "t", Seq: 7, MessageID: 1, GroupID: 2, FromUser: 3, MsgType: "text", Status: StatusNormal,
		Content: json.RawMessage(`{"text":"hi"}`), MentionedUserIDs: IDs{5}, Version: 1, CreatedAt: at, UpdatedAt: at}
	b, _ := json.Marshal(plain(m))
	f.Add(b)
	f.Add([]byte(`{"topic":"x"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		if p, ok := Peek(in); ok {
			peekAgrees(t, in, p)
		}
	})
}

// TestParseTimeIsTimeParse: the fast time reader accepts exactly what
// time.Parse accepts of TimeFormat in UTC, to the same instant.
func TestParseTimeIsTimeParse(t *testing.T) {
	for _, s := range []string{
		"2026-11-30T01:02:03.456Z", "2024-02-29T00:00:00.000Z", "2000-02-29T23:59:59.999Z", "0000-01-01T00:00:00.000Z",
		"2100-02-29T00:00:00.000Z", "2026-02-29T00:00:00.000Z", "2026-04-31T00:00:00.000Z", "2026-12-31T00:00:00.000Z",
		"2026-13-01T00:00:00.000Z", "2026-00-10T00:00:00.000Z", "2026-01-00T00:00:00.000Z", "2026-01-01T24:00:00.000Z",
		"2026-01-01T00:60:00.000Z", "2026-01-01T00:00:60.000Z", "2026-01-01T00:00:00.000+00:00", "2026-1-01T00:00:00.0000Z",
	} {
		want, werr := time.Parse(time.RFC3339Nano, s)
		got, ok := parseTime([]byte(s))
		if ok && (werr != nil || !got.Equal(want)) {
			t.Errorf("%s: read as %v, time.Parse: %v %v", s, got, want, werr)
		}
		if !ok && werr == nil && len(s) == len(TimeFormat)-5 && s[23] == 'Z' {
			t.Errorf("%s: refused, time.Parse reads it", s)
		}
	}
}
