package test

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/query"
	"github.com/imshard/imshard/modules/routing"
)

// Month-edge scenarios of the read path (docs/invariants.md), end to end
// through HTTP against MariaDB and Redis.

func TestAcceptance04_Latest50AcrossTwoMonths(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "acc04")
	p := rpList(t, env, rpMember, "acc04", url.Values{"limit": {"50"}})
	rpExpect(t, "latest 50", p.seqs(), rpDesc(21, 70))
	if p.NextBefore == nil || *p.NextBefore != 21 || !p.HasMore {
		t.Fatalf("cursor: next_before %v has_more %v, want 21 true", p.NextBefore, p.HasMore)
	}
	p = rpList(t, env, rpMember, "acc04", url.Values{"before": {"21"}})
	rpExpect(t, "the page after", p.seqs(), rpDesc(1, 20))
	if p.HasMore || p.NextBefore == nil || *p.NextBefore != 1 {
		t.Fatalf("last page: next_before %v has_more %v", p.NextBefore, p.HasMore)
	}
	if n := rpMetric(t, env, "group_message_query_latency", "source=cross_month"); n < 1 {
		t.Fatalf("a page over two months must count as cross_month, got %v", n)
	}
}

func TestAcceptance05_SinceAcrossMonthsNoGapsNoDuplicates(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "acc05")
	for _, limit := range []int{1, 7, 20, 200} {
		rpExpect(t, "since walk limit "+strconv.Itoa(limit), rpWalkSince(t, env, rpMember, "acc05", limit), rpAsc(1, 70))
	}
	p := rpList(t, env, rpMember, "acc05", url.Values{"since": {"15"}, "limit": {"10"}})
	rpExpect(t, "since 15 crosses into the second month", p.seqs(), rpAsc(16, 25))
	if *p.NextSince != 25 || !p.HasMore {
		t.Fatalf("cursor: %+v", p)
	}
}

func TestAcceptance06_TopicSeqFindsHistoricMessage(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "acc06")
	for _, seq := range []int64{1, 20, 21, 55, 70} {
		var m message.Message
		if code := rpGet(t, env, rpMember, "", "/v1/topics/acc06/messages/"+strconv.FormatInt(seq, 10), &m); code != 200 {
			t.Fatalf("seq %d: status %d", seq, code)
		}
		var c struct{ Text string }
		if err := json.Unmarshal(m.Content, &c); err != nil || m.Seq != seq || c.Text != "message "+strconv.FormatInt(seq, 10) || m.Status != "normal" {
			t.Fatalf("seq %d: %+v", seq, m)
		}
	}
	if code := rpGet(t, env, rpMember, "", "/v1/topics/acc06/messages/71", nil); code != 404 {
		t.Fatalf("seq beyond the topic: %d, want 404", code)
	}
	// Redis forgot the route: the mirror answers and refills it
	if err := env.App.Routes().Delete(context.Background(), env.Tenant, "acc06"); err != nil {
		t.Fatal(err)
	}
	if code := rpGet(t, env, rpMember, "", "/v1/topics/acc06/messages/3", nil); code != 200 {
		t.Fatalf("historic seq without a Redis route: %d", code)
	}
}

func TestAcceptance07_ReplyContextAcrossMonths(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ms := [3]routing.Month{env.Start, env.Start.Next(), env.Start.Add(2)}
	rpGroup(t, env, "acc07")
	rpInsert(t, env, "acc07", ms[0], rpSeqs(1, 20)...)
	rpInsert(t, env, "acc07", ms[1], rpRow{seq: 21, text: "deleted", status: "deleted"}, rpRow{seq: 22})
	rpInsert(t, env, "acc07", ms[2], append([]rpRow{{seq: 23, reply: 5, text: "a reply to 5"}}, rpSeqs(24, 40)...)...)
	env.Activate(ms[1])
	env.Activate(ms[2])
	rpSyncRoute(t, env, "acc07")

	var reply message.Message
	if rpGet(t, env, rpMember, "", "/v1/topics/acc07/messages/23", &reply); reply.ReplySeqID == nil || *reply.ReplySeqID != 5 {
		t.Fatalf("reply: %+v", reply)
	}
	var ctx struct{ Messages []message.Message }
	if code := rpGet(t, env, rpMember, "", "/v1/topics/acc07/messages/5/context?before=2&after=2", &ctx); code != 200 {
		t.Fatalf("context of the replied message: %d", code)
	}
	got := rpPage{Messages: ctx.Messages}.seqs()
	rpExpect(t, "context of 5", got, rpAsc(3, 7))
	if code := rpGet(t, env, rpMember, "", "/v1/topics/acc07/messages/23/context", &ctx); code != 200 {
		t.Fatalf("context: %d", code)
	}
	got = rpPage{Messages: ctx.Messages}.seqs()
	rpExpect(t, "default context of 23 spans three months", got, rpAsc(3, 40))
	for _, m := range ctx.Messages {
		if m.Seq == 21 && (m.Status != "deleted" || string(m.Content) != "null") {
			t.Fatalf("a deleted neighbour is a tombstone: %+v", m)
		}
	}
	for _, bad := range []string{"before=101", "after=-1", "before=x"} {
		if code := rpGet(t, env, rpMember, "", "/v1/topics/acc07/messages/23/context?"+bad, nil); code != 400 {
			t.Fatalf("context ?%s: %d, want 400", bad, code)
		}
	}
}

func TestAcceptance08_RecallEditReportFavouriteReachOldMonths(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ms := rpThreeMonths(t, env, "acc08")
	ctx := context.Background()
	// a recall (by the group's owner: the sender's window is long past)
	// and an edit of the oldest month's rows
	if err := env.App.ACL().PutMember(ctx, env.Tenant, "acc08", rpOther, "owner", nil); err != nil {
		t.Fatal(err)
	}
	if code, r := chRecall(t, env, env.Token(rpOther, ""), "acc08", 3, nil); code != 200 || r.Message.Status != "recalled" {
		t.Fatalf("recall of a message three months old: %d %+v", code, r)
	}
	tbl, _, err := env.App.Catalog().Table(ctx, env.Tenant, ms[0])
	if err != nil {
		t.Fatal(err)
	}
	if code, r := chEdit(t, env, env.Token(rpMember, ""), "acc08", 4, chEditBody("edited", 1)); code != 200 || r.Message.Version != 2 {
		t.Fatalf("edit of a message three months old: %d %+v", code, r)
	}
	var m message.Message
	rpGet(t, env, rpMember, "", "/v1/topics/acc08/messages/3", &m)
	if m.Status != "recalled" || string(m.Content) != "null" || m.Version != 2 {
		t.Fatalf("recalled tombstone from the oldest month: %+v", m)
	}
	rpGet(t, env, rpMember, "", "/v1/topics/acc08/messages/4", &m)
	if chText(m) != "edited" || m.Version != 2 || !m.UpdatedAt.After(m.CreatedAt.Time) {
		t.Fatalf("edited message: %+v", m)
	}
	if n := chCount(t, env, tbl.Name(), sq.Eq{"topic": "acc08", "seqid": 4, "version": 2}); n != 1 {
		t.Fatal("the edit is not in the oldest month's table")
	}
	if code, r := chDeleteAll(t, env, env.Token(rpAdmin, "admin"), "acc08", 5, "report"); code != 200 || r.Message.Status != "deleted" {
		t.Fatalf("delete for everyone of a message three months old: %d %+v", code, r)
	}
	rpExpect(t, "lists skip the deleted message", rpList(t, env, rpMember, "acc08", url.Values{"before": {"7"}, "limit": {"3"}}).seqs(), []int64{6, 4, 3})
	// reports, favourites and file references hold message ids: the admin
	// lookup finds them in any month
	for _, seq := range []int64{1, 3, 20, 21, 40, 41, 70} {
		month := ms[0]
		if seq > 20 {
			month = ms[1]
		}
		if seq > 40 {
			month = ms[2]
		}
		id := rpMessageID("acc08", rpCreated(month, seq), seq)
		var loc query.Located
		if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/messages/"+strconv.FormatInt(id, 10), &loc); code != 200 {
			t.Fatalf("admin lookup of seq %d: %d", seq, code)
		}
		if loc.Message.Seq != seq || loc.ShardMonth != month.String() || int64(loc.Message.MessageID) != id {
			t.Fatalf("admin lookup of seq %d: %+v", seq, loc)
		}
	}
	// the admin lookup adds the revisions; members find messages of their
	// topic by id, nobody else learns that the id exists
	id3 := rpMessageID("acc08", rpCreated(ms[0], 3), 3)
	var loc query.Located
	rpGet(t, env, rpAdmin, "admin", "/v1/admin/messages/"+strconv.FormatInt(id3, 10), &loc)
	if len(loc.Revisions) != 1 || loc.Revisions[0].Action != "recall" || loc.Revisions[0].ShardMonth != ms[0].String() ||
		!strings.Contains(string(loc.Revisions[0].Content), "message 3") || int64(loc.Revisions[0].Actor) != rpOther {
		t.Fatalf("revisions of the recalled message: %+v", loc.Revisions)
	}
	for _, seq := range []int64{3, 41} {
		month := map[int64]routing.Month{3: ms[0], 41: ms[2]}[seq]
		path := "/v1/messages/" + strconv.FormatInt(rpMessageID("acc08", rpCreated(month, seq), seq), 10)
		var m message.Message
		if code := rpGet(t, env, rpMember, "", path, &m); code != 200 || m.Seq != seq || (seq == 3) != (m.Status == "recalled") {
			t.Fatalf("member's lookup of seq %d by id: %d %+v", seq, code, m)
		}
		if code := rpGet(t, env, rpStranger, "", path, nil); code != 404 {
			t.Fatalf("a stranger's lookup by id: %d, want 404", code)
		}
	}
	rpHide(t, env, "acc08", rpMember, 41, 42)
	if code := rpGet(t, env, rpMember, "", "/v1/messages/"+strconv.FormatInt(rpMessageID("acc08", rpCreated(ms[2], 41), 41), 10), nil); code != 404 {
		t.Fatalf("lookup by id of a message the caller hid: %d, want 404", code)
	}
	if code := rpGet(t, env, rpMember, "", "/v1/messages/12345", nil); code != 404 {
		t.Fatalf("member's lookup of an unknown id: %d", code)
	}
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/messages/12345", nil); code != 404 {
		t.Fatalf("unknown id: %d", code)
	}
	if code := rpGet(t, env, rpMember, "", "/v1/admin/messages/12345", nil); code != 403 {
		t.Fatalf("non-admin: %d", code)
	}
	if code := rpGet(t, env, rpAdmin, "admin", "/v1/admin/messages/abc", nil); code != 400 {
		t.Fatalf("bad id: %d", code)
	}
}

func TestAcceptance09_DeleteRangeAcrossMonths(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "acc09")
	rpHide(t, env, "acc09", rpMember, 15, 45) // spans all three months
	rpHide(t, env, "acc09", rpMember, 60, 61)
	var want []int64
	for s := int64(1); s <= 70; s++ {
		if (s < 15 || s >= 45) && s != 60 {
			want = append(want, s)
		}
	}
	for _, limit := range []int{3, 50} {
		rpExpectWalks(t, env, "the deleting user", rpMember, "acc09", limit, want)
	}
	rpExpect(t, "another member sees everything", rpWalkSince(t, env, rpOther, "acc09", 50), rpAsc(1, 70))
	for seq, code := range map[int64]int{14: 200, 15: 404, 30: 404, 44: 404, 45: 200, 60: 404} {
		if got := rpGet(t, env, rpMember, "", "/v1/topics/acc09/messages/"+strconv.FormatInt(seq, 10), nil); got != code {
			t.Fatalf("exact %d for the deleting user: %d, want %d", seq, got, code)
		}
	}
	// the hidden run is skipped in one step: a page right below it is full
	p := rpList(t, env, rpMember, "acc09", url.Values{"before": {"45"}, "limit": {"5"}})
	rpExpect(t, "page below the hidden run", p.seqs(), rpDesc(10, 14))
}

func TestAcceptance10_IncompleteHotCacheFallsBackToMySQL(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "acc10")
	ctx := context.Background()
	keys := env.Keys()
	rdb := env.Redis
	cache := func(seq int64, text string) { rpCache(t, env, "acc10", seq, text) }
	setLast := func(seq int64) { rpSetLast(t, env, "acc10", seq) }
	text := func(p rpPage) map[int64]string {
		out := map[int64]string{}
		for _, m := range p.Messages {
			var c struct{ Text string }
			_ = json.Unmarshal(m.Content, &c)
			out[m.Seq] = c.Text
		}
		return out
	}
	// the cache holds 61–70 except 65: it cannot prove the page, MySQL answers
	for s := int64(61); s <= 70; s++ {
		if s != 65 {
			cache(s, "cached")
		}
	}
	setLast(70)
	p := rpList(t, env, rpMember, "acc10", url.Values{"limit": {"8"}})
	rpExpect(t, "page over a cache hole", p.seqs(), rpDesc(63, 70))
	if tx := text(p); tx[70] != "message 70" {
		t.Fatalf("an incomplete cache must not answer: %v", tx)
	}
	// a recorded gap proves 65: now the cache covers 63–70
	if err := env.App.Flight().RecordGap(ctx, env.Tenant, "acc10", 65); err != nil {
		t.Fatal(err)
	}
	p = rpList(t, env, rpMember, "acc10", url.Values{"limit": {"5"}})
	rpExpect(t, "cached page", p.seqs(), []int64{70, 69, 68, 67, 66})
	if tx := text(p); tx[70] != "cached" {
		t.Fatalf("a complete cache answers: %v", tx)
	}
	// the sender's own message, acknowledged but not yet persisted, is read
	// from the cache right away
	cache(71, "just sent")
	setLast(71)
	var m message.Message
	if code := rpGet(t, env, rpMember, "", "/v1/topics/acc10/messages/71", &m); code != 200 || m.Seq != 71 {
		t.Fatalf("own message before persist: %d %+v", code, m)
	}
	p = rpList(t, env, rpMember, "acc10", url.Values{"limit": {"3"}})
	rpExpect(t, "latest page with the unpersisted message", p.seqs(), []int64{71, 70, 69})
	// a page reaching below the cached window comes from MySQL, whole
	p = rpList(t, env, rpMember, "acc10", url.Values{"before": {"64"}, "limit": {"10"}})
	rpExpect(t, "page below the cache", p.seqs(), rpDesc(54, 63))
	// a since page: 65 is a gap, the rest cached, the page stops at the last seq
	p = rpList(t, env, rpMember, "acc10", url.Values{"since": {"62"}})
	rpExpect(t, "since from the cache", p.seqs(), []int64{63, 64, 66, 67, 68, 69, 70, 71})
	if len(p.Gaps) != 1 || p.Gaps[0] != 65 {
		t.Fatalf("gaps reported: %v", p.Gaps)
	}
	// persisted and evicted from the cache: still found
	if err := rdb.Do(ctx, rdb.B().Del().Key(keys.HotMessages("acc10")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if code := rpGet(t, env, rpMember, "", "/v1/topics/acc10/messages/70", &m); code != 200 || m.Seq != 70 {
		t.Fatalf("evicted message: %d %+v", code, m)
	}
	if rpMetric(t, env, "imshard_query_hot_cache_total", "result=hit") < 1 || rpMetric(t, env, "imshard_query_hot_cache_total", "result=miss") < 1 {
		t.Fatal("hot cache hits and misses are counted")
	}
}

func TestAcceptance16_RoutesRebuiltFromMirror(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "acc16")
	ctx := context.Background()
	want, _, err := env.App.Routes().Load(ctx, env.Tenant, "acc16")
	if err != nil || len(want) != 3 {
		t.Fatalf("route before: %v %v", want, err)
	}
	if err := env.App.Routes().Delete(ctx, env.Tenant, "acc16"); err != nil {
		t.Fatal(err)
	}
	misses := rpMetric(t, env, "group_message_route_miss_total")
	rpExpect(t, "since walk without a Redis route", rpWalkSince(t, env, rpMember, "acc16", 9), rpAsc(1, 70))
	got, found, err := env.App.Routes().Load(ctx, env.Tenant, "acc16")
	if err != nil || !found || len(got) != 3 {
		t.Fatalf("route not refilled: %v %v %v", got, found, err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("refilled route %v, want %v", got, want)
		}
	}
	if rpMetric(t, env, "group_message_route_miss_total") != misses+1 || rpMetric(t, env, "group_message_route_rebuild_total", "status=ok") != 1 {
		t.Fatal("route miss and rebuild are counted once")
	}
	if err := env.App.Routes().Delete(ctx, env.Tenant, "acc16"); err != nil {
		t.Fatal(err)
	}
	back := rpWalkBefore(t, env, rpMember, "acc16", 11)
	rpExpect(t, "before walk without a Redis route", back, rpDesc(1, 70))
}
