package test

import (
	"context"
	"testing"
	"time"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// After the tenant's Redis state is lost, a send asks MySQL whether it was
// stored before; a registered month table that is not there holds no
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
