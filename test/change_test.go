package test

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/test/harness"
)

// TestChangeBeforeSendAckNeverUndoneByTheAck: a recall that commits
// between a send's broker ack and the send's call after it — persist stored
// the message first — wins: the late call neither puts the message as sent
// back into the hot cache nor publishes it, and pages keep showing the
// recall.
func TestChangeBeforeSendAckNeverUndoneByTheAck(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	rpGroup(t, env, "chlate")
	tok := env.Token(rpMember, "")
	seq, _ := rpPost(t, env, tok, "chlate", "late-1", "as sent")
	rpPost(t, env, tok, "chlate", "late-2", "after it")
	chWaitSettled(t, env, "chlate")
	var member string
	for _, z := range chHot(t, env, "chlate") {
		if int64(z.Score) == seq {
			member = z.Member
		}
	}
	if member == "" {
		t.Fatalf("seq %d is not in the hot cache", seq)
	}
	if code, r := chRecall(t, env, tok, "chlate", seq, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r.Error)
	}

	// the send's own call after its ack comes only now
	reply := sentAfterAck(t, env, "chlate", rpMember, "late-1", seq, member)
	if chHotHolds(t, env, "chlate", "as sent") {
		t.Fatalf("the late ack put the recalled message back into the hot cache: %v", chHot(t, env, "chlate"))
	}
	for _, m := range rpList(t, env, rpOther, "chlate", url.Values{"limit": {"20"}}).Messages {
		if m.Seq == seq && m.Status != message.StatusRecalled {
			t.Fatalf("a page served the message as sent after its recall: %+v", m)
		}
	}
	if reply != 2 {
		t.Fatalf("the late call answered %d, want 2 (stored already, neither cached nor published)", reply)
	}
}

// TestChangeRecallInFlight: a message acknowledged to its sender but not
// stored yet (no persist role runs: it waits in Kafka) is never a 404 for
// a recall: 409 with details.retry_after_ms, nothing recorded; once
// persist stored it, the same recall succeeds, and repeating it answers the
// tombstone again without a second revision.
func TestChangeRecallInFlight(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Roles: []string{"send", "query"}})
	rpGroup(t, env, "chfly")
	tok := env.Token(rpMember, "")
	seq, _ := rpPost(t, env, tok, "chfly", "c1", "oops")
	code, r := chRecall(t, env, tok, "chfly", seq, nil)
	if code != 409 || r.Error.Code != "conflict" || r.Error.Details["retry_after_ms"] == nil {
		t.Fatalf("recall in flight: %d %+v, want 409 conflict with retry_after_ms", code, r.Error)
	}
	if n := chCount(t, env, "im_message_revisions", sq.Eq{"topic": "chfly"}); n != 0 {
		t.Fatalf("a refused recall wrote %d revisions", n)
	}
	harness.Start(t, harness.Options{Roles: []string{"persist"}, Tenant: env.Tenant, Brokers: env.Config.Kafka.Brokers})
	sendWaitFor(t, 30*time.Second, "the recall once stored", func() bool {
		code, r = chRecall(t, env, tok, "chfly", seq, map[string]string{"reason": "typo"})
		return code != 409
	})
	if code != 200 || r.Message.Status != message.StatusRecalled || r.Message.Version != 2 || r.ChangeSeq != 1 || string(r.Message.Content) != "null" {
		t.Fatalf("recall once stored: %d %+v", code, r)
	}
	var m message.Message
	if rpGet(t, env, rpOther, "", chSeqPath("chfly", seq), &m); m.Status != message.StatusRecalled || string(m.Content) != "null" {
		t.Fatalf("exact lookup after the recall: %+v", m)
	}
	p := rpList(t, env, rpOther, "chfly", nil)
	if len(p.Messages) != 1 || p.Messages[0].Status != message.StatusRecalled || string(p.Messages[0].Content) != "null" {
		t.Fatalf("list after the recall: %+v", p.Messages)
	}
	if code, again := chRecall(t, env, tok, "chfly", seq, nil); code != 200 || again.ChangeSeq != 0 || again.Message.Version != 2 {
		t.Fatalf("repeated recall: %d %+v", code, again)
	}
	revs := chRevisions(t, env, "chfly", seq)
	if len(revs) != 1 || revs[0].action != "recall" || revs[0].content != `{"text": "oops"}` && revs[0].content != `{"text":"oops"}` ||
		revs[0].reason != "typo" || revs[0].actor != rpMember || revs[0].version != 2 || revs[0].changeSeq != 1 || revs[0].month == "" {
		t.Fatalf("revisions: %+v", revs)
	}
}

// TestChangeDeleteForEveryone: an admin's delete for everyone clears the
// message in MySQL and in the hot cache (a tombstone takes its place),
// lists skip it, lookups show the tombstone, a revision keeps the old
// content and one change event is published; anyone else gets 403.
func TestChangeDeleteForEveryone(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	rpGroup(t, env, "chdel")
	tok := env.Token(rpMember, "")
	for i := 1; i <= 5; i++ {
		rpPost(t, env, tok, "chdel", fmt.Sprintf("c%d", i), fmt.Sprintf("secret %d", i))
	}
	chWaitSettled(t, env, "chdel")
	events := chSubscribe(t, env, "chdel")
	if !chHotHolds(t, env, "chdel", "secret 3") {
		t.Fatal("the hot cache should hold the message before the delete")
	}
	for _, who := range []string{env.Token(rpMember, ""), env.Token(rpOther, ""), env.Token(900, "service")} {
		if code, r := chDeleteAll(t, env, who, "chdel", 3, ""); code != 403 {
			t.Fatalf("delete for everyone without the admin role: %d %+v", code, r.Error)
		}
	}
	code, r := chDeleteAll(t, env, env.Token(rpAdmin, "admin"), "chdel", 3, "spam")
	if code != 200 || r.Message.Status != message.StatusDeleted || r.ChangeSeq != 1 || r.Message.Version != 2 {
		t.Fatalf("delete for everyone: %d %+v", code, r)
	}
	if chHotHolds(t, env, "chdel", "secret 3") {
		t.Fatalf("the hot cache still holds the deleted content: %v", chHot(t, env, "chdel"))
	}
	rpExpect(t, "lists skip the deleted message", rpList(t, env, rpMember, "chdel", nil).seqs(), []int64{5, 4, 2, 1})
	rpExpect(t, "from MySQL too", rpList(t, env, rpMember, "chdel", url.Values{"before": {"5"}}).seqs(), []int64{4, 2, 1})
	var m message.Message
	if rpGet(t, env, rpOther, "", chSeqPath("chdel", 3), &m); m.Status != message.StatusDeleted || string(m.Content) != "null" {
		t.Fatalf("exact lookup of the deleted message: %+v", m)
	}
	tbl, _, err := env.App.Catalog().Table(t.Context(), env.Tenant, env.Start)
	if err != nil {
		t.Fatal(err)
	}
	if n := chCount(t, env, tbl.Name(), sq.Eq{"topic": "chdel", "seqid": 3, "status": "deleted", "content": nil, "head": nil}); n != 1 {
		t.Fatalf("MySQL row not cleared: %d", n)
	}
	revs := chRevisions(t, env, "chdel", 3)
	if len(revs) != 1 || revs[0].action != "delete" || !strings.Contains(revs[0].content, "secret 3") || revs[0].reason != "spam" || revs[0].actor != rpAdmin {
		t.Fatalf("revisions: %+v", revs)
	}
	select {
	case ev := <-events:
		if ev.Topic != "chdel" || ev.Seq != 3 || ev.Action != "delete" || ev.ChangeSeq != 1 || ev.Version != 2 || ev.MessageID != r.Message.MessageID {
			t.Fatalf("change event: %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no change event")
	}
	if code, again := chDeleteAll(t, env, env.Token(rpAdmin, "admin"), "chdel", 3, ""); code != 200 || again.ChangeSeq != 0 {
		t.Fatalf("repeated delete: %d %+v", code, again)
	}
}

// TestChangeRefusalsChangeNothing: unknown seq 404, non-member 403, member
// who is not the sender 403, the sender after the recall window 403 naming
// the window, malformed requests 400 — and not one revision or change_seq
// written. A group owner and an admin token recall at any time.
func TestChangeRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "chbad")
	sender := env.Token(rpMember, "")
	for _, c := range []struct {
		name   string
		token  string
		seq    string
		body   any
		status int
		want   string
	}{
		{"unknown seq", sender, "999", nil, 404, "not_found"},
		{"non-member", env.Token(rpStranger, ""), "3", nil, 403, "permission_denied"},
		{"member, not the sender", env.Token(rpOther, ""), "3", nil, 403, "permission_denied"},
		{"sender after the window", sender, "3", nil, 403, "recall_window"},
		{"bad seq", sender, "x", nil, 400, "invalid_argument"},
		{"unknown field", sender, "3", map[string]any{"why": "x"}, 400, "invalid_argument"},
		{"long reason", sender, "3", map[string]any{"reason": strings.Repeat("r", 256)}, 400, "invalid_argument"},
	} {
		code, body := env.Do("POST", "/v1/topics/chbad/messages/"+c.seq+"/recall", c.token, c.body)
		if code != c.status || !strings.Contains(string(body), c.want) {
			t.Fatalf("%s: %d %s, want %d %s", c.name, code, body, c.status, c.want)
		}
	}
	if n := chCount(t, env, "im_message_revisions", sq.Eq{"topic": "chbad"}); n != 0 {
		t.Fatalf("refused changes wrote %d revisions", n)
	}
	if n := chCount(t, env, "im_topic_changes", sq.Eq{"topic": "chbad"}); n != 0 {
		t.Fatalf("refused changes allocated a change_seq")
	}
	if err := env.App.ACL().PutMember(t.Context(), env.Tenant, "chbad", rpOther, "owner", nil); err != nil {
		t.Fatal(err)
	}
	if code, r := chRecall(t, env, env.Token(rpOther, ""), "chbad", 3, nil); code != 200 || r.ChangeSeq != 1 {
		t.Fatalf("owner's recall of a months-old message: %d %+v", code, r)
	}
	if code, r := chRecall(t, env, env.Token(rpAdmin, "admin"), "chbad", 25, nil); code != 200 || r.ChangeSeq != 2 {
		t.Fatalf("admin's recall: %d %+v", code, r)
	}
	if rpMetric(t, env, "imshard_message_changes_total", "action=recall", "result=permission_denied") != 3 ||
		rpMetric(t, env, "imshard_message_changes_total", "action=recall", "result=ok") != 2 ||
		rpMetric(t, env, "imshard_message_changes_total", "action=recall", "result=invalid_argument") != 3 {
		t.Fatal("change metrics by action and result")
	}
}

// TestChangeCopiesNeverServeOldVersion: a query process keeping copies of
// the newest messages (not the one changing them) never answers the old
// version of a message once its recall or edit was answered — neither a page read
// right after it nor any page of readers running alongside that started
// after the answer.
func TestChangeCopiesNeverServeOldVersion(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	reader := harness.Start(t, harness.Options{Roles: []string{"query"}, Tenant: env.Tenant})
	rpGroup(t, env, "chcopy")
	tok := env.Token(rpMember, "")
	for i := 1; i <= 30; i++ {
		rpPost(t, env, tok, "chcopy", fmt.Sprintf("c%d", i), fmt.Sprintf("text %d", i))
	}
	chWaitSettled(t, env, "chcopy")
	admin := env.Token(rpAdmin, "admin")
	latest := func() rpPage { return rpList(t, reader, rpOther, "chcopy", url.Values{"limit": {"20"}}) }
	latest()
	latest()
	if rpMetric(t, reader, "imshard_query_hot_local_total", "result=hit") < 1 {
		t.Fatal("the reader should answer from its copy")
	}
	if code, r := chRecall(t, env, admin, "chcopy", 28, nil); code != 200 {
		t.Fatalf("recall: %d %+v", code, r.Error)
	}
	for _, m := range latest().Messages {
		if m.Seq == 28 && m.Status != message.StatusRecalled {
			t.Fatalf("the reader's copy served the old version: %+v", m)
		}
	}
	if rpMetric(t, reader, "imshard_query_hot_local_total", "result=changed") < 1 {
		t.Fatal("the change should have ended the reader's copy")
	}

	// readers alongside: a page started after a change's answer shows it
	var answered atomic.Int64 // recalls answered so far: seqs 27, 26, ... down
	var edited atomic.Int64   // the version of seq 19 answered last
	edited.Store(1)
	stop := make(chan struct{})
	errs := make(chan string, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				done, version := answered.Load(), edited.Load()
				for _, m := range latest().Messages {
					if m.Seq > 27-done && m.Seq <= 27 && m.Status != message.StatusRecalled {
						errs <- fmt.Sprintf("seq %d served as %s after its recall was answered", m.Seq, m.Status)
						return
					}
					if m.Seq == 19 && (int64(m.Version) < version || m.Version > 1 && chText(m) != fmt.Sprintf("edit %d", m.Version)) {
						errs <- fmt.Sprintf("seq 19 served as version %d %q after version %d was answered", m.Version, chText(m), version)
						return
					}
				}
			}
		}()
	}
	for i := range int64(8) {
		if code, r := chRecall(t, env, admin, "chcopy", 27-i, nil); code != 200 {
			t.Fatalf("recall %d: %d %+v", 27-i, code, r.Error)
		}
		answered.Store(i + 1)
		if code, r := chEdit(t, env, tok, "chcopy", 19, chEditBody(fmt.Sprintf("edit %d", i+2), int(i+1))); code != 200 {
			t.Fatalf("edit %d: %d %+v", i+2, code, r.Error)
		}
		edited.Store(i + 2)
		latest()
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestChangeRedisFailureChangesNothing: when the caches cannot be told
// before the commit (here the hot-cache key holds a value of the wrong
// type, so the pre-commit script fails), the change answers 503 and
// nothing is changed: the row, the revisions and the change sequence stay
// as they were; the retry succeeds once Redis answers again.
func TestChangeRedisFailureChangesNothing(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	ms := rpThreeMonths(t, env, "chred")
	keys := env.Keys()
	hot := keys.HotMessages("chred")
	if err := env.Redis.Do(t.Context(), env.Redis.B().Set().Key(hot).Value("not a zset").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	admin := env.Token(rpAdmin, "admin")
	if code, r := chRecall(t, env, admin, "chred", 50, nil); code != 503 || r.Error.Code != "unavailable" {
		t.Fatalf("recall with Redis failing: %d %+v", code, r.Error)
	}
	tbl, _, err := env.App.Catalog().Table(t.Context(), env.Tenant, ms[2])
	if err != nil {
		t.Fatal(err)
	}
	if n := chCount(t, env, tbl.Name(), sq.Eq{"topic": "chred", "seqid": 50, "status": "normal", "version": 1}); n != 1 {
		t.Fatal("the failed recall changed the row")
	}
	if n := chCount(t, env, "im_message_revisions", sq.Eq{"topic": "chred"}) + chCount(t, env, "im_topic_changes", sq.Eq{"topic": "chred"}); n != 0 {
		t.Fatal("the failed recall left a revision or a change_seq")
	}
	if err := env.Redis.Do(t.Context(), env.Redis.B().Del().Key(hot).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if code, r := chRecall(t, env, admin, "chred", 50, nil); code != 200 || r.ChangeSeq != 1 {
		t.Fatalf("the retry: %d %+v", code, r)
	}
}

// TestChangeEditConcurrentOneVersion: four edits based on the same
// version race; exactly one is answered 200, the others 409 with the
// version they lost to, and only the winner left a revision.
func TestChangeEditConcurrentOneVersion(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "chrace")
	tok := env.Token(rpMember, "")
	codes := make([]int, 4)
	results := make([]chResult, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], results[i] = chEdit(t, env, tok, "chrace", 30, chEditBody(fmt.Sprintf("edit %d", i), 1))
		}()
	}
	wg.Wait()
	won := -1
	for i, code := range codes {
		switch {
		case code == 200 && won < 0:
			won = i
		case code == 409 && results[i].Error.Details["current_version"] == float64(2):
		default:
			t.Fatalf("edit %d: %d %+v (codes %v)", i, code, results[i].Error, codes)
		}
	}
	if won < 0 {
		t.Fatalf("no edit won: %v", codes)
	}
	var m message.Message
	rpGet(t, env, rpOther, "", chSeqPath("chrace", 30), &m)
	if m.Version != 2 || chText(m) != fmt.Sprintf("edit %d", won) {
		t.Fatalf("stored after the race: %+v, winner %d", m, won)
	}
	if revs := chRevisions(t, env, "chrace", 30); len(revs) != 1 || revs[0].action != "edit" || !strings.Contains(revs[0].content, "message 30") {
		t.Fatalf("revisions: %+v", revs)
	}
}

// TestChangeEditRules: only the sender edits (or a service token naming
// the sender); the body is checked as a send's; a recalled message and a
// stale version are conflicts; refusals change nothing.
func TestChangeEditRules(t *testing.T) {
	t.Parallel()
	env := rpStart(t)
	rpThreeMonths(t, env, "chedit")
	sender, svc := env.Token(rpMember, ""), env.Token(900, "service")
	deep := strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40)
	for _, c := range []struct {
		name   string
		token  string
		seq    int64
		body   any
		status int
		want   string
	}{
		{"member, not the sender", env.Token(rpOther, ""), 10, chEditBody("x", 1), 403, "permission_denied"},
		{"non-member", env.Token(rpStranger, ""), 10, chEditBody("x", 1), 403, "permission_denied"},
		{"admin token", env.Token(rpAdmin, "admin"), 10, chEditBody("x", 1), 403, "permission_denied"},
		{"service for another member", svc, 10, map[string]any{"content": map[string]any{}, "expected_version": 1, "from_user": rpOther}, 403, "permission_denied"},
		{"from_user without the service role", sender, 10, map[string]any{"content": map[string]any{}, "expected_version": 1, "from_user": rpMember}, 400, "invalid_argument"},
		{"unknown seq", sender, 999, chEditBody("x", 1), 404, "not_found"},
		{"content not an object", sender, 10, map[string]any{"content": "hi", "expected_version": 1}, 400, "content"},
		{"content missing", sender, 10, map[string]any{"expected_version": 1}, 400, "content"},
		{"head not an object", sender, 10, map[string]any{"content": map[string]any{}, "head": []int{1}, "expected_version": 1}, 400, "head"},
		{"content nested too deep", sender, 10, []byte(`{"content":` + deep + `,"expected_version":1}`), 400, "nest"},
		{"expected_version missing", sender, 10, map[string]any{"content": map[string]any{}}, 400, "expected_version"},
		{"mentions are not editable", sender, 10, map[string]any{"content": map[string]any{}, "expected_version": 1, "mentioned_user_ids": []int{5}}, 400, "invalid_argument"},
		{"stale version", sender, 10, chEditBody("x", 3), 409, "current_version"},
	} {
		code, out := env.Do("PATCH", chSeqPath("chedit", c.seq), c.token, c.body)
		if code != c.status || !strings.Contains(string(out), c.want) {
			t.Fatalf("%s: %d %s, want %d %s", c.name, code, out, c.status, c.want)
		}
	}
	if n := chCount(t, env, "im_message_revisions", sq.Eq{"topic": "chedit"}) + chCount(t, env, "im_topic_changes", sq.Eq{"topic": "chedit"}); n != 0 {
		t.Fatalf("refused edits wrote %d rows", n)
	}
	// the service role edits for the sender; head null clears it, absent keeps it
	code, r := chEdit(t, env, svc, "chedit", 10, map[string]any{"content": map[string]any{"text": "by service"}, "head": map[string]any{"h": 1},
		"expected_version": 1, "from_user": strconv.FormatInt(rpMember, 10)})
	if code != 200 || r.Message.Version != 2 || string(r.Message.Head) != `{"h":1}` || r.ChangeSeq != 1 {
		t.Fatalf("service edit: %d %+v", code, r)
	}
	if code, r = chEdit(t, env, sender, "chedit", 10, chEditBody("again", 2)); code != 200 || string(r.Message.Head) != `{"h":1}` {
		t.Fatalf("edit keeping the head: %d %+v", code, r)
	}
	if code, r = chEdit(t, env, sender, "chedit", 10, map[string]any{"content": map[string]any{"text": "x"}, "head": nil, "expected_version": 3}); code != 200 || string(r.Message.Head) != "null" {
		t.Fatalf("edit clearing the head: %d %+v", code, r)
	}
	if revs := chRevisions(t, env, "chedit", 10); len(revs) != 3 || revs[2].actor != rpMember || revs[0].actor != rpMember {
		t.Fatalf("revisions: %+v", revs)
	}
	if code, _ := chRecall(t, env, env.Token(rpAdmin, "admin"), "chedit", 11, nil); code != 200 {
		t.Fatal("recall")
	}
	if code, r := chEdit(t, env, sender, "chedit", 11, chEditBody("x", 2)); code != 409 || r.Error.Code != "conflict" {
		t.Fatalf("edit of a recalled message: %d %+v", code, r.Error)
	}
}

// TestChangeEditRefusedWhereSendIs: a muted member, and a member of a
// dissolved group, whose send is refused get the send's answer (403, the
// same code and message) for an edit of an old message of theirs too —
// their own token and a service token acting for them — and nothing
// changes. A mute forbids new text only: a muted owner still recalls; in
// a dissolved group no member does.
func TestChangeEditRefusedWhereSendIs(t *testing.T) {
	t.Parallel()
	e := startSend(t, harness.Options{Roles: []string{"send", "query"}})
	ms := rpThreeMonths(t, e.Env, "chmuted")
	rpGroup(t, e.Env, "chgone")
	rpInsert(t, e.Env, "chgone", ms[0], rpSeqs(1, 20)...)
	rpSyncRoute(t, e.Env, "chgone")
	ctx := t.Context()
	until := time.Now().Add(time.Hour)
	if err := e.App.ACL().PutMember(ctx, e.Tenant, "chmuted", rpMember, "member", &until); err != nil {
		t.Fatal(err)
	}
	if err := e.App.ACL().PutMember(ctx, e.Tenant, "chmuted", rpOther, "owner", &until); err != nil {
		t.Fatal(err)
	}
	if err := e.App.ACL().PutGroup(ctx, e.Tenant, "chgone", 77, "chgone", "dissolved"); err != nil {
		t.Fatal(err)
	}
	sender := e.Token(rpMember, "")
	for _, topic := range []string{"chmuted", "chgone"} {
		code, raw := e.Do("POST", "/v1/topics/"+topic+"/messages", sender, sendBody("c-"+topic, "new text"))
		sent := chDecode(t, raw)
		if code != 403 || sent.Error.Code != "permission_denied" {
			t.Fatalf("%s: send %d %s, want 403 permission_denied", topic, code, raw)
		}
		for name, edit := range map[string]func() (int, chResult){
			"own token": func() (int, chResult) { return chEdit(t, e.Env, sender, topic, 10, chEditBody("new text", 1)) },
			"service for the sender": func() (int, chResult) {
				return chEdit(t, e.Env, e.svc, topic, 10, map[string]any{"content": map[string]any{"text": "new text"},
					"expected_version": 1, "from_user": strconv.FormatInt(rpMember, 10)})
			},
		} {
			code, r := edit()
			if code != 403 || r.Error.Code != sent.Error.Code || r.Error.Message != sent.Error.Message {
				t.Fatalf("%s: edit by %s: %d %+v, want the send's 403 %+v", topic, name, code, r.Error, sent.Error)
			}
		}
		if n := chCount(t, e.Env, "im_message_revisions", sq.Eq{"topic": topic}) + chCount(t, e.Env, "im_topic_changes", sq.Eq{"topic": topic}); n != 0 {
			t.Fatalf("%s: refused edits wrote %d rows", topic, n)
		}
		var m message.Message
		if code := rpGet(t, e.Env, rpMember, "", "/v1/topics/"+topic+"/messages/10", &m); code != 200 || chText(m) != "message 10" || m.Version != 1 {
			t.Fatalf("%s: message 10 after the refused edits: %d %+v", topic, code, m)
		}
	}
	if code, r := chRecall(t, e.Env, e.Token(rpOther, ""), "chmuted", 11, nil); code != 200 || r.Message.Status != "recalled" {
		t.Fatalf("a muted owner's recall: %d %+v", code, r)
	}
	if code, r := chRecall(t, e.Env, e.Token(rpOther, ""), "chgone", 11, nil); code != 403 || r.Error.Message != "group is dissolved" {
		t.Fatalf("an owner's recall in a dissolved group: %d %+v, want 403 group is dissolved", code, r.Error)
	}
	if code, r := chRecall(t, e.Env, e.Token(rpAdmin, "admin"), "chgone", 11, nil); code != 200 || r.Message.Status != "recalled" {
		t.Fatalf("an admin token's recall in a dissolved group: %d %+v", code, r)
	}
}
