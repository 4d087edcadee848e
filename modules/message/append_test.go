package message

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// plain is Message without its methods: encoding/json renders it by
// reflection, the reference AppendJSON must match byte for byte.
type plain Message

func TestAppendJSONIsMarshal(t *testing.T) {
	seq := int64(7)
	at := NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456789000, time.UTC))
	base := Message{Topic: "g_1", Seq: 42, MessageID: 1 << 60, GroupID: 9, FromUser: -3, ClientMsgID: "c-1",
		MsgType: "text", Status: StatusNormal, Content: json.RawMessage(`{"text":"hi"}`), Version: 2,
		CreatedAt: at, UpdatedAt: NewTime(at.Add(time.Hour))}
	cases := map[string]func(m *Message){
		"plain":      func(*Message) {},
		"normalized": func(m *Message) { *m = m.Normalized() },
		"tombstone":  func(m *Message) { m.Status = StatusRecalled; *m = m.Normalized() },
		"all nil":    func(m *Message) { m.Content, m.Head, m.MentionedUserIDs = nil, nil, nil },
		"full": func(m *Message) {
			m.Head = json.RawMessage(`{"a":[1,2,{"b":null}]}`)
			m.MentionedUserIDs, m.MentionAll, m.ReplySeqID, m.RootSeqID = IDs{1, 2, 1 << 62}, true, &seq, &seq
		},
		"escapes in strings": func(m *Message) {
			m.Topic, m.ClientMsgID, m.MsgType = "a\"b\\c", "<script>&\u2028\x01\xff", "ünï\tcode"
		},
		"content to compact and escape": func(m *Message) {
			m.Content = json.RawMessage(" { \"t\" : \"<b>&amp;</b>\u2028\" ,\n \"n\": [1, 2] } ")
		},
		"non-ascii content": func(m *Message) { m.Content = json.RawMessage(`{"t":"你好"}`) },
		"scalar content":    func(m *Message) { m.Content, m.Head = json.RawMessage(`"x"`), json.RawMessage(`12.5e3`) },
		"zero":              func(m *Message) { *m = Message{} },
		"far times": func(m *Message) {
			m.CreatedAt, m.UpdatedAt = NewTime(time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)), NewTime(time.Date(1, 2, 3, 4, 5, 6, 7e6, time.UTC))
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			m := base
			change(&m)
			want, err := json.Marshal(plain(m))
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.AppendJSON([]byte("prefix"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("got  %s\nwant prefix%s", got, want)
			}
		})
	}
	t.Run("invalid raw JSON fails as Marshal does", func(t *testing.T) {
		m := base
		m.Content = json.RawMessage(`{"t":`)
		if _, err := m.AppendJSON(nil); err == nil {
			t.Fatal("invalid content encoded")
		}
	})
}

func TestEventAppendJSONIsMarshal(t *testing.T) {
	seq := int64(7)
	base := Event{V: EventVersion, EventID: "e-1", Tenant: "acme", Topic: "g_1", GroupID: 9, SeqID: 42, ShardMonth: "202612",
		MessageID: 1 << 60, FromUser: 5, ClientMsgID: "c-1", MsgType: "text", Content: json.RawMessage(`{"text":"hi"}`),
		CreatedAt: NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456789000, time.UTC))}
	cases := map[string]func(e *Event){
		"plain": func(*Event) {},
		"full": func(e *Event) {
			e.Head = json.RawMessage(`{"a":[1,2,{"b":null}]}`)
			e.MentionedUserIDs, e.MentionAll, e.ReplySeqID, e.RootSeqID = IDs{1, 2, 1 << 62}, true, &seq, &seq
		},
		"empty, not nil, omitted": func(e *Event) { e.Head, e.MentionedUserIDs = json.RawMessage{}, IDs{} },
		"escapes in strings": func(e *Event) {
			e.Topic, e.ClientMsgID, e.MsgType, e.EventID = "a\"b\\c", "<script>&\u2028\x01\xff", "ünï\tcode", "\x7f"
		},
		"content to compact and escape": func(e *Event) {
			e.Content = json.RawMessage(" { \"t\" : \"<b>&amp;</b>\u2028\" ,\n \"n\": [1, 2] } ")
		},
		"nil content": func(e *Event) { e.Content = nil },
		"unallocated": func(e *Event) { e.GroupID, e.SeqID, e.ShardMonth = 0, 0, "" },
		"zero":        func(e *Event) { *e = Event{} },
		"negative and far": func(e *Event) {
			e.SeqID, e.FromUser, e.CreatedAt = -1, -2, NewTime(time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC))
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			e := base
			change(&e)
			want, err := json.Marshal(&e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.AppendJSON([]byte("prefix"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("got  %s\nwant prefix%s", got, want)
			}
		})
	}
	e := base
	e.Content = json.RawMessage(`{"t":`)
	if _, err := e.AppendJSON(nil); err == nil {
		t.Fatal("invalid content encoded")
	}
}

func TestTimeUnmarshalEscaped(t *testing.T) {
	var a, b Time
	if err := json.Unmarshal([]byte(`"2026-11-30T01:02:03.456Z"`), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`"2026-11-30T01:02:03.456\u005a"`), &b); err != nil {
		t.Fatal(err)
	}
	if !a.Equal(b.Time) || a.UnixMilli() != time.Date(2026, 11, 30, 1, 2, 3, 456e6, time.UTC).UnixMilli() {
		t.Fatalf("%v %v", a, b)
	}
	if err := json.Unmarshal([]byte(`"2026-11-30"`), &a); err == nil {
		t.Fatal("a date alone is no time")
	}
}
