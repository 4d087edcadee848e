package message

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestIDJSON(t *testing.T) {
	var ids IDs
	if err := json.Unmarshal([]byte(`["9007199254740993", 12, "0"]`), &ids); err != nil {
		t.Fatal(err)
	}
	if ids[0] != 9007199254740993 || ids[1] != 12 {
		t.Fatalf("ids = %v", ids)
	}
	out, _ := json.Marshal(ID(9007199254740993))
	if string(out) != `"9007199254740993"` {
		t.Fatalf("64-bit ids must travel as strings, got %s", out)
	}
	for _, bad := range []string{`"x"`, `1.5`, `"1e3"`, `true`, `"9223372036854775808"`} {
		var id ID
		if err := json.Unmarshal([]byte(bad), &id); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestTimeJSON(t *testing.T) {
	tm := NewTime(time.Date(2026, 10, 1, 0, 0, 0, 123456789, time.FixedZone("x", 8*3600)))
	out, _ := json.Marshal(tm)
	if string(out) != `"2026-09-30T16:00:00.123Z"` {
		t.Fatalf("time = %s", out)
	}
	var back Time
	if err := json.Unmarshal(out, &back); err != nil || !back.Equal(tm.Time) {
		t.Fatalf("round trip %v %v", back, err)
	}
}

func TestTombstonesCarryNoContent(t *testing.T) {
	m := Message{Status: StatusRecalled, Content: json.RawMessage(`{"text":"secret"}`), MentionedUserIDs: IDs{1}}
	out, _ := json.Marshal(m.Normalized())
	if strings.Contains(string(out), "secret") || !strings.Contains(string(out), `"content":null`) {
		t.Fatalf("recalled message leaks content: %s", out)
	}
	ev := &Event{Tenant: "acme", Topic: "g", SeqID: 7, Content: json.RawMessage(`{"text":"hi"}`)}
	if string(ev.Key()) != "acme/g" {
		t.Fatal("event key must be tenant/topic")
	}
	if got := FromEvent(ev); got.Status != StatusNormal || got.Version != 1 || string(got.Head) != "null" {
		t.Fatalf("FromEvent = %+v", got)
	}
}

func FuzzEventJSON(f *testing.F) {
	f.Add(`{"v":1,"event_id":"e","tenant":"t","topic":"g","seq_id":1,"shard_month":"202611","message_id":"5","from_user":7,"content":{},"created_at":"2026-11-30T00:00:00.000Z"}`)
	f.Add(`{"from_user":"x"}`)
	f.Fuzz(func(t *testing.T, s string) {
		var ev Event
		if json.Unmarshal([]byte(s), &ev) != nil {
			return
		}
		want, err := json.Marshal(&ev)
		if err != nil {
			t.Fatalf("decoded event does not encode: %v", err)
		}
		if got, err := ev.AppendJSON(nil); err != nil || string(got) != string(want) {
			t.Fatalf("AppendJSON = %s, %v\nwant %s", got, err, want)
		}
	})
}

// The event the send path stores before the allocation, completed with
// WithAllocation, is byte for byte the marshalled whole event: a retry
// re-produces the very record the first attempt produced.
func TestWithAllocationMatchesMarshal(t *testing.T) {
	reply := int64(3)
	for _, ev := range []Event{
		{V: EventVersion, EventID: "e1", Tenant: "t_1", Topic: "room-A", GroupID: 42, SeqID: 1001, ShardMonth: "202612",
			MessageID: 7 << 40, FromUser: 9, ClientMsgID: `c"<&>`, MsgType: "text", Content: json.RawMessage(`{"text":"hi"}`),
			MentionedUserIDs: IDs{1, 2}, ReplySeqID: &reply, CreatedAt: NewTime(time.Unix(1700000000, 123e6))},
		{V: EventVersion, EventID: "e2", Tenant: "t", Topic: "x", GroupID: 1, SeqID: 1, ShardMonth: "209901",
			Content: json.RawMessage(`{"shard_month":"","seq_id":0,"group_id":"0"}`)},
	} {
		want, err := json.Marshal(&ev)
		if err != nil {
			t.Fatal(err)
		}
		partial, err := Unallocated(&ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := WithAllocation(partial, ev.GroupID, ev.SeqID, ev.ShardMonth)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("WithAllocation = %s\nwant %s", got, want)
		}
	}
	if _, err := WithAllocation([]byte(`{"v":1}`), 1, 1, "202601"); err == nil {
		t.Fatal("an event without the unallocated fields was completed")
	}
}
