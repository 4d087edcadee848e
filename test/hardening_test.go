package test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// After the tenant's Redis state is lost, a send asks MySQL whether it was
// stored before (once persist passed the loss); a registered month table that is not there holds no
// earlier send, so the send is accepted (not 503 "dedup lookup failed")
// and its event keeps its month: persist waits for the table
// (shard_missing), as for any missing table.
func TestSendAfterRedisLossWithMonthTableMissing(t *testing.T) {
	e := startSend(t, harness.Options{})
	e.group("room", 1, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	first := e.mustSend(user, "room", sendBody("one", "a"))
	ctx := context.Background()
	if _, err := e.DB.ExecContext(ctx, "DROP TABLE im_group_messages_"+e.Start.String()); err != nil {
		t.Fatal(err)
	}
	if err := testenv.DeleteTenantKeys(ctx, e.Redis, e.Tenant); err != nil {
		t.Fatal(err)
	}
	// once persist passed the loss, MySQL answers for seq 1 (no persist
	// runs; its progress stands in)
	e.persistPassed()
	for i, cmid := range []string{"two", "three"} {
		code, r := e.send(user, "room", sendBody(cmid, "b"))
		if code != 201 || r.Seq <= first.Seq || r.ShardMonth != e.Start.String() {
			t.Fatalf("send %d after Redis loss with the month table gone: %d %+v", i, code, r)
		}
	}
	evs := e.events(func(ev message.Event) bool { return ev.ClientMsgID == "three" })
	if got := sendByCMID(evs, "two"); len(got) != 1 || got[0].ShardMonth != e.Start.String() {
		t.Fatalf("events of the send: %+v", got)
	}
}

// Read-your-own-write when the hot cache is incomplete: after the topic's
// hot key is gone (idle past hot_cache.ttl), a message is sent and a
// latest page read at once includes it, though MySQL does not have it yet
// (no persist runs here: every message stays in Kafka) — in the process
// that took the send and in another that keeps no copies.
func TestLatestPageShowsOwnSendAfterHotKeyExpired(t *testing.T) {
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	e.group("room", 1, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	other := rpNoCopies(t, e.Env)
	hot := e.Keys().HotMessages("room")
	for i := range 20 {
		if err := e.Redis.Do(context.Background(), e.Redis.B().Del().Key(hot).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		text := fmt.Sprint("message ", i)
		r := e.mustSend(user, "room", sendBody(fmt.Sprint("m", i), text))
		for name, env := range map[string]*harness.Env{"sender's process": e.Env, "another process": other} {
			page := rpList(t, env, 1, "room", url.Values{"limit": {"5"}})
			if len(page.Messages) == 0 || page.Messages[0].Seq != r.Seq || !strings.Contains(string(page.Messages[0].Content), text) {
				t.Fatalf("send %d (seq %d), latest page of the %s: %v", i, r.Seq, name, page.seqs())
			}
		}
	}
}
