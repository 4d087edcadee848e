package send

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

func codeOf(err error) string {
	if err == nil {
		return ""
	}
	code, _ := httpapi.Classify(err)
	return code
}

func TestDecodeSend(t *testing.T) {
	const ok = `"client_msg_id":"c1","msg_type":"text","content":{"text":"hi"}`
	for _, tc := range []struct {
		name, body, code string
	}{
		{"minimal", `{` + ok + `}`, ""},
		{"all fields", `{` + ok + `,"head":{"a":1},"mentioned_user_ids":["1",2],"mention_all":true,"reply_seqid":3,"root_seqid":1,"from_user":"9"}`, ""},
		{"null head", `{` + ok + `,"head":null}`, ""},
		{"empty", ``, "invalid_argument"},
		{"not json", `hello`, "invalid_argument"},
		{"truncated", `{"client_msg_id":"c1"`, "invalid_argument"},
		{"array", `[]`, "invalid_argument"},
		{"trailing data", `{` + ok + `} {}`, "invalid_argument"},
		{"unknown field", `{` + ok + `,"seq":5}`, "invalid_argument"},
		{"missing client_msg_id", `{"msg_type":"text","content":{}}`, "invalid_argument"},
		{"empty client_msg_id", `{"client_msg_id":"","msg_type":"text","content":{}}`, "invalid_argument"},
		{"64-byte client_msg_id", `{"client_msg_id":"` + strings.Repeat("a", 64) + `","msg_type":"text","content":{}}`, ""},
		{"65-byte client_msg_id", `{"client_msg_id":"` + strings.Repeat("a", 65) + `","msg_type":"text","content":{}}`, "invalid_argument"},
		{"multibyte client_msg_id over 64 bytes", `{"client_msg_id":"` + strings.Repeat("é", 33) + `","msg_type":"text","content":{}}`, "invalid_argument"},
		{"unknown msg_type", `{"client_msg_id":"c","msg_type":"html","content":{}}`, "invalid_argument"},
		{"missing msg_type", `{"client_msg_id":"c","content":{}}`, "invalid_argument"},
		{"missing content", `{"client_msg_id":"c","msg_type":"text"}`, "invalid_argument"},
		{"string content", `{"client_msg_id":"c","msg_type":"text","content":"hi"}`, "invalid_argument"},
		{"null content", `{"client_msg_id":"c","msg_type":"text","content":null}`, "invalid_argument"},
		{"array head", `{` + ok + `,"head":[1]}`, "invalid_argument"},
		{"bad mention id", `{` + ok + `,"mentioned_user_ids":["x"]}`, "invalid_argument"},
		{"zero mention id", `{` + ok + `,"mentioned_user_ids":[0]}`, "invalid_argument"},
		{"too many mentions", `{` + ok + `,"mentioned_user_ids":[1,2,3,4]}`, "invalid_argument"},
		{"zero reply", `{` + ok + `,"reply_seqid":0}`, "invalid_argument"},
		{"negative root", `{` + ok + `,"root_seqid":-1}`, "invalid_argument"},
		{"fractional reply", `{` + ok + `,"reply_seqid":1.5}`, "invalid_argument"},
		{"zero from_user", `{` + ok + `,"from_user":0}`, "invalid_argument"},
		{"client_msg_id with a trailing space", `{"client_msg_id":"pad-1 ","msg_type":"text","content":{}}`, "invalid_argument"},
		{"client_msg_id with a leading space", `{"client_msg_id":" pad-1","msg_type":"text","content":{}}`, "invalid_argument"},
		{"client_msg_id with a trailing tab", `{"client_msg_id":"pad-1\t","msg_type":"text","content":{}}`, "invalid_argument"},
		{"client_msg_id with a trailing no-break space", `{"client_msg_id":"pad-1\u00a0","msg_type":"text","content":{}}`, "invalid_argument"},
		{"client_msg_id with an inner space", `{"client_msg_id":"pad 1","msg_type":"text","content":{}}`, ""},
		{"content nested 31 deep", `{"client_msg_id":"c","msg_type":"text","content":` + nest(31) + `}`, ""},
		{"content nested 32 deep", `{"client_msg_id":"c","msg_type":"text","content":` + nest(32) + `}`, "invalid_argument"},
		{"head nested 32 deep", `{` + ok + `,"head":` + nest(32) + `}`, "invalid_argument"},
		{"lone surrogate in content", `{"client_msg_id":"c","msg_type":"text","content":{"text":"\ud800"}}`, "invalid_argument"},
		{"surrogate pair in content", `{"client_msg_id":"c","msg_type":"text","content":{"text":"\ud83d\ude00"}}`, ""},
		{"invalid UTF-8 in content", "{\"client_msg_id\":\"c\",\"msg_type\":\"text\",\"content\":{\"text\":\"\xff\xfe\"}}", "invalid_argument"},
		{"invalid UTF-8 in client_msg_id", "{\"client_msg_id\":\"c\xff\",\"msg_type\":\"text\",\"content\":{}}", "invalid_argument"},
		{"repeated client_msg_id", `{"client_msg_id":"a",` + ok + `}`, "invalid_argument"},
		{"repeated key in content", `{"client_msg_id":"c","msg_type":"text","content":{"t":1,"t":2}}`, "invalid_argument"},
		{"repeated key in head", `{` + ok + `,"head":{"q":{"x":1,"x":1}}}`, "invalid_argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSend(strings.NewReader(tc.body), 3)
			if got := codeOf(err); got != tc.code {
				t.Fatalf("code = %q (%v), want %q", got, err, tc.code)
			}
		})
	}
}

// nest is an object nested n levels deep.
func nest(n int) string {
	return strings.Repeat(`{"a":`, n-1) + `{}` + strings.Repeat(`}`, n-1)
}

// Every refusal says what is wrong in the API's words: the field and what
// it must be, never the decoder's Go types.
func TestDecodeSendMessages(t *testing.T) {
	const ok = `"client_msg_id":"c1","msg_type":"text","content":{"text":"hi"}`
	for _, tc := range []struct{ body, msg string }{
		{`{` + ok + `,"reply_seqid":"3"}`, `field "reply_seqid": expected an integer, got string`},
		{`{` + ok + `,"reply_seqid":1.5}`, `field "reply_seqid": expected an integer, got number 1.5`},
		{`{"client_msg_id":7,"msg_type":"text","content":{}}`, `field "client_msg_id": expected a string, got number`},
		{`{` + ok + `,"mention_all":"yes"}`, `field "mention_all": expected true or false, got string`},
		{`{` + ok + `,"mentioned_user_ids":{}}`, `field "mentioned_user_ids": expected an array, got object`},
		{`{` + ok + `,"mentioned_user_ids":["bob"]}`, `field "mentioned_user_ids": expected a decimal id (a string or a number), got string "bob"`},
		{`{` + ok + `,"from_user":true}`, `field "from_user": expected a decimal id (a string or a number), got bool`},
		{`[1]`, `body: expected a JSON object, got array`},
		{`{` + ok + `,"seq":5}`, `unknown field "seq"`},
		{`{` + ok + `} {}`, `body must be a single valid JSON object`},
		{`{"client_msg_id":"a",` + ok + `}`, `body repeats the key "client_msg_id" in one object`},
		{`{"client_msg_id":"c","msg_type":"text","content":` + nest(32) + `}`, `content nests objects and arrays deeper than 31 levels`},
		{`{"client_msg_id":"c","msg_type":"text","content":{"t":"\udc00"}}`, `body holds a lone UTF-16 surrogate escape (\udc00)`},
		{"{\"client_msg_id\":\"c\",\"msg_type\":\"text\",\"content\":{\"text\":\"\xff\xfe\"}}", `body holds bytes that are not UTF-8`},
		{`{"client_msg_id":"pad-1 ","msg_type":"text","content":{}}`, `client_msg_id must not begin or end with white space`},
	} {
		_, err := DecodeSend(strings.NewReader(tc.body), 3)
		_, msg := httpapi.Classify(err)
		if msg != tc.msg {
			t.Errorf("%s: message %q, want %q", tc.body, msg, tc.msg)
		}
	}
}

func TestDecodeSendTooLarge(t *testing.T) {
	body := `{"client_msg_id":"c","msg_type":"text","content":{"text":"` + strings.Repeat("x", 2000) + `"}}`
	rec := httptest.NewRecorder()
	r := http.MaxBytesReader(rec, io.NopCloser(strings.NewReader(body)), 1024)
	_, err := DecodeSend(r, 10)
	if codeOf(err) != httpapi.CodeTooLarge {
		t.Fatalf("err = %v, want too_large", err)
	}
}

func TestDecodeGroupAndMember(t *testing.T) {
	for _, tc := range []struct {
		name, body, code string
	}{
		{"ok", `{"group_id":"12","name":"g","status":"active"}`, ""},
		{"numeric id", `{"group_id":12,"status":"muted"}`, ""},
		{"missing id", `{"status":"active"}`, "invalid_argument"},
		{"zero id", `{"group_id":0,"status":"active"}`, "invalid_argument"},
		{"bad status", `{"group_id":1,"status":"gone"}`, "invalid_argument"},
		{"long name", `{"group_id":1,"status":"active","name":"` + strings.Repeat("n", 256) + `"}`, "invalid_argument"},
		{"unknown field", `{"group_id":1,"status":"active","x":1}`, "invalid_argument"},
	} {
		t.Run("group/"+tc.name, func(t *testing.T) {
			_, err := DecodeGroup(strings.NewReader(tc.body))
			if got := codeOf(err); got != tc.code {
				t.Fatalf("code = %q (%v), want %q", got, err, tc.code)
			}
		})
	}
	for _, tc := range []struct {
		name, body, code string
	}{
		{"ok", `{"role":"member"}`, ""},
		{"muted", `{"role":"admin","muted_until":"2030-01-01T00:00:00Z"}`, ""},
		{"bad role", `{"role":"king"}`, "invalid_argument"},
		{"bad time", `{"role":"member","muted_until":"tomorrow"}`, "invalid_argument"},
		{"ancient time", `{"role":"member","muted_until":"0001-01-01T00:00:00Z"}`, "invalid_argument"},
		{"before 2000", `{"role":"member","muted_until":"1999-12-31T23:59:59.999Z"}`, "invalid_argument"},
		{"past the horizon", `{"role":"member","muted_until":"9999-12-31T23:59:59Z"}`, "invalid_argument"},
	} {
		t.Run("member/"+tc.name, func(t *testing.T) {
			_, err := DecodeMember(strings.NewReader(tc.body), time.Now())
			if got := codeOf(err); got != tc.code {
				t.Fatalf("code = %q (%v), want %q", got, err, tc.code)
			}
		})
	}
}

func TestParseUserID(t *testing.T) {
	for in, ok := range map[string]bool{"1": true, "9223372036854775807": true, "0": false, "-1": false,
		"01": false, "+1": false, "1e3": false, "": false, "9223372036854775808": false, "a": false} {
		if _, err := ParseUserID(in); (err == nil) != ok {
			t.Errorf("ParseUserID(%q) err = %v", in, err)
		}
	}
}

// FuzzDecodeSend: any body either decodes into a request that satisfies every
// limit or is rejected with invalid_argument — never a panic, never another code.
func FuzzDecodeSend(f *testing.F) {
	for _, s := range []string{
		`{"client_msg_id":"c1","msg_type":"text","content":{"text":"hi"}}`,
		`{"client_msg_id":"c1","msg_type":"image","content":{},"head":null,"mentioned_user_ids":["1",2],"reply_seqid":3}`,
		`{"client_msg_id":"","msg_type":"text","content":{}}`, `[]`, `{`, `null`, `{"content":{}} x`,
		`{"client_msg_id":"c ","msg_type":"text","content":{"a":[[{"b":"\ud83d\ude00"}]]},"head":{"x":1,"y":{}}}`,
		`{"client_msg_id":1,"reply_seqid":"2","from_user":[],"mentioned_user_ids":[{}],"mention_all":0}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := DecodeSend(strings.NewReader(body), 5)
		if err != nil {
			var e *httpapi.Error
			if !errors.As(err, &e) || e.Code != httpapi.CodeInvalidArgument {
				t.Fatalf("unexpected error %v", err)
			}
			if strings.Contains(e.Message, "json:") || strings.Contains(e.Message, "Go ") {
				t.Fatalf("message in the decoder's words: %q", e.Message)
			}
			return
		}
		if err := message.CheckClientMsgID(req.ClientMsgID); err != nil {
			t.Fatalf("client_msg_id %q accepted: %v", req.ClientMsgID, err)
		}
		if message.CheckStored(req.Content, req.Head) != nil || len(req.MentionedUserIDs) > 5 {
			t.Fatalf("limits not enforced: %+v", req)
		}
	})
}

// FuzzDecodeMember: a membership body is refused with invalid_argument, or
// has a role and, when muted, a mute within the bounds of a client time
// that reads back from the answer's form; nothing panics.
func FuzzDecodeMember(f *testing.F) {
	for _, s := range []string{`{"role":"member"}`, `{"role":"owner","muted_until":"2030-01-01T00:00:00Z"}`,
		`{"role":"member","muted_until":"0001-01-01T00:00:00Z"}`, `{"role":"member","muted_until":"1969-12-31T23:59:59Z"}`,
		`{"role":"member","muted_until":"9999-12-31T23:59:59Z"}`, `{"role":"member","muted_until":"2126-06-01T12:00:00.001Z"}`,
		`{"role":"member","muted_until":null}`, `{"role":"member","muted_until":5}`, `{"role":"king"}`, `null`, ``} {
		f.Add(s)
	}
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := DecodeMember(strings.NewReader(body), now)
		if err != nil {
			if codeOf(err) != httpapi.CodeInvalidArgument {
				t.Fatalf("%q: %v, want invalid_argument", body, err)
			}
			return
		}
		if req.Role != acl.RoleMember && req.Role != acl.RoleAdmin && req.Role != acl.RoleOwner {
			t.Fatalf("%q accepted with the role %q", body, req.Role)
		}
		m := req.MutedUntil
		if m == nil {
			return
		}
		if m.Before(httpapi.EarliestTime) || m.After(httpapi.Horizon(now)) {
			t.Fatalf("%q accepted with the mute %v", body, m.Time)
		}
		b, _ := m.MarshalJSON()
		var back message.Time
		if err := back.UnmarshalJSON(b); err != nil || !back.Equal(m.Time) {
			t.Fatalf("%q: the mute %v reads back as %v %v", body, m.Time, back.Time, err)
		}
	})
}

// FuzzParseIDs: topics and user ids from paths are accepted only in their
// canonical, safe forms.
func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{"a", "a'b", "a b", "x*", "{t}", "a:b", "1", "-5", "007", strings.Repeat("z", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if uid, err := ParseUserID(s); err == nil && (uid <= 0 || s[0] == '0' || s[0] == '+') {
			t.Fatalf("ParseUserID(%q) = %d", s, uid)
		}
		if err := routing.ValidTopic(s); err == nil {
			for _, c := range []byte(s) {
				ok := c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
				if !ok || len(s) > 64 {
					t.Fatalf("topic %q accepted", s)
				}
			}
		}
	})
}

// BenchmarkDecodeSend: the strict decode of a send body as `imshard bench
// send` posts it (100-byte text).
func BenchmarkDecodeSend(b *testing.B) {
	body := []byte(`{"client_msg_id":"run-1234567","msg_type":"text","content":{"text":"` + strings.Repeat("x", 100) + `"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeSend(bytes.NewReader(body), 50); err != nil {
			b.Fatal(err)
		}
	}
}

// A send's answer is rendered by hand: byte for byte what encoding/json
// writes, whatever the topic holds.
func TestResponseRenderIsMarshal(t *testing.T) {
	at := message.NewTime(time.Date(2026, 12, 1, 14, 30, 5, 123e6, time.UTC))
	for _, r := range []Response{
		{Topic: "room-A_1", Seq: 42, MessageID: 7394812734981234, ShardMonth: "202612", CreatedAt: at},
		{Topic: "room", Seq: 1, MessageID: 1, ShardMonth: "202612", CreatedAt: at, Duplicate: true},
		{Topic: `<a&"b">`, Seq: -1, ShardMonth: "", CreatedAt: message.NewTime(time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC))},
		{Topic: "ünï", CreatedAt: message.NewTime(time.Date(1, 2, 3, 4, 5, 6, 0, time.FixedZone("x", 3600)))},
		{},
	} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := r.render(); err != nil || string(got) != string(want) {
			t.Fatalf("render = %s, %v\nwant %s", got, err, want)
		}
	}
}
