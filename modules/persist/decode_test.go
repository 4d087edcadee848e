package persist

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/imshard/imshard/modules/message"
)

// validEvent is in the layout send writes (message.Event.AppendJSON: the
// fields in order, the empty optional ones left out, no whitespace).
const validEvent = `{"v":1,"event_id":"e1","tenant":"acme","topic":"room-1","group_id":"7","seq_id":12,` +
	`"shard_month":"202601","message_id":"99","from_user":"5","client_msg_id":"c1","msg_type":"text",` +
	`"content":{"text":"hi"},"mention_all":false,"created_at":"2026-01-31T23:59:59.999Z"}`

func TestDecodeEvent(t *testing.T) {
	ev, m, err := DecodeEvent([]byte(validEvent))
	if err != nil || m.String() != "202601" || ev.SeqID != 12 || ev.Topic != "room-1" {
		t.Fatalf("valid event: %+v %v %v", ev, m, err)
	}
	for name, mut := range map[string][2]string{
		"not json":         {validEvent, `{"v":1,`},
		"version":          {`"v":1`, `"v":2`},
		"tenant":           {`"tenant":"acme"`, `"tenant":"ACME;"`},
		"topic":            {`"topic":"room-1"`, `"topic":"a b"`},
		"month syntax":     {`"shard_month":"202601"`, `"shard_month":"2026-1"`},
		"month range":      {`"shard_month":"202601"`, `"shard_month":"999901"`},
		"month 13":         {`"shard_month":"202601"`, `"shard_month":"202613"`},
		"seq":              {`"seq_id":12`, `"seq_id":0`},
		"message id":       {`"message_id":"99"`, `"message_id":"0"`},
		"client_msg_id":    {`"client_msg_id":"c1"`, `"client_msg_id":"` + strings.Repeat("x", 65) + `"`},
		"msg_type":         {`"msg_type":"text"`, `"msg_type":""`},
		"content":          {`"content":{"text":"hi"},`, ``},
		"content too deep": {`"content":{"text":"hi"}`, `"content":` + strings.Repeat(`{"a":`, 32) + `1` + strings.Repeat(`}`, 32)},
		"lone surrogate":   {`"content":{"text":"hi"}`, `"content":{"text":"\ud800"}`},
		"not UTF-8":        {`"content":{"text":"hi"}`, "\"content\":{\"text\":\"\xff\xfe\"}"},
		"repeated key":     {`"content":{"text":"hi"}`, `"content":{"text":"hi","text":"ho"}`},
		"head too deep":    {`"mention_all"`, `"head":` + strings.Repeat(`[`, 32) + strings.Repeat(`]`, 32) + `,"mention_all"`},
		"padded id":        {`"client_msg_id":"c1"`, `"client_msg_id":"c1 "`},
		"created_at":       {`"created_at":"2026-01-31T23:59:59.999Z"`, `"created_at":"0001-01-01T00:00:00Z"`},
		"event id missing": {`"event_id":"e1",`, ``},
	} {
		t.Run(name, func(t *testing.T) {
			in := mut[1]
			if mut[0] != validEvent {
				in = strings.Replace(validEvent, mut[0], mut[1], 1)
			}
			if _, _, err := DecodeEvent([]byte(in)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("want ErrMalformed, got %v", err)
			}
		})
	}
}

// FuzzDecodeEvent: whatever the bytes, the decoder either refuses them as
// malformed or returns an event whose identifiers passed the whitelists —
// never a panic, never a month outside the table range — and the very event
// json.Unmarshal, the contract's reference reader, makes of them; what
// json.Unmarshal refuses is refused.
func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(validEvent))
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	f.Add([]byte(strings.Replace(validEvent, "202601", "000000", 1)))
	f.Add([]byte(strings.Replace(validEvent, `"mention_all":false`, `"mentioned_user_ids":["6"],"mention_all":true,"reply_seqid":3`, 1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		var ref message.Event
		refErr := json.Unmarshal(b, &ref)
		ev, m, err := DecodeEvent(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not marked malformed: %v", err)
			}
			return
		}
		if refErr != nil || !reflect.DeepEqual(*ev, ref) {
			t.Fatalf("decoded %+v, json.Unmarshal: %+v %v", ev, ref, refErr)
		}
		if !m.Valid() || m.String() != ev.ShardMonth || message.CheckStored(ev.Content, ev.Head) != nil || ev.SeqID <= 0 {
			t.Fatalf("accepted a bad event: %+v", ev)
		}
	})
}
