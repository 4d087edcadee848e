package message

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// baseEvent is an event as a send produces it.
func baseEvent() Event {
	return Event{V: EventVersion, EventID: "9f86d081884c7d659a2feaa0", Tenant: "acme", Topic: "room-42", GroupID: 7, SeqID: 1234,
		ShardMonth: "202611", MessageID: 386074973275820032, FromUser: 42, ClientMsgID: "c-123", MsgType: "text",
		Content:   json.RawMessage(`{"text":"a,b}c]\"d"}`),
		CreatedAt: NewTime(time.Date(2026, 11, 30, 23, 59, 59, 998e6, time.UTC))}
}

func marshalEvent(t testing.TB, change func(e *Event)) string {
	t.Helper()
	e := baseEvent()
	change(&e)
	b, err := json.Marshal(&e)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// decodeAgrees checks DecodeEvent against json.Unmarshal into a zero
// Event: both refuse in, or both give the same event. It reports whether
// the canonical reader took it.
func decodeAgrees(t *testing.T, in []byte) bool {
	t.Helper()
	var want Event
	werr := json.Unmarshal(in, &want)
	// a used event, so that nothing of it may leak into the result
	got := baseEvent()
	got.Head, got.MentionedUserIDs, got.ReplySeqID = json.RawMessage(`{"old":1}`), IDs{9}, new(int64)
	gerr := DecodeEvent(in, &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%q: error %v, json.Unmarshal's %v", in, gerr, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\ngot  %+v\nwant %+v", in, got, want)
	}
	var e Event
	return decodeEventCanonical(in, &e)
}

func TestDecodeEventIsUnmarshal(t *testing.T) {
	seq, root := int64(17), int64(-12)
	canonical := map[string]string{
		"plain": marshalEvent(t, func(*Event) {}),
		"full": marshalEvent(t, func(e *Event) {
			e.Head = json.RawMessage(`{"quote":[1,{"b":null}],"x":"]"}`)
			e.MentionedUserIDs, e.MentionAll, e.ReplySeqID, e.RootSeqID = IDs{43, 0, -2}, true, &seq, &root
		}),
		"empty head":         marshalEvent(t, func(e *Event) { e.Head = json.RawMessage(`{}`) }),
		"mentions only":      marshalEvent(t, func(e *Event) { e.MentionedUserIDs = IDs{1} }),
		"root only":          marshalEvent(t, func(e *Event) { e.RootSeqID = &root }),
		"unallocated":        marshalEvent(t, func(e *Event) { e.GroupID, e.SeqID, e.ShardMonth = 0, 0, "" }),
		"empty strings":      marshalEvent(t, func(e *Event) { e.EventID, e.Tenant, e.Topic, e.ClientMsgID, e.MsgType = "", "", "", "", "" }),
		"escaped body":       marshalEvent(t, func(e *Event) { e.Content = json.RawMessage(`{"t":"<b>&amp;</b>\u2028"}`) }),
		"empty mentions":     strings.Replace(marshalEvent(t, func(*Event) {}), `,"mention_all"`, `,"mentioned_user_ids":[],"mention_all"`, 1),
		"empty content":      marshalEvent(t, func(e *Event) { e.Content = json.RawMessage(`{}`) }),
		"non-ASCII body":     marshalEvent(t, func(e *Event) { e.Content = json.RawMessage(`{"t":"你好","u":"\ud83d\ude00"}`) }),
		"other version":      marshalEvent(t, func(e *Event) { e.V = 2 }),
		"year zero":          marshalEvent(t, func(e *Event) { e.CreatedAt = NewTime(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)) }),
		"null seqs":          strings.Replace(marshalEvent(t, func(*Event) {}), `,"created_at"`, `,"reply_seqid":null,"root_seqid":null,"created_at"`, 1),
		"negative zero":      strings.Replace(marshalEvent(t, func(*Event) {}), `"seq_id":1234`, `"seq_id":-0`, 1),
		"invalid UTF-8 body": strings.Replace(marshalEvent(t, func(*Event) {}), `a,b`, "\xff\xfe", 1),
	}
	base := marshalEvent(t, func(*Event) {})
	other := map[string]string{
		"escaped string":     marshalEvent(t, func(e *Event) { e.ClientMsgID = `a"b` }),
		"non-ASCII string":   marshalEvent(t, func(e *Event) { e.ClientMsgID = "ünï" }),
		"invalid UTF-8 id":   strings.Replace(base, `"c-123"`, "\"c-\xff\"", 1),
		"escaped key":        strings.Replace(base, `"tenant"`, `"tena\u006et"`, 1),
		"upper-case key":     strings.Replace(base, `"tenant"`, `"Tenant"`, 1),
		"reordered":          `{"tenant":"acme","v":1}`,
		"repeated key":       strings.Replace(base, `"v":1,`, `"v":1,"v":2,`, 1),
		"unknown field":      strings.Replace(base, `"v":1,`, `"v":1,"extra":[1],`, 1),
		"whitespace":         " " + base,
		"trailing space":     base + " ",
		"trailing":           base + "x",
		"two values":         base + base,
		"truncated":          base[:len(base)-1],
		"numbers as ids":     strings.Replace(base, `"group_id":"7"`, `"group_id":7`, 1),
		"padded id":          strings.Replace(base, `"group_id":"7"`, `"group_id":"+7"`, 1),
		"leading zero id":    strings.Replace(base, `"group_id":"7"`, `"group_id":"07"`, 1),
		"leading zero":       strings.Replace(base, `"seq_id":1234`, `"seq_id":01234`, 1),
		"float seq":          strings.Replace(base, `"seq_id":1234`, `"seq_id":1234.0`, 1),
		"exponent seq":       strings.Replace(base, `"seq_id":1234`, `"seq_id":1e3`, 1),
		"huge seq":           strings.Replace(base, `"seq_id":1234`, `"seq_id":99999999999999999999`, 1),
		"string seq":         strings.Replace(base, `"seq_id":1234`, `"seq_id":"1234"`, 1),
		"null content":       strings.Replace(base, `"content":{"text":"a,b}c]\"d"}`, `"content":null`, 1),
		"string content":     strings.Replace(base, `"content":{"text":"a,b}c]\"d"}`, `"content":"x"`, 1),
		"spaced content":     strings.Replace(base, `"content":{"text"`, `"content":{ "text"`, 1),
		"bad content":        strings.Replace(base, `"content":{"text"`, `"content":{{"text"`, 1),
		"no content":         strings.Replace(base, `"content":{"text":"a,b}c]\"d"},`, ``, 1),
		"null head":          strings.Replace(base, `,"mention_all"`, `,"head":null,"mention_all"`, 1),
		"array head":         strings.Replace(base, `,"mention_all"`, `,"head":[1],"mention_all"`, 1),
		"null mentions":      strings.Replace(base, `,"mention_all"`, `,"mentioned_user_ids":null,"mention_all"`, 1),
		"number mention":     strings.Replace(base, `,"mention_all"`, `,"mentioned_user_ids":[1],"mention_all"`, 1),
		"nested mentions":    strings.Replace(base, `,"mention_all"`, `,"mentioned_user_ids":[["1"]],"mention_all"`, 1),
		"bad mention":        strings.Replace(base, `,"mention_all"`, `,"mentioned_user_ids":["1]"],"mention_all"`, 1),
		"string bool":        strings.Replace(base, `"mention_all":false`, `"mention_all":"false"`, 1),
		"no created_at":      strings.Replace(base, `,"created_at":"2026-11-30T23:59:59.998Z"`, ``, 1),
		"offset time":        strings.Replace(base, `59.998Z`, `59.998+00:00`, 1),
		"nanosecond time":    strings.Replace(base, `59.998Z`, `59.998123Z`, 1),
		"february 30":        strings.Replace(base, `2026-11-30`, `2026-02-30`, 1),
		"bad time":           strings.Replace(base, `2026-11-30T23:59:59.998Z`, `yesterday`, 1),
		"optional reordered": strings.Replace(marshalEvent(t, func(e *Event) { e.RootSeqID, e.ReplySeqID = &seq, &root }), `"reply_seqid":-12,"root_seqid":17`, `"root_seqid":17,"reply_seqid":-12`, 1),
		"not an object":      `[1]`,
		"null":               `null`,
		"empty":              ``,
	}
	for name, in := range canonical {
		t.Run(name, func(t *testing.T) {
			if !decodeAgrees(t, []byte(in)) {
				t.Fatalf("%s: not read by the canonical reader", in)
			}
		})
	}
	for name, in := range other {
		t.Run(name, func(t *testing.T) {
			if decodeAgrees(t, []byte(in)) {
				t.Fatalf("%s: read by the canonical reader", in)
			}
		})
	}
}

// The decoded content and head must not share the input: persist keeps
// events after the record's buffer is gone, and a caller may reuse it.
func TestDecodeEventCopies(t *testing.T) {
	in := []byte(marshalEvent(t, func(e *Event) { e.Head = json.RawMessage(`{"h":1}`) }))
	var e Event
	if err := DecodeEvent(in, &e); err != nil {
		t.Fatal(err)
	}
	want := baseEvent()
	if string(e.Content) != string(want.Content) {
		t.Fatalf("content %s, want %s", e.Content, want.Content)
	}
	for i := range in {
		in[i] = 'x'
	}
	if string(e.Content) != string(want.Content) || string(e.Head) != `{"h":1}` || e.Topic != want.Topic || e.ClientMsgID != want.ClientMsgID {
		t.Fatalf("decoded event changed with its input: %+v", e)
	}
	if e.Content = append(e.Content, '!'); string(e.Head) != `{"h":1}` {
		t.Fatalf("appending to content overwrote head: %s", e.Head)
	}
}

// FuzzEventDecode: whatever the bytes, DecodeEvent refuses them as
// json.Unmarshal does or gives the very event it gives.
func FuzzEventDecode(f *testing.F) {
	seq := int64(5)
	f.Add([]byte(marshalEvent(f, func(*Event) {})))
	f.Add([]byte(marshalEvent(f, func(e *Event) {
		e.Head, e.MentionedUserIDs, e.MentionAll, e.ReplySeqID, e.RootSeqID = json.RawMessage(`{"q":[1]}`), IDs{3, 4}, true, &seq, &seq
	})))
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, in []byte) {
		decodeAgrees(t, in)
	})
}

// The cost of one event as persist reads it: by reflection (json.Unmarshal)
// and by DecodeEvent.
func BenchmarkEventDecode(b *testing.B) {
	in := []byte(marshalEvent(b, func(*Event) {}))
	b.Run("unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		b.ReportAllocs()
		for b.Loop() {
			var e Event
			if err := json.Unmarshal(in, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		b.ReportAllocs()
		for b.Loop() {
			var e Event
			if err := DecodeEvent(in, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
}
