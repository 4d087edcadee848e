package test

import (
	"encoding/json"
	"net/url"
	"strconv"
	"testing"

	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/test/harness"
)

// Helpers of the read-state tests (cursors, unread, topic list, sync):
// everything goes through the HTTP API.

// rsStart runs every role for a fresh tenant.
func rsStart(t *testing.T) *sendEnv {
	t.Helper()
	return startSend(t, harness.Options{Roles: []string{"all"}})
}

// rsGet GETs path as user and decodes a 200 into out.
func rsGet(t testing.TB, env *sendEnv, user int64, path string, out any) {
	t.Helper()
	code, body := env.Do("GET", path, env.Token(user, ""), nil)
	if code != 200 {
		t.Fatalf("GET %s as %d: %d %s", path, user, code, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
}

// rsRead moves user's cursor of topic to seq and returns the status and
// the cursor answered.
func rsRead(t testing.TB, env *sendEnv, user int64, topic string, seq int64) (int, int64) {
	t.Helper()
	code, body := env.Do("PUT", "/v1/topics/"+topic+"/read", env.Token(user, ""), map[string]any{"seq": seq})
	var r inbox.ReadCursor
	if code == 200 {
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
	}
	return code, r.ReadSeq
}

// rsUnread is user's badges by topic.
func rsUnread(t testing.TB, env *sendEnv, user int64) (inbox.UnreadSummary, map[string]inbox.UnreadTopic) {
	t.Helper()
	var s inbox.UnreadSummary
	rsGet(t, env, user, "/v1/me/unread", &s)
	by := map[string]inbox.UnreadTopic{}
	for _, u := range s.Topics {
		by[u.Topic] = u
	}
	return s, by
}

// rsTopics walks user's whole topic list with pages of limit.
func rsTopics(t testing.TB, env *sendEnv, user int64, limit int) []inbox.InboxTopic {
	t.Helper()
	var all []inbox.InboxTopic
	cursor := ""
	for range 1000 {
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var p inbox.TopicsPage
		rsGet(t, env, user, "/v1/me/topics?"+q.Encode(), &p)
		all = append(all, p.Topics...)
		if p.NextCursor == nil {
			return all
		}
		cursor = *p.NextCursor
	}
	t.Fatal("topic list does not end")
	return nil
}

// rsSync is one sync call.
func rsSync(t testing.TB, env *sendEnv, user int64, token string, limit int) inbox.SyncPage {
	t.Helper()
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if token != "" {
		q.Set("token", token)
	}
	var p inbox.SyncPage
	rsGet(t, env, user, "/v1/me/sync?"+q.Encode(), &p)
	return p
}
