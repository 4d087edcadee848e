package message

import (
	"encoding/json"
	"testing"
	"time"
)

// benchMember is a hot-cache member as send writes it.
func benchMember(b *testing.B) []byte {
	b.Helper()
	at := NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456e6, time.UTC))
	m := Message{Topic: "g_12345", Seq: 123456, MessageID: 7394812734981234, GroupID: 42, FromUser: 1001,
		ClientMsgID: "c-8f3a2b", MsgType: "text", Status: StatusNormal,
		Content: json.RawMessage(`{"text":"see you at the station at eight, bring the tickets"}`),
		Version: 1, CreatedAt: at, UpdatedAt: at}
	raw, err := json.Marshal(m.Normalized())
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// The per-member costs of a hot-cache page: Peek passes the member through,
// DecodeJSON decodes it, AppendJSON renders a decoded one.
func BenchmarkPeek(b *testing.B) {
	raw := benchMember(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := Peek(raw); !ok {
			b.Fatal("not peeked")
		}
	}
}

func BenchmarkDecodeJSON(b *testing.B) {
	raw := benchMember(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeJSON(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	m, err := DecodeJSON(benchMember(b))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		if buf, err = m.AppendJSON(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// The event a send stores and produces: rendered by reflection, and by
// AppendJSON (what Unallocated uses).
func BenchmarkEventJSON(b *testing.B) {
	ev := Event{V: EventVersion, EventID: "9f86d081884c7d659a2feaa0", Tenant: "bench", Topic: "bench-topic-17",
		MessageID: 7394812734981234, FromUser: 12, ClientMsgID: "run-123456", MsgType: "text",
		Content:   json.RawMessage(`{"text":"see you at the station at eight, bring the tickets"}`),
		CreatedAt: NewTime(time.Date(2026, 11, 30, 1, 2, 3, 456e6, time.UTC))}
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Unallocated(&ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}
