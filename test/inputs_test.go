package test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// Opaque tokens, cursors and times a client sends are decoded in one
// place each into a valid value or a 400 invalid_argument naming the
// field: a forged value never reaches MySQL or a cache, is never a 500 or
// a logged error, and changes nothing.

// inLog collects a process's warnings and errors; started marks where
// those of its start (e.g. the harness's short tenant secret) end.
type inLog struct {
	testenv.LogBuffer
	started int
}

// inStart runs every role for a fresh tenant, logging warnings and errors
// into logs, with user 1 a member of each of topics.
func inStart(t *testing.T, logs *inLog, topics ...string) *sendEnv {
	t.Helper()
	log := zerolog.New(logs).Level(zerolog.WarnLevel)
	env := startSend(t, harness.Options{Roles: []string{"all"}, Log: &log})
	for _, topic := range topics {
		env.group(topic, 1, "active")
		env.member(topic, 1, "member", time.Time{})
	}
	logs.started = len(logs.String())
	return env
}

// inQuiet asserts that the refusals logged nothing since the start.
func inQuiet(t *testing.T, logs *inLog) {
	t.Helper()
	if out := logs.String()[logs.started:]; out != "" {
		t.Fatalf("refused requests were logged:\n%s", out)
	}
}

// inRefused asserts that code and body are a 400 invalid_argument whose
// details name field.
func inRefused(t *testing.T, what string, code int, body []byte, field string) {
	t.Helper()
	var env struct {
		Error struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &env)
	if code != 400 || env.Error.Code != "invalid_argument" || env.Error.Details["field"] != field {
		t.Fatalf("%s: %d %s, want 400 invalid_argument with details.field %q", what, code, body, field)
	}
}

// inOpaque is what the API's opaque tokens look like: base64url of JSON.
func inOpaque(v string) string { return base64.RawURLEncoding.EncodeToString([]byte(v)) }

// TestForgedSyncTokensAreRefused: a sync token naming a time far in the
// future (the reported one, past int64 years MySQL can hold), a day ahead
// of the server's clock, before 2000, or not in the form the API writes
// answers 400, logs nothing, and leaves the device's real token working.
func TestForgedSyncTokensAreRefused(t *testing.T) {
	t.Parallel()
	var logs inLog
	env := inStart(t, &logs, "room")
	user := env.Token(1, "")
	first := rsSync(t, env, 1, "", 50)
	if len(first.Topics) != 1 {
		t.Fatalf("first sync: %+v", first)
	}
	ahead := time.Now().Add(24 * time.Hour).UnixMilli()
	for _, c := range []struct{ name, tok string }{
		{"huge time", inOpaque(`{"s":9223372036854775807}`)},
		{"a day ahead", inOpaque(fmt.Sprintf(`{"s":%d}`, ahead))},
		{"negative time", inOpaque(`{"s":-62135596800000}`)},
		{"before 2000", inOpaque(`{"s":1}`)},
		{"null", inOpaque(`null`)},
		{"unknown field", inOpaque(`{"s":1767225600000,"x":1}`)},
		{"invalid topic", inOpaque(`{"s":1767225600000,"t":"a b"}`)},
		{"not base64", "!!!"},
		{"fractional time", inOpaque(`{"s":1767225600000.5}`)},
		{"padded base64", base64.URLEncoding.EncodeToString([]byte(`{"s":1767225600000}`))},
		{"time as a string", inOpaque(`{"s":"1767225600000"}`)},
		{"trailing data", inOpaque(`{"s":1767225600000}x`)},
		{"repeated time field", inOpaque(`{"s":1767225600000,"s":1767225600001}`)},
	} {
		code, body := env.Do("GET", "/v1/me/sync?"+url.Values{"token": {c.tok}}.Encode(), user, nil)
		inRefused(t, "sync token "+c.name, code, body, "token")
	}
	inQuiet(t, &logs)
	if again := rsSync(t, env, 1, first.Token, 50); again.Reset || len(again.Topics) > 1 {
		t.Fatalf("the device's own token after the forged ones: %+v", again)
	}
}

// TestForgedTopicListCursorsAreRefused: a topic-list cursor whose moment
// lies ahead of the server's clock or before 2000, or whose topic is not a
// topic, answers 400 and logs nothing.
func TestForgedTopicListCursorsAreRefused(t *testing.T) {
	t.Parallel()
	var logs inLog
	env := inStart(t, &logs, "a", "b")
	user := env.Token(1, "")
	ahead := time.Now().Add(24 * time.Hour).UnixMilli()
	for _, c := range []struct{ name, cur string }{
		{"huge moment", inOpaque(`{"s":9223372036854775807,"p":false,"a":1767225600000,"t":"a"}`)},
		{"a day ahead", inOpaque(fmt.Sprintf(`{"s":%d,"p":false,"a":1767225600000,"t":"a"}`, ahead))},
		{"activity past snap", inOpaque(`{"s":1767225600000,"p":false,"a":9223372036854775807,"t":"a"}`)},
		{"before 2000", inOpaque(`{"s":1,"p":false,"a":1,"t":"a"}`)},
		{"invalid topic", inOpaque(`{"s":1767225600000,"p":false,"a":1767225600000,"t":"a/b"}`)},
		{"no topic", inOpaque(`{"s":1767225600000,"p":false,"a":1767225600000}`)},
		{"null", inOpaque(`null`)},
	} {
		code, body := env.Do("GET", "/v1/me/topics?"+url.Values{"limit": {"1"}, "cursor": {c.cur}}.Encode(), user, nil)
		inRefused(t, "topic-list cursor "+c.name, code, body, "cursor")
	}
	inQuiet(t, &logs)
	if got := rsTopics(t, env, 1, 1); len(got) != 2 {
		t.Fatalf("topic list after the forged cursors: %+v", got)
	}
}

// TestOutOfRangeNotifyMuteIsRefusedAndChangesNothing: a notification mute
// in year 0001 (the reported one), before 2000, or past the 100-year
// horizon answers 400; nothing is stored, and the badges stay served
// from the cache entry without a warning.
func TestOutOfRangeNotifyMuteIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	var logs inLog
	env := inStart(t, &logs, "room")
	env.member("room", 2, "member", time.Time{})
	env.mustSend(env.Token(2, ""), "room", sendBody("m1", "hello"))
	chWaitSettled(t, env.Env, "room")
	user := env.Token(1, "")
	if _, by := rsUnread(t, env, 1); by["room"].Unread != 1 {
		t.Fatalf("badges before: %+v", by)
	}
	for _, until := range []string{"0001-01-01T00:00:00Z", "1999-12-31T23:59:59.999Z", "1969-12-31T23:59:59Z",
		time.Now().AddDate(100, 0, 1).UTC().Format(time.RFC3339), "9999-12-31T23:59:59Z"} {
		code, body := env.Do("PUT", "/v1/topics/room/me", user, map[string]any{"pinned": true, "notify_muted_until": until})
		inRefused(t, "notify_muted_until "+until, code, body, "notify_muted_until")
	}
	rs, err := acl.ReadStateOf(context.Background(), env.DB, 1, "room")
	if err != nil {
		t.Fatal(err)
	}
	if rs.Pinned || rs.NotifyMute.Valid {
		t.Fatalf("a refused preferences change was stored: %+v", rs)
	}
	misses := persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="miss"`)
	for range 3 {
		if _, by := rsUnread(t, env, 1); by["room"].Unread != 1 {
			t.Fatalf("badges after: %+v", by)
		}
	}
	if n := persistMetric(t, env.Env, "imshard_read_cursor_cache_total", `result="miss"`); n != misses {
		t.Fatalf("the badges were read from MySQL again (%v misses)", n-misses)
	}
	inQuiet(t, &logs)
	// the bounds themselves are accepted
	for _, until := range []string{"2000-01-01T00:00:00Z", time.Now().AddDate(99, 0, 0).UTC().Format(time.RFC3339)} {
		if code, body := env.Do("PUT", "/v1/topics/room/me", user, map[string]any{"notify_muted_until": until}); code != 200 {
			t.Fatalf("notify_muted_until %s: %d %s", until, code, body)
		}
	}
}

// TestOutOfRangeMembershipMuteIsRefused: a membership mute outside the
// same bounds answers 400 naming muted_until, and the membership stays as
// it was.
func TestOutOfRangeMembershipMuteIsRefused(t *testing.T) {
	t.Parallel()
	var logs inLog
	env := inStart(t, &logs, "room")
	for _, until := range []string{"0001-01-01T00:00:00Z", "1999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"} {
		code, body := env.Do("PUT", "/v1/topics/room/members/1", env.svc, map[string]any{"role": "owner", "muted_until": until})
		inRefused(t, "muted_until "+until, code, body, "muted_until")
	}
	var role string
	var muted sql.NullTime
	err := env.DB.QueryRow("SELECT role, muted_until FROM "+acl.MembersTable+" WHERE topic = ? AND user_id = ?", "room", 1).Scan(&role, &muted)
	if err != nil || role != acl.RoleMember || muted.Valid {
		t.Fatalf("membership after refused changes: %s %+v %v", role, muted, err)
	}
	inQuiet(t, &logs)
}
