package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routecheck"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// coldTopics are sealedMonth's topics and their last seqs.
var coldTopics = map[string]int64{"arch-a": 20, "arch-b": 27, "arch-c": 34}

// coldEnv is a tenant whose sealed month (sealedMonth's) holds, besides
// its varied rows, a recalled, an edited and a deleted-for-everyone
// message and ranges one member hid, archiving to bucket (a URL) — and the
// month's message ids.
func coldEnv(t *testing.T, bucket string, mutate ...func(*config.Config)) (*harness.Env, routing.Month, []int64) {
	t.Helper()
	env := harness.Start(t, harness.Options{Mutate: func(c *config.Config) {
		c.Shard.SealingDays = 0
		c.Send.ProduceTimeout = time.Second
		c.HotCache.LocalTopics = 0 // no process copy: every page reads MySQL or the archive
		c.HotCache.LocalUsers = 0  // nor remembered badges: every count reads them too
		c.HotCache.LocalRoutes = 0
		c.Archive.URL = bucket
		for _, m := range mutate {
			m(c)
		}
	}})
	old, _ := sealedMonth(t, env)
	ctx := context.Background()
	for topic, last := range coldTopics {
		rpGroup(t, env, topic)
		if err := env.App.ACL().PutMember(ctx, env.Tenant, topic, 102, "member", nil); err != nil {
			t.Fatal(err)
		}
		rpSetLast(t, env, topic, last)
	}
	admin := env.Token(1, httpapi.RoleAdmin)
	if code, r := chRecall(t, env, admin, "arch-a", 5, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r.Error)
	}
	if code, r := chEdit(t, env, env.Token(102, ""), "arch-b", 6, chEditBody("edited", 1)); code != 200 {
		t.Fatalf("edit: %d %+v", code, r.Error)
	}
	if code, r := chDeleteAll(t, env, admin, "arch-c", 7, ""); code != 200 {
		t.Fatalf("delete for everyone: %d %+v", code, r.Error)
	}
	rpHide(t, env, "arch-b", rpMember, 2, 5)
	rpHide(t, env, "arch-c", rpMember, 30, 33)
	// read cursors inside the month: badges count the rest of it
	for topic, seq := range map[string]int64{"arch-a": 3, "arch-b": 10, "arch-c": 31} {
		if code, body := env.Do("PUT", "/v1/topics/"+topic+"/read", env.Token(rpMember, ""), map[string]any{"seq": seq}); code != 200 {
			t.Fatalf("read cursor of %s: %d %s", topic, code, body)
		}
	}
	table, _ := routing.TableFor(old)
	rows, err := env.DB.Query("SELECT message_id FROM " + table.Quoted() + " ORDER BY message_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return env, old, append(ids, ids[len(ids)-1]+1000) // and one no month holds
}

// coldWalk reads the topics every way the API reads messages — before and
// since walks at limits (and 50), searches, the changed and hidden seqs and
// a sample of the rest, contexts, by id and the admin lookup — as a member who hid
// ranges and one who hid nothing, and
// returns each response's status and bytes by request (searches in
// window). The hot cache is
// emptied first, so every answer comes from the month's tier.
func coldWalk(t *testing.T, env *harness.Env, ids []int64, limits []int, window url.Values) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys := env.Keys()
	for topic := range coldTopics {
		if err := env.Redis.Do(ctx, env.Redis.B().Del().Key(keys.HotMessages(topic), keys.HotRange(topic)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string]string{}
	get := func(user int64, role, path string) []byte {
		code, body := env.Do("GET", path, env.Token(user, role), nil)
		out[fmt.Sprint(user, role, " ", path)] = fmt.Sprint(code, " ", string(body))
		return body
	}
	seen := map[bool]int{} // messages listed by pages (false) and searches (true)
	walk := func(user int64, base string, limit int, cursor string, search ...string) {
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if cursor == "since" {
			q.Set(cursor, "0")
		}
		if len(search) > 0 {
			q["from"], q["to"], q["q"] = window["from"], window["to"], search
		}
		for range 100 {
			var p rpPage
			_ = json.Unmarshal(get(user, "", base+"?"+q.Encode()), &p)
			seen[len(search) > 0] += len(p.Messages)
			next := p.NextBefore
			if cursor == "since" {
				next = p.NextSince
			}
			if !p.HasMore || next == nil {
				return
			}
			q.Set(cursor, strconv.FormatInt(*next, 10))
		}
	}
	for topic, last := range coldTopics {
		base := "/v1/topics/" + topic + "/messages"
		for _, limit := range limits {
			walk(rpMember, base, limit, "before")
			walk(rpMember, base, limit, "since")
		}
		walk(rpOther, base, 50, "before")
		walk(rpOther, base, 50, "since")
		// search: the texts are m<seq> (the edited one "edited"); case and _ are literal
		search := "/v1/topics/" + topic + "/search"
		for _, text := range []string{"m1", "M1", "1_", "edit"} {
			walk(rpMember, search, 3, "before", text)
		}
		walk(rpOther, search, 50, "before", "m")
		for seq := int64(1); seq <= last+1; seq++ {
			// the changed and hidden seqs, a sample of the rest, one past the end
			if (seq > 7 && seq < 30 || seq > 33) && seq%5 != 0 && seq != last+1 {
				continue
			}
			path := base + "/" + strconv.FormatInt(seq, 10)
			get(rpMember, "", path)
			get(rpOther, "", path)
			if seq%10 == 5 {
				get(rpMember, "", path+"/context?before=3&after=4")
			}
		}
	}
	if seen[false] == 0 || seen[true] == 0 {
		t.Fatalf("the walk listed %d messages in pages, %d in searches", seen[false], seen[true])
	}
	for i, id := range ids {
		if i%5 == 0 || i == len(ids)-1 {
			get(rpMember, "", "/v1/messages/"+strconv.FormatInt(id, 10))
			get(rpAdmin, httpapi.RoleAdmin, "/v1/admin/messages/"+strconv.FormatInt(id, 10))
		}
	}
	coldInbox(t, env, out)
	return out
}

// coldInbox adds to out what the inbox answers the members who hid ranges
// and who hid nothing: badges, the topic list at pages of 1 and 50, and a
// sync from the start (each page's topics only: cursors and tokens carry
// the time of the call).
func coldInbox(t *testing.T, env *harness.Env, out map[string]string) {
	t.Helper()
	for _, user := range []int64{rpMember, rpOther} {
		code, body := env.Do("GET", "/v1/me/unread", env.Token(user, ""), nil)
		out[fmt.Sprint(user, " /v1/me/unread")] = fmt.Sprint(code, " ", string(body))
		for _, limit := range []int{1, 50} {
			q := url.Values{"limit": {strconv.Itoa(limit)}}
			for page := 0; page < 10; page++ {
				code, body := env.Do("GET", "/v1/me/topics?"+q.Encode(), env.Token(user, ""), nil)
				var p struct {
					Topics     json.RawMessage `json:"topics"`
					NextCursor *string         `json:"next_cursor"`
				}
				_ = json.Unmarshal(body, &p)
				out[fmt.Sprint(user, " /v1/me/topics ", limit, " ", page)] = fmt.Sprint(code, " ", string(p.Topics))
				if p.NextCursor == nil {
					break
				}
				q.Set("cursor", *p.NextCursor)
			}
		}
		// by topic: a sync lists the oldest change first, and the route
		// fixes between the walks change the topics
		code, body = env.Do("GET", "/v1/me/sync?limit=50", env.Token(user, ""), nil)
		var p struct {
			Topics []json.RawMessage `json:"topics"`
		}
		_ = json.Unmarshal(body, &p)
		slices.SortFunc(p.Topics, func(a, b json.RawMessage) int { return strings.Compare(string(a), string(b)) })
		raw, _ := json.Marshal(p.Topics)
		out[fmt.Sprint(user, " /v1/me/sync")] = fmt.Sprint(code, " ", string(raw))
	}
}

// coldCompare walks the month from its table, archives it, lets the
// archive drop the table (so any read that still went to it fails) and
// walks again: every answer must be byte-identical.
func coldCompare(t *testing.T, bucket string, limits []int) {
	env, old, ids := coldEnv(t, bucket)
	window := url.Values{"from": {time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)},
		"to": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}
	before := coldWalk(t, env, ids, limits, window)
	routesBefore := coldRoutes(t, env, old)
	rep, err := env.App.NewArchiver().Archive(context.Background(), env.Tenant, old, false)
	if err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	coldDrop(t, env, old)
	coldSame(t, "table", before, "archive", coldWalk(t, env, ids, limits, window))
	coldSame(t, "table", routesBefore, "archive", coldRoutes(t, env, old))
}

// coldRoutes is what the route check answers of the tenant and of each
// topic, and the month's mirror rows after a fix of each topic rewrote
// them (from the month's table or its archive).
func coldRoutes(t *testing.T, env *harness.Env, m routing.Month) map[string]string {
	t.Helper()
	ctx := context.Background()
	rc := env.App.NewRouteCheck()
	out := map[string]string{}
	res, err := rc.Check(ctx, env.Tenant, nil, false, func(routecheck.Difference) {})
	if err != nil {
		t.Fatalf("route check: %v", err)
	}
	out["check"] = fmt.Sprint(res.Topics, res.Differences)
	for topic := range coldTopics {
		st, err := rc.Topic(ctx, env.Tenant, topic)
		if err != nil {
			t.Fatalf("route check of %s: %v", topic, err)
		}
		raw, _ := json.Marshal(st)
		out["topic "+topic] = string(raw)
		if err := rc.Fix(ctx, env.Tenant, topic); err != nil {
			t.Fatalf("route fix of %s: %v", topic, err)
		}
	}
	rows, err := routing.MirrorMonthRows(ctx, env.DB, m)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		out["mirror "+r.Topic] = fmt.Sprint(r.MinSeq, r.MaxSeq, r.Count, r.MinCreatedAt.UTC(), r.MaxCreatedAt.UTC())
	}
	return out
}

// coldDrop waits until the archiver drops archived month m's table (due
// routing.RestoreSettle after the mark with archive.keep_table 0; not
// before) and checks it is gone, counted.
func coldDrop(t *testing.T, env *harness.Env, m routing.Month) {
	t.Helper()
	ctx := context.Background()
	arch := env.App.NewArchiver()
	if dropped, err := arch.DropTables(ctx, env.Tenant); err != nil && !errors.Is(err, archive.ErrBusy) || len(dropped) != 0 {
		t.Fatalf("a drop right after the mark, before every catalog cache saw it: %v %v", dropped, err)
	}
	table := mustTable(t, m)
	exists := func() bool { return tableExists(t, env, table) }
	if !exists() {
		t.Fatalf("the table of %s went right after the mark", m)
	}
	// this run's drop, or the shard manager patrol's (which may come first)
	deadline := time.Now().Add(routing.RestoreSettle + 10*time.Second)
	for exists() {
		if _, err := arch.DropTables(ctx, env.Tenant); err != nil && !errors.Is(err, archive.ErrBusy) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the table of %s was not dropped %s after the mark", m, routing.RestoreSettle+10*time.Second)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := rpMetric(t, env, "imshard_archive_tables_dropped_total"); got != 1 {
		t.Fatalf("imshard_archive_tables_dropped_total %v", got)
	}
	if dropped, err := arch.DropTables(ctx, env.Tenant); err != nil || len(dropped) != 0 {
		t.Fatalf("a second drop: %v %v", dropped, err)
	}
}

// coldSame fails unless walks a and b (coldWalk) answered alike.
func coldSame(t *testing.T, aName string, a map[string]string, bName string, b map[string]string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d answers from the %s, %d from the %s", len(b), bName, len(a), aName)
	}
	diffs := 0
	for req, want := range a {
		if got := b[req]; got != want {
			if diffs++; diffs <= 5 {
				t.Errorf("%s:\n %s: %s\n %s: %s", req, aName, want, bName, got)
			}
		}
	}
	if diffs > 0 {
		t.Fatalf("%d of %d answers differ", diffs, len(a))
	}
}

// Done when (issue 25): a month answers every read — pages before and
// since at several sizes, every seq, contexts, by id and the admin lookup,
// with recalled, edited, deleted-for-everyone and hidden messages — with
// the same bytes from its archive (file backend) as from its table.
func TestArchiveColdReadsAnswerAsTheTable(t *testing.T) {
	t.Parallel()
	coldCompare(t, "file://"+t.TempDir(), []int{3})
}

// TestArchiveUnderLiveTraffic: the month is archived, and its table
// dropped, while a user keeps sending to another group (in the current
// month) and two readers keep reading the month's topics — latest pages and
// since walks as a member who hid ranges — each answer compared with the
// same request's answer before the archive began. No send fails, and no
// read fails or differs at any moment of the export, the verification, the
// mark or the drop; afterwards every read answers as from the table
// (coldWalk), and every live send is read back.
func TestArchiveUnderLiveTraffic(t *testing.T) {
	t.Parallel()
	env, old, ids := coldEnv(t, "file://"+t.TempDir())
	ctx := context.Background()
	window := url.Values{"from": {time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)},
		"to": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}
	before := coldWalk(t, env, ids, []int{7}, window)
	routesBefore := coldRoutes(t, env, old)
	tok := env.Token(rpMember, "")
	var paths []string
	want := map[string]string{}
	for topic := range coldTopics {
		for _, p := range []string{"/v1/topics/" + topic + "/messages?limit=8", "/v1/topics/" + topic + "/messages?since=0&limit=8"} {
			code, body := env.Do("GET", p, tok, nil)
			paths, want[p] = append(paths, p), fmt.Sprint(code, " ", string(body))
		}
	}
	// the sender is a user the walks do not read as: its group is not in
	// their topic lists, badges or syncs
	const liveUser = 103
	if err := env.App.ACL().PutGroup(ctx, env.Tenant, "arch-live", 77, "arch-live", "active"); err != nil {
		t.Fatal(err)
	}
	if err := env.App.ACL().PutMember(ctx, env.Tenant, "arch-live", liveUser, "member", nil); err != nil {
		t.Fatal(err)
	}
	live := startLiveTraffic(t, env, "arch-live", env.Token(liveUser, ""), false)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	var failure atomic.Value
	for r := range 2 {
		wg.Go(func() {
			for i := r; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := paths[i%len(paths)]
				code, body := env.Do("GET", p, tok, nil)
				if got := fmt.Sprint(code, " ", string(body)); got != want[p] {
					failure.Store(fmt.Sprintf("%s during the archive:\n got  %s\n want %s", p, got, want[p]))
					return
				}
				reads.Add(1)
			}
		})
	}
	rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false)
	if err == nil && rep.Step == archive.StepMarked {
		coldDrop(t, env, old)
	}
	close(stop)
	wg.Wait()
	live.stopClean(t)
	if err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive under live traffic: %+v %v", rep, err)
	}
	if f := failure.Load(); f != nil {
		t.Fatal(f)
	}
	if live.sent() == 0 || reads.Load() == 0 {
		t.Fatalf("the traffic did not run during the archive: %d sends, %d reads", live.sent(), reads.Load())
	}
	t.Logf("during the archive and the drop: %d sends, %d reads", live.sent(), reads.Load())
	coldSame(t, "table", before, "archive", coldWalk(t, env, ids, []int{7}, window))
	// the tenant-wide check counts the live group too: it must find no
	// difference; the month's topics and mirror rows answer as before
	routesAfter := coldRoutes(t, env, old)
	if !strings.HasSuffix(routesAfter["check"], " []") {
		t.Fatalf("route check after the archive: %s", routesAfter["check"])
	}
	delete(routesBefore, "check")
	delete(routesAfter, "check")
	coldSame(t, "table", routesBefore, "archive", routesAfter)
	if got := rpWalkSince(t, env, liveUser, "arch-live", 50); fmt.Sprint(got) != fmt.Sprint(live.sortedSeqs()) {
		t.Fatalf("arch-live reads back %v; the sends answered 201 had %v", got, live.sortedSeqs())
	}
}

// The same, smaller, against an S3 protocol server.
func TestArchiveColdReadsAnswerAsTheTableOnS3(t *testing.T) {
	t.Parallel()
	backend := s3mem.New()
	if err := backend.CreateBucket("archive"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	coldCompare(t, "s3://archive?endpoint="+srv.URL+"&use_path_style=true&region=us-east-1&anonymous=true", []int{10})
}

// Changes of archived messages (a recall, an edit, a delete for everyone)
// land in the month's overlay, never in the archive: every read answers
// with them — and the same bytes after the restore has written them into
// the table, and again after the month is archived once more (the new
// archive holds them; the mark clears the overlay).
func TestArchivedMonthChangesLiveInTheOverlay(t *testing.T) {
	ctx := context.Background()
	env, old, ids := coldEnv(t, "file://"+t.TempDir())
	window := url.Values{"from": {time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)},
		"to": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}
	archiver := env.App.NewArchiver()
	if rep, err := archiver.Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	table, _ := routing.TableFor(old)
	kept := tableChecksum(t, env, table)
	admin := env.Token(1, httpapi.RoleAdmin)
	if code, r := chRecall(t, env, admin, "arch-a", 9, nil); code != 200 || r.Message.Status != message.StatusRecalled {
		t.Fatalf("recall of an archived message: %d %+v", code, r.Error)
	}
	if code, r := chEdit(t, env, env.Token(102, ""), "arch-b", 10, chEditBody("edited twice", 1)); code != 200 || chText(r.Message) != "edited twice" {
		t.Fatalf("edit of an archived message: %d %+v", code, r.Error)
	}
	if code, r := chEdit(t, env, env.Token(102, ""), "arch-b", 10, chEditBody("stale", 1)); code != 409 {
		t.Fatalf("an edit of an archived message at an old version: %d %+v", code, r.Error)
	}
	if code, r := chDeleteAll(t, env, admin, "arch-c", 11, "spam"); code != 200 || r.Message.Status != message.StatusDeleted {
		t.Fatalf("delete for everyone of an archived message: %d %+v", code, r.Error)
	}
	if code, r := chRecall(t, env, admin, "arch-a", 9, nil); code != 200 || r.ChangeSeq != 0 {
		t.Fatalf("a repeated recall of an archived message: %d %+v", code, r)
	}
	if revs := chRevisions(t, env, "arch-b", 10); len(revs) != 1 || revs[0].action != message.ActionEdit || revs[0].month != old.String() {
		t.Fatalf("the edit's revision: %+v", revs)
	}
	if got := tableChecksum(t, env, table); got != kept {
		t.Fatal("a change of an archived month wrote its kept table")
	}
	var overlaid int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM im_archive_overlay WHERE shard_month = ?", old.String()).Scan(&overlaid); err != nil || overlaid != 3 {
		t.Fatalf("overlay rows: %d %v, want 3", overlaid, err)
	}
	var p rpPage
	if code := rpGet(t, env, rpMember, "", "/v1/topics/arch-a/messages/9", nil); code != 200 {
		t.Fatalf("read of the recalled archived message: %d", code)
	}
	_ = rpGet(t, env, rpMember, "", "/v1/topics/arch-b/messages?before=11&limit=1", &p)
	if len(p.Messages) != 1 || chText(p.Messages[0]) != "edited twice" {
		t.Fatalf("a page over the edited archived message: %+v", p.Messages)
	}
	archived := coldWalk(t, env, ids, []int{4}, window)

	if _, err := archiver.Restore(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	coldSame(t, "archive and overlay", archived, "restored table", coldWalk(t, env, ids, []int{4}, window))

	// archived again: the new archive holds the changes, the overlay is
	// cleared
	if _, err := env.DB.Exec("UPDATE im_group_message_shards SET unarchived_at = unarchived_at - INTERVAL ? MICROSECOND WHERE shard_month = ?",
		routing.RestoreSettle.Microseconds(), old.String()); err != nil {
		t.Fatal(err)
	}
	if rep, err := archiver.Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive again: %+v %v", rep, err)
	}
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM im_archive_overlay WHERE shard_month = ?", old.String()).Scan(&overlaid); err != nil || overlaid != 0 {
		t.Fatalf("overlay rows after the mark: %d %v, want 0", overlaid, err)
	}
	coldSame(t, "archive and overlay", archived, "archived again", coldWalk(t, env, ids, []int{4}, window))
}

// A user erase reaches archived months: it finds the user's messages by a
// scan of the archive and makes them tombstones in the month's overlay —
// every read answers them deleted, the other users' messages are as they
// were, the archive object and the kept table are untouched — and the
// restore brings the tombstones into the table.
func TestRetentionEraseReachesArchivedMonths(t *testing.T) {
	ctx := context.Background()
	bucket := t.TempDir()
	env, old, _ := coldEnv(t, "file://"+bucket)
	if rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	table, _ := routing.TableFor(old)
	kept := tableChecksum(t, env, table)
	objects := func() string {
		t.Helper()
		var b strings.Builder
		err := filepath.WalkDir(bucket, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			fmt.Fprintln(&b, path, info.Size(), info.ModTime().UnixNano())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	before := objects()
	const user = 101
	// one of the user's messages changed after the archive: its overlay
	// row is the one the erase changes
	if code, r := chRecall(t, env, env.Token(1, httpapi.RoleAdmin), "arch-a", 9, nil); code != 200 || r.Message.Status != message.StatusRecalled {
		t.Fatalf("recall of an archived message: %d %+v", code, r.Error)
	}
	sent := map[string][]int64{}
	rows, err := env.DB.Query("SELECT topic, seqid FROM "+table.Quoted()+" WHERE from_user = ? AND status <> 'deleted' ORDER BY topic, seqid", user)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var topic string
		var seq int64
		if err := rows.Scan(&topic, &seq); err != nil {
			t.Fatal(err)
		}
		sent[topic] = append(sent[topic], seq)
		n++
	}
	rows.Close()
	if n < 10 {
		t.Fatalf("the month holds %d messages of user %d", n, user)
	}
	e := &sendEnv{Env: env, svc: env.Token(900, "service")}
	job := retWaitJob(t, e, retStartJob(t, e, "POST", "/v1/admin/users/"+strconv.Itoa(user)+"/erase"))
	if job.Report.Months[old.String()] != int64(n) {
		t.Fatalf("erase report %+v, want %d messages of %s", job.Report, n, old)
	}
	for topic, seqs := range sent {
		for _, seq := range seqs {
			var m message.Message
			if code := rpGet(t, env, rpOther, "", "/v1/topics/"+topic+"/messages/"+strconv.FormatInt(seq, 10), &m); code != 200 ||
				m.Status != message.StatusDeleted || len(m.Content) > 0 && string(m.Content) != "null" || int64(m.FromUser) != user {
				t.Fatalf("erased %s/%d: %d %+v", topic, seq, code, m)
			}
		}
	}
	var p rpPage
	_ = rpGet(t, env, rpOther, "", "/v1/topics/arch-a/messages?limit=100", &p)
	others := 0
	for _, m := range p.Messages {
		if int64(m.FromUser) == user {
			t.Fatalf("an erased message in a page: %+v", m)
		}
		others++
	}
	if others == 0 {
		t.Fatal("the other users' messages are gone")
	}
	if tableChecksum(t, env, table) != kept || objects() != before {
		t.Fatal("the erase wrote the archive or the kept table")
	}
	// the tombstones by the delete's rule, each one version past the
	// message's — the recalled one past its overlay row's
	for seq, changes := range map[int64]int{9: 2, 13: 1} {
		var archived, erased int
		var content sql.NullString
		var deletedAt sql.NullTime
		if err := env.DB.QueryRow("SELECT version FROM "+table.Quoted()+" WHERE topic = 'arch-a' AND seqid = ?", seq).Scan(&archived); err != nil {
			t.Fatal(err)
		}
		if err := env.DB.QueryRow("SELECT version, content, deleted_at FROM im_archive_overlay WHERE topic = 'arch-a' AND seqid = ? AND status = 'deleted'", seq).
			Scan(&erased, &content, &deletedAt); err != nil || erased != archived+changes || content.Valid || !deletedAt.Valid {
			t.Fatalf("overlay tombstone of arch-a/%d: version %d (archived %d), content %v, deleted_at %v, %v", seq, erased, archived, content, deletedAt, err)
		}
	}
	// asked again: nothing left to change
	if again := retWaitJob(t, e, retStartJob(t, e, "POST", "/v1/admin/users/"+strconv.Itoa(user)+"/erase")); again.Report.Months[old.String()] != 0 {
		t.Fatalf("a second erase: %+v", again.Report)
	}
	if _, err := env.App.NewArchiver().Restore(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM "+table.Quoted()+" WHERE from_user = ? AND (status <> 'deleted' OR content IS NOT NULL)", user).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after the restore, %d messages of the user are not tombstones (%v)", left, err)
	}
}

// An erase batch makes its tombstones from its month's scan only while the
// month is still archived at the scan's epoch: a scan made before a
// restore and a new archive, with the message changed between them, is
// not used — the tombstone is one version past the new archive's row, not
// past the row the scan found.
func TestRetentionEraseScanOfAnEarlierArchive(t *testing.T) {
	ctx := context.Background()
	env, old, _ := coldEnv(t, "file://"+t.TempDir())
	archiver := env.App.NewArchiver()
	if rep, err := archiver.Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	const user = 101
	scan, err := routing.ScanArchived(ctx, env.DB, old, func() ([]routing.ArchivedRow, error) {
		return env.App.NewColdReader().SentBy(ctx, env.Tenant, old, user)
	})
	if err != nil || scan == nil {
		t.Fatalf("scan of the archived month: %v %v", scan, err)
	}
	i := slices.IndexFunc(scan.Rows, func(r routing.ArchivedRow) bool { return r.Status == message.StatusNormal })
	if i < 0 {
		t.Fatalf("no message of user %d as sent in the archive: %+v", user, scan.Rows)
	}
	msg := scan.Rows[i]
	if current, err := scan.Current(ctx, env.DB); err != nil || !current {
		t.Fatalf("the scan of the month as it is archived is not current: %v", err)
	}
	if _, err := archiver.Restore(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	table, _ := routing.TableFor(old)
	if _, err := env.DB.Exec("UPDATE "+table.Quoted()+" SET version = version + 3 WHERE topic = ? AND seqid = ?", msg.Topic, msg.Seq); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("UPDATE im_group_message_shards SET unarchived_at = unarchived_at - INTERVAL ? MICROSECOND WHERE shard_month = ?",
		routing.RestoreSettle.Microseconds(), old.String()); err != nil {
		t.Fatal(err)
	}
	if rep, err := archiver.Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive again: %+v %v", rep, err)
	}
	if current, err := scan.Current(ctx, env.DB); err != nil || current {
		t.Fatalf("the scan of the earlier archive is current: %v", err)
	}
	n, _, err := env.App.NewChanges().EraseMessages(ctx, env.Tenant, old, []routing.MessageRef{{Topic: msg.Topic, Seq: msg.Seq}}, scan,
		"test", func(*sql.Tx, int64, int64) error { return nil })
	if err != nil || n != 1 {
		t.Fatalf("erase: %d %v", n, err)
	}
	var version int
	if err := env.DB.QueryRow("SELECT version FROM im_archive_overlay WHERE topic = ? AND seqid = ? AND status = 'deleted' AND content IS NULL",
		msg.Topic, msg.Seq).Scan(&version); err != nil || version != msg.Version+4 {
		t.Fatalf("the tombstone of %s/%d: version %d (%v), want %d: one past the new archive's", msg.Topic, msg.Seq, version, err, msg.Version+4)
	}
}

// A month past retention that is archived is dropped whole like a sealed
// one — its archive objects, overlay and record with it — once its every
// topic expired; its floors are raised first, so no read reaches it after.
func TestRetentionDropsAnArchivedMonth(t *testing.T) {
	ctx := context.Background()
	bucket := t.TempDir()
	env, old, _ := coldEnv(t, "file://"+bucket)
	if rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	if code, r := chRecall(t, env, env.Token(1, httpapi.RoleAdmin), "arch-a", 9, nil); code != 200 {
		t.Fatalf("recall of an archived message: %d %+v", code, r.Error)
	}
	monthDir := filepath.Join(bucket, env.Tenant, old.String())
	if entries, err := os.ReadDir(monthDir); len(entries) == 0 {
		t.Fatalf("no archive objects in %s: %v", monthDir, err)
	}
	env.Reload(func(c *config.Config) { c.Tenants[0].RetentionMonths = 2 })
	plan, err := env.App.Retention().Plan(ctx, env.Tenant)
	if err != nil || len(plan.Drops) != 1 || plan.Drops[0].Month != old.String() || !plan.Drops[0].Archived || plan.Drops[0].Rows != 81 {
		t.Fatalf("plan: %+v %v", plan, err)
	}
	rep, err := env.App.Retention().Run(ctx, env.Tenant)
	if err != nil || rep.Months != 1 || rep.RowsDropped != 81 {
		t.Fatalf("run: %+v %v", rep, err)
	}
	if entries, err := os.ReadDir(monthDir); len(entries) != 0 || err != nil && !os.IsNotExist(err) {
		t.Fatalf("the month's archive objects are still there: %v %v", entries, err)
	}
	for table, want := range map[string]int{"im_archives": 0, "im_archive_overlay": 0, "im_group_message_shards": 0} {
		var n int
		if err := env.DB.QueryRow("SELECT COUNT(*) FROM "+table+" WHERE shard_month = ?", old.String()).Scan(&n); err != nil || n != want {
			t.Fatalf("%s rows of %s: %d %v", table, old, n, err)
		}
	}
	code, body := env.Do("GET", "/v1/topics/arch-a/messages/5", env.Token(rpMember, ""), nil)
	if code != 404 || !strings.Contains(string(body), "expired") {
		t.Fatalf("an expired seq of the dropped archived month: %d %s", code, body)
	}
	var p rpPage
	if code := rpGet(t, env, rpMember, "", "/v1/topics/arch-a/messages?limit=50", &p); code != 200 || len(p.Messages) != 0 || p.HasMore {
		t.Fatalf("the latest page after the drop: %d %+v", code, p)
	}
	if again, err := env.App.Retention().Run(ctx, env.Tenant); err != nil || again.Months != 0 {
		t.Fatalf("a second run: %+v %v", again, err)
	}
}

// A read of an archived month asks MySQL for the month's overlay only
// once the month may have one: a month without changes is read without
// the lookup (skipped), and the first change of it — marked in the
// tenant's set before its transaction commits — is seen by the next read,
// in this process as in any other. Overlay rows written before the set
// existed are found when it is first filled.
func TestArchivedMonthOverlayLookedUpOnlyOnceChanged(t *testing.T) {
	ctx := context.Background()
	env, old, _ := coldEnv(t, "file://"+t.TempDir())
	if rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	overlay := func(result string) float64 {
		return persistMetric(t, env, "imshard_query_overlay_total", `result="`+result+`"`)
	}
	page := func(topic string, before int) message.Message {
		t.Helper()
		var p rpPage
		if code := rpGet(t, env, rpMember, "", fmt.Sprintf("/v1/topics/%s/messages?before=%d&limit=1", topic, before), &p); code != 200 || len(p.Messages) != 1 {
			t.Fatalf("page of %s before %d: %d %+v", topic, before, code, p.Messages)
		}
		return p.Messages[0]
	}
	skipped, read := overlay("skipped"), overlay("read")
	for range 3 {
		if m := page("arch-b", 11); m.Status == message.StatusRecalled {
			t.Fatalf("an unchanged archived message: %+v", m)
		}
	}
	if got := overlay("skipped") - skipped; got != 3 || overlay("read") != read {
		t.Fatalf("overlay lookups of a month without changes: %v skipped, %v read (want 3, 0)", got, overlay("read")-read)
	}
	// another process changes the month after this one found it unchanged
	if code, r := chRecall(t, env, env.Token(1, httpapi.RoleAdmin), "arch-b", 10, nil); code != 200 {
		t.Fatalf("recall of an archived message: %d %+v", code, r.Error)
	}
	if m := page("arch-b", 11); m.Status != message.StatusRecalled {
		t.Fatalf("the page after the recall: %+v", m)
	}
	if overlay("read") != read+1 {
		t.Fatalf("overlay reads after the change: %v, want %v", overlay("read"), read+1)
	}

	// overlay rows from before the set: a tenant whose set was never filled
	keys := env.Keys()
	if err := env.Redis.Do(ctx, env.Redis.B().Del().Key(keys.OverlayMonths()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec(`INSERT INTO im_archive_overlay (topic, seqid, shard_month, message_id, status, content, version, updated_at)
		SELECT topic, seqid, ?, message_id, 'recalled', content, version + 1, updated_at FROM `+mustTable(t, old).Quoted()+
		` WHERE topic = 'arch-c' AND seqid = 12`, old.String()); err != nil {
		t.Fatal(err)
	}
	for m, want := range map[routing.Month]bool{old: true, old.Prev(): false} {
		if may, err := routing.MayHaveOverlay(ctx, env.Redis, keys, env.DB, m); err != nil || may != want {
			t.Fatalf("month %s with the set filled from the table: %v %v, want %v", m, may, err, want)
		}
	}
	months, err := env.Redis.Do(ctx, env.Redis.B().Smembers().Key(keys.OverlayMonths()).Build()).AsStrSlice()
	if slices.Sort(months); err != nil || !slices.Equal(months, []string{old.String(), "complete"}) {
		t.Fatalf("the set filled from the table: %v %v", months, err)
	}
}

func mustTable(t *testing.T, m routing.Month) routing.Table {
	t.Helper()
	tbl, err := routing.TableFor(m)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// Redis losing the set of overlaid months while a change of an archived
// month is under way — after the change marked the month, before it
// committed — lets a reader refill the set from MySQL without the month
// and mark it complete: the change marks the month again once it
// committed, so no reader after its answer skips its overlay.
func TestArchivedMonthChangeSurvivesTheOverlaySetLostBeforeItsCommit(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	wire := testenv.CountRedisCommands(t, srv.Addr)
	env, old, _ := coldEnv(t, "file://"+t.TempDir(), func(c *config.Config) { c.Redis.Addrs = []string{wire.Addr} })
	if rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	keys := env.Keys()
	direct := testenv.RedisClient(t, srv.Addr)
	// after the change's mark (SADD of the set), before its caches are
	// told (the message-version script, the last Redis call before the
	// commit): the set lost, and refilled by a reader while the change's
	// rows were not committed
	var marked atomic.Bool
	wire.Before(func(args []string) bool {
		switch {
		case strings.EqualFold(args[0], "sadd") && len(args) > 1 && args[1] == keys.OverlayMonths():
			marked.Store(true)
		case marked.Load() && slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, keys.MessagesVersion("arch-b")) }):
			return true
		}
		return false
	}, func() {
		for _, c := range []rueidis.Completed{
			direct.B().Del().Key(keys.OverlayMonths()).Build(),
			direct.B().Sadd().Key(keys.OverlayMonths()).Member("complete").Build(),
		} {
			if err := direct.Do(ctx, c).Error(); err != nil {
				t.Error(err)
			}
		}
	})
	if code, r := chRecall(t, env, env.Token(1, httpapi.RoleAdmin), "arch-b", 10, nil); code != 200 {
		t.Fatalf("recall of an archived message: %d %+v", code, r.Error)
	}
	if !marked.Load() {
		t.Fatal("the change never marked the month")
	}
	var p rpPage
	if code := rpGet(t, env, rpMember, "", "/v1/topics/arch-b/messages?before=11&limit=1", &p); code != 200 || len(p.Messages) != 1 || p.Messages[0].Status != message.StatusRecalled {
		t.Fatalf("the page after the recall answered: %d %+v, want the message recalled", code, p.Messages)
	}
}

// The topic list places a topic active since its snapshot by its newest
// message created before the snapshot: when that is in an archived month,
// it is read from the archive — the month's table is gone.
func TestArchivedMonthTopicListActivityWithoutTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env, old, _ := coldEnv(t, "file://"+t.TempDir())
	type entry struct{ Topic, ActivityAt string }
	list := func(q url.Values) ([]entry, *string) {
		t.Helper()
		var p struct {
			Topics     []entry `json:"topics"`
			NextCursor *string `json:"next_cursor"`
		}
		if code := rpGet(t, env, rpOther, "", "/v1/me/topics?"+q.Encode(), &p); code != 200 {
			t.Fatalf("topic list %s: %d", q.Encode(), code)
		}
		return p.Topics, p.NextCursor
	}
	want, _ := list(url.Values{"limit": {"50"}})
	if len(want) != len(coldTopics) {
		t.Fatalf("topic list: %+v", want)
	}
	if rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	table := mustTable(t, old)
	if _, err := env.DB.Exec("RENAME TABLE " + table.Quoted() + " TO `" + table.Name() + "_away`"); err != nil {
		t.Fatal(err)
	}
	got, next := list(url.Values{"limit": {"1"}})
	time.Sleep(5 * time.Millisecond)
	// a message after the snapshot in every topic, in the current month
	now := env.Now()
	for topic, last := range coldTopics {
		rpInsert(t, env, topic, now, rpRow{seq: last + 1, created: time.Now()})
	}
	for next != nil {
		var page []entry
		page, next = list(url.Values{"limit": {"1"}, "cursor": {*next}})
		got = append(got, page...)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("topic list after the snapshot:\n got %+v\nwant %+v", got, want)
	}
}

// A hold on a user keeps an archived month past retention whole when the
// user sent messages in it: the held user's messages are found in the
// month's archive (its table is gone), in the plan and again in the run.
func TestRetentionHoldKeepsAnArchivedMonthWithoutItsTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env, old, _ := coldEnv(t, "file://"+t.TempDir())
	if rep, err := env.App.NewArchiver().Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	table := mustTable(t, old)
	if _, err := env.DB.Exec("RENAME TABLE " + table.Quoted() + " TO `" + table.Name() + "_away`"); err != nil {
		t.Fatal(err)
	}
	// user 101 sent seqs 1, 5, 9, … of every topic
	if code, body := env.Do("PUT", "/v1/admin/holds/case-1", env.Token(1, httpapi.RoleAdmin),
		map[string]any{"tenant": env.Tenant, "users": []int{101}, "reason": "litigation 7"}); code != 200 {
		t.Fatalf("put hold: %d %s", code, body)
	}
	env.Reload(func(c *config.Config) { c.Tenants[0].RetentionMonths = 2 })
	plan, err := env.App.Retention().Plan(ctx, env.Tenant)
	if err != nil || len(plan.Drops) != 0 || len(plan.Held) != len(coldTopics) {
		t.Fatalf("plan: %+v %v", plan, err)
	}
	for _, h := range plan.Held {
		if h.Month != old.String() || h.Reason != "user 101 under hold case-1: litigation 7" {
			t.Fatalf("held: %+v", h)
		}
	}
	if rep, err := env.App.Retention().Run(ctx, env.Tenant); err != nil || rep.Months != 0 {
		t.Fatalf("run: %+v %v", rep, err)
	}
	if _, st := archiveStep(t, env, old); st != routing.StatusArchived {
		t.Fatalf("the held month is %s", st)
	}
}
