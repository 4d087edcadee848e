package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// Read-path helpers: rows are seeded straight into month tables and the
// route mirror (what persist commits in one transaction), Redis routes are
// set as persist merges them, and every read goes through the HTTP API.

const (
	rpMember   int64 = 1001 // a member of every seeded topic
	rpOther    int64 = 1002 // another member
	rpStranger int64 = 1003 // not a member
	rpAdmin    int64 = 9001 // role admin
)

// rpStart runs the read role and the message changes (the changes module
// alone, without the send role it runs in) for a fresh tenant.
func rpStart(t *testing.T) *harness.Env {
	t.Helper()
	return harness.Start(t, harness.Options{Roles: []string{app.Query, app.Changes}})
}

// rpNoCopies runs a second read process for env's tenant that keeps no
// copy of any topic's newest messages (hot_cache.local_topics 0): its
// pages come from the hot cache or MySQL as they stand.
func rpNoCopies(t *testing.T, env *harness.Env) *harness.Env {
	t.Helper()
	return harness.Start(t, harness.Options{Roles: []string{"query"}, Tenant: env.Tenant,
		Mutate: func(c *config.Config) { c.HotCache.LocalTopics = 0 }})
}

// rpCopyReader runs a send process and a second read process for its
// tenant whose copies of topics' newest messages live an hour
// (hot_cache.local_max_age), so a test's pages are read over them, and
// creates topic's group; it returns both and a member's token.
func rpCopyReader(t *testing.T, topic string) (env, reader *harness.Env, token string) {
	t.Helper()
	env = harness.Start(t, harness.Options{})
	reader = harness.Start(t, harness.Options{Roles: []string{"query"}, Tenant: env.Tenant,
		Mutate: func(c *config.Config) { c.HotCache.LocalMaxAge = time.Hour }})
	rpGroup(t, env, topic)
	return env, reader, env.Token(rpMember, "")
}

// rpCache puts a normal message of seq with text in topic's hot cache, as
// send does once Kafka acknowledged it.
func rpCache(t testing.TB, env *harness.Env, topic string, seq int64, text string) {
	t.Helper()
	keys := env.Keys()
	m := message.Message{Topic: topic, Seq: seq, MessageID: message.ID(seq), Status: "normal", MsgType: "text",
		Content: json.RawMessage(`{"text":"` + text + `"}`), Version: 1}
	raw, _ := json.Marshal(m.Normalized())
	ctx := context.Background()
	if err := env.Redis.Do(ctx, env.Redis.B().Zadd().Key(keys.HotMessages(topic)).ScoreMember().ScoreMember(float64(seq), string(raw)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// as a send would, the topic holds a message version
	if err := env.Redis.Do(ctx, env.Redis.B().Set().Key(keys.MessagesVersion(topic)).Value("1").Nx().Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
}

// rpSetLast sets topic's seq counter (the last seq issued).
func rpSetLast(t testing.TB, env *harness.Env, topic string, seq int64) {
	t.Helper()
	keys := env.Keys()
	if err := env.Redis.Do(context.Background(), env.Redis.B().Set().Key(keys.Seq(topic)).Value(strconv.FormatInt(seq, 10)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// rpGroup creates topic's group with rpMember and rpOther as members.
func rpGroup(t *testing.T, env *harness.Env, topic string) {
	t.Helper()
	ctx := context.Background()
	a := env.App.ACL()
	if err := a.PutGroup(ctx, env.Tenant, topic, 77, topic, "active"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []int64{rpMember, rpOther} {
		if err := a.PutMember(ctx, env.Tenant, topic, u, "member", nil); err != nil {
			t.Fatal(err)
		}
	}
}

// rpRow is one seeded message.
type rpRow struct {
	seq     int64
	text    string
	status  string    // "" = normal
	created time.Time // zero: derived from the month and seq
	reply   int64
}

// rpCreated is a row's default created_at: inside its month, growing with seq.
func rpCreated(m routing.Month, seq int64) time.Time {
	return m.Start().Add(time.Duration(seq) * time.Second)
}

// rpMessageID is a time-ordered id, as a snowflake is (the topic stands in
// for the node bits).
func rpMessageID(topic string, created time.Time, seq int64) int64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(topic))
	return created.UnixMilli()<<22 | int64(h.Sum32()&0x3ff)<<12 | seq&0xfff
}

// rpInsert writes rows of topic into month m's table and widens the mirror,
// like one persist transaction.
func rpInsert(t testing.TB, env *harness.Env, topic string, m routing.Month, rows ...rpRow) {
	t.Helper()
	ctx := context.Background()
	tbl, _, err := env.App.Catalog().Table(ctx, env.Tenant, m)
	if err != nil {
		t.Fatal(err)
	}
	ins := sq.Insert(tbl.Quoted()).Columns("message_id", "topic", "group_id", "seqid", "from_user", "client_msg_id",
		"msg_type", "status", "content", "reply_seqid", "version", "created_at", "updated_at")
	lo, hi := rows[0].created, rows[0].created
	minSeq, maxSeq := rows[0].seq, rows[0].seq
	for i := range rows {
		r := &rows[i]
		if r.created.IsZero() {
			r.created = rpCreated(m, r.seq)
		}
		if r.status == "" {
			r.status = message.StatusNormal
		}
		if r.text == "" {
			r.text = fmt.Sprintf("message %d", r.seq)
		}
		content, _ := json.Marshal(map[string]string{"text": r.text})
		var reply any
		if r.reply > 0 {
			reply = r.reply
		}
		ins = ins.Values(rpMessageID(topic, r.created, r.seq), topic, 77, r.seq, rpMember, "c"+strconv.FormatInt(r.seq, 10),
			"text", r.status, string(content), reply, 1, r.created, r.created)
		if i == 0 || r.created.Before(lo) {
			lo = r.created
		}
		if r.created.After(hi) {
			hi = r.created
		}
		minSeq, maxSeq = min(minSeq, r.seq), max(maxSeq, r.seq)
	}
	if _, err := ins.RunWith(env.DB).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := routing.Fenced(ctx, env.DB, func(tx *sql.Tx) error {
		return routing.WidenMirror(ctx, tx, []routing.MirrorRow{{Topic: topic,
			MonthRange:   routing.MonthRange{Month: m, MinSeq: minSeq, MaxSeq: maxSeq, Count: int64(len(rows))},
			MinCreatedAt: lo, MaxCreatedAt: hi}})
	}); err != nil {
		t.Fatal(err)
	}
}

// rpSeqs makes rows for seqs lo..hi.
func rpSeqs(lo, hi int64) []rpRow {
	var out []rpRow
	for s := lo; s <= hi; s++ {
		out = append(out, rpRow{seq: s})
	}
	return out
}

// rpSyncRoute sets the topic's Redis route from the mirror, as persist's
// merges would have left it.
func rpSyncRoute(t testing.TB, env *harness.Env, topic string) {
	t.Helper()
	ctx := context.Background()
	ranges, err := routing.LoadMirror(ctx, env.DB, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.App.Routes().Replace(ctx, env.Tenant, topic, ranges); err != nil {
		t.Fatal(err)
	}
}

// rpHide hides [lo, hi) from user through POST …/deletions.
func rpHide(t testing.TB, env *harness.Env, topic string, user, lo, hi int64) {
	t.Helper()
	if code, body := env.Do("POST", "/v1/topics/"+topic+"/deletions", env.Token(user, ""), map[string]int64{"low": lo, "hi": hi}); code != 200 {
		t.Fatalf("hide [%d, %d) of %s for %d: %d %s", lo, hi, topic, user, code, body)
	}
}

// rpPage is a list or search response.
type rpPage struct {
	Messages   []message.Message `json:"messages"`
	NextBefore *int64            `json:"next_before"`
	NextSince  *int64            `json:"next_since"`
	HasMore    bool              `json:"has_more"`
	Gaps       []int64           `json:"gaps"`
}

func (p rpPage) seqs() []int64 {
	out := make([]int64, len(p.Messages))
	for i, m := range p.Messages {
		out[i] = m.Seq
	}
	return out
}

// rpGet GETs path as user (role "" or admin) and decodes a 200 into out.
func rpGet(t testing.TB, env *harness.Env, user int64, role, path string, out any) int {
	t.Helper()
	code, body := env.Do("GET", path, env.Token(user, role), nil)
	if code == 200 && out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
	}
	if code != 200 && out != nil {
		t.Logf("GET %s: %d %s", path, code, body)
	}
	return code
}

// rpList fetches one list page and fails the test on anything but 200.
func rpList(t testing.TB, env *harness.Env, user int64, topic string, q url.Values) rpPage {
	t.Helper()
	var p rpPage
	path := "/v1/topics/" + topic + "/messages"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	if code := rpGet(t, env, user, "", path, &p); code != 200 {
		t.Fatalf("GET %s: status %d", path, code)
	}
	return p
}

// rpWalkBefore pages the whole topic newest first and returns the seqs in
// the order received, checking the cursor rules on every page.
func rpWalkBefore(t testing.TB, env *harness.Env, user int64, topic string, limit int) []int64 {
	t.Helper()
	var all []int64
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("before walk does not end")
		}
		p := rpList(t, env, user, topic, q)
		if len(p.Messages) > limit {
			t.Fatalf("page of %d > limit %d", len(p.Messages), limit)
		}
		all = append(all, p.seqs()...)
		if len(p.Messages) == 0 {
			if p.NextBefore != nil || p.HasMore {
				t.Fatalf("empty before page must have next_before null, has_more false: %+v", p)
			}
			return all
		}
		if p.NextBefore == nil || *p.NextBefore != p.Messages[len(p.Messages)-1].Seq {
			t.Fatalf("next_before %v is not the last seq of the page %v", p.NextBefore, p.seqs())
		}
		if !p.HasMore {
			return all
		}
		q.Set("before", strconv.FormatInt(*p.NextBefore, 10))
	}
}

// rpWalkSince pages the whole topic oldest first from since=0.
func rpWalkSince(t testing.TB, env *harness.Env, user int64, topic string, limit int) []int64 {
	t.Helper()
	seqs, _ := rpWalkSinceGaps(t, env, user, topic, limit)
	return seqs
}

// rpWalkSinceGaps is rpWalkSince that also gathers the gaps the pages report.
func rpWalkSinceGaps(t testing.TB, env *harness.Env, user int64, topic string, limit int) (all, gaps []int64) {
	t.Helper()
	since := int64(0)
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("since walk does not end")
		}
		p := rpList(t, env, user, topic, url.Values{"since": {strconv.FormatInt(since, 10)}, "limit": {strconv.Itoa(limit)}})
		all = append(all, p.seqs()...)
		gaps = append(gaps, p.Gaps...)
		if p.NextSince == nil {
			t.Fatalf("since page without next_since: %+v", p)
		}
		if len(p.Messages) == 0 {
			if *p.NextSince != since || p.HasMore {
				t.Fatalf("empty since page must echo since %d: %+v", since, p)
			}
			return all, gaps
		}
		if *p.NextSince != p.Messages[len(p.Messages)-1].Seq {
			t.Fatalf("next_since %d is not the last seq of %v", *p.NextSince, p.seqs())
		}
		since = *p.NextSince
		if !p.HasMore {
			return all, gaps
		}
	}
}

// rpDesc and rpAsc are the seqs lo..hi in either order.
func rpAsc(lo, hi int64) []int64 {
	var out []int64
	for s := lo; s <= hi; s++ {
		out = append(out, s)
	}
	return out
}

func rpDesc(lo, hi int64) []int64 {
	out := rpAsc(lo, hi)
	slices.Reverse(out)
	return out
}

// rpExpectWalks pages the whole topic as user with since and with before
// (limit per page) and expects want, oldest first, from both.
func rpExpectWalks(t testing.TB, env *harness.Env, stage string, user int64, topic string, limit int, want []int64) {
	t.Helper()
	rpExpect(t, fmt.Sprintf("%s: since walk, limit %d", stage, limit), rpWalkSince(t, env, user, topic, limit), want)
	back := rpWalkBefore(t, env, user, topic, limit)
	slices.Reverse(back)
	rpExpect(t, fmt.Sprintf("%s: before walk, limit %d", stage, limit), back, want)
}

func rpExpect(t testing.TB, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %v\n want %v", what, got, want)
	}
}

// rpMetric sums a metric family of env's registry whose labels include all
// of the given name=value pairs.
func rpMetric(t testing.TB, env *harness.Env, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := env.App.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName()+"="+lp.GetValue() == l {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// rpThreeMonths seeds topic over three months and activates the newest:
// seqs 1–20 in env.Start, 21–40 in the next month, 41–70 in the one after.
func rpThreeMonths(t *testing.T, env *harness.Env, topic string) [3]routing.Month {
	t.Helper()
	ms := [3]routing.Month{env.Start, env.Start.Next(), env.Start.Add(2)}
	rpGroup(t, env, topic)
	rpInsert(t, env, topic, ms[0], rpSeqs(1, 20)...)
	rpInsert(t, env, topic, ms[1], rpSeqs(21, 40)...)
	rpInsert(t, env, topic, ms[2], rpSeqs(41, 70)...)
	env.Activate(ms[1])
	env.Activate(ms[2])
	rpSyncRoute(t, env, topic)
	return ms
}
