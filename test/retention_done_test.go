package test

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// The whole lifecycle at once: three months of three groups — the oldest
// past retention, the middle one archived, the newest kept — then a
// retention run, a purge of a dissolved group, an erase of one user and a
// legal hold on one group; every read API — pages both ways, exact reads,
// reads by id, contexts, search, revisions, badges, the topic list, a
// sync and a stream's catch-up — then shows nothing expired, purged or
// erased, and everything held.
func TestRetentionLeavesNothingExpiredPurgedOrErased(t *testing.T) {
	ctx := context.Background()
	e := startSend(t, harness.Options{Roles: []string{"all"}, Mutate: func(c *config.Config) {
		c.Tenants[0].RetentionMonths = 2
		c.Archive.URL = "file://" + t.TempDir()
		c.Shard.SealingDays = 0
		c.Send.ProduceTimeout = time.Second // the proof's wait for persist after the months' deactivation
	}})
	now := e.Now()
	m3, m2, m1 := now.Add(-3), now.Add(-2), now.Add(-1)
	const erased, other, reader = 5, 6, 8
	by := func(seq int64) int64 { // odd seqs are the erased user's
		if seq%2 == 1 {
			return erased
		}
		return other
	}
	topics := []string{"dk", "dpp", "dhhh"} // kept, purged, held (lengths differ: retFixtureBy's ids)
	for i, topic := range topics {
		e.group(topic, int64(40+i), "active")
		for _, u := range []int64{erased, other, reader} {
			e.member(topic, u, "member", time.Time{})
		}
		retFixtureBy(t, e, m3, topic, 1, 4, by)
		retFixtureBy(t, e, m2, topic, 5, 8, by)
		retFixtureBy(t, e, m1, topic, 9, 12, by)
	}
	for _, m := range []routing.Month{m3, m2, m1, now} {
		e.Activate(m) // each month stopped being active: the archive's proof
	}
	mg := e.App.NewShardManager()
	for _, m := range []routing.Month{m3, m2, m1} {
		if err := mg.Seal(ctx, e.Tenant, m); err != nil {
			t.Fatal(err)
		}
	}
	// the archive's proof needs persist's progress past the months'
	// deactivation plus the produce timeout: the all role's own persist
	// publishes it, and it only moves forward, so the proof holds once that
	// persist has caught up. A mark set by hand instead would race with it:
	// its next publish writes its real, earlier progress over the mark
	// before the proof reads it.
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := routing.AwaitComplete(wait, e.DB, e.Redis, e.Keys(), m2, e.App.Config.Send.ProduceTimeout, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if rep, err := e.App.NewArchiver().Archive(ctx, e.Tenant, m2, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive %s: %+v %v", m2, rep, err)
	}
	admin := e.Token(1, httpapi.RoleAdmin)
	if code, body := e.Do("PUT", "/v1/admin/holds/case-9", admin, map[string]any{"tenant": e.Tenant, "topics": []string{"dhhh"}, "reason": "investigation"}); code != 200 {
		t.Fatalf("hold: %d %s", code, body)
	}

	// retention: the held group keeps the oldest month, whose other
	// groups are trimmed
	rep, err := e.App.Retention().Run(ctx, e.Tenant)
	if err != nil || rep.Months != 0 || len(rep.Plan.Trims) != 2 || len(rep.Plan.Held) != 1 || rep.Plan.Held[0].Topic != "dhhh" {
		t.Fatalf("retention run: %+v %v", rep, err)
	}
	// purge of the dissolved group, erase of the user
	if code, body := e.Do("PUT", "/v1/topics/dpp", e.svc, map[string]any{"group_id": 41, "status": "dissolved"}); code != 200 {
		t.Fatalf("dissolve: %d %s", code, body)
	}
	retWaitJob(t, e, retStartJob(t, e, "DELETE", "/v1/topics/dpp?purge=true"))
	job := retWaitJob(t, e, retStartJob(t, e, "POST", "/v1/admin/users/"+strconv.Itoa(erased)+"/erase"))
	// the archived month: dk's 5 and 7, and the purged group's, whose rows
	// the purge left in the archive (its floor hides them)
	if job.Report.Months[m2.String()] != 4 || job.Report.Months[m1.String()] != 2 || !slices.Contains(job.Report.HeldTopics, "dhhh") {
		t.Fatalf("erase report: %+v", job.Report)
	}

	tok := e.Token(reader, "")
	monthOf := func(seq int64) routing.Month {
		switch {
		case seq <= 4:
			return m3
		case seq <= 8:
			return m2
		}
		return m1
	}
	page := func(topic string, q url.Values) rpPage {
		t.Helper()
		var p rpPage
		if code := rpGet(t, e.Env, reader, "", "/v1/topics/"+topic+"/messages?"+q.Encode(), &p); code != 200 {
			t.Fatalf("page of %s %v: %d", topic, q, code)
		}
		return p
	}
	// listed: the seqs pages list (tombstones are not listed); stored:
	// those an exact read or a read by id answers (an erased message as a
	// tombstone)
	check := func(topic string, listed, stored []int64) {
		t.Helper()
		before := rpWalkBefore(t, e.Env, reader, topic, 3)
		slices.Reverse(before)
		if !slices.Equal(before, listed) {
			t.Fatalf("%s: before walk %v, want %v", topic, before, listed)
		}
		if got := page(topic, url.Values{"since": {"0"}, "limit": {"50"}}).seqs(); !slices.Equal(got, listed) {
			t.Fatalf("%s: since walk %v, want %v", topic, got, listed)
		}
		for _, m := range page(topic, url.Values{"limit": {"50"}}).Messages {
			if m.Status != message.StatusNormal || chText(m) != "old" {
				t.Fatalf("%s: listed %+v", topic, m)
			}
		}
		for seq := int64(1); seq <= 12; seq++ {
			code, body := e.Do("GET", "/v1/topics/"+topic+"/messages/"+strconv.FormatInt(seq, 10), tok, nil)
			kept := slices.Contains(stored, seq)
			if kept != (code == 200) {
				t.Fatalf("%s/%d: %d %s", topic, seq, code, body)
			}
			var m message.Message
			_ = json.Unmarshal(body, &m)
			if kept && !slices.Contains(listed, seq) && (m.Status != message.StatusDeleted || chText(m) != "") {
				t.Fatalf("%s/%d: an erased message answered %s", topic, seq, body)
			}
			id := int64(monthOf(seq).Int())*1_000_000 + seq*1000 + int64(len(topic)) // retFixtureBy's ids
			if code, body := e.Do("GET", "/v1/messages/"+strconv.FormatInt(id, 10), tok, nil); kept != (code == 200) {
				t.Fatalf("%s/%d by id: %d %s", topic, seq, code, body)
			}
		}
		// a context around the oldest listed seq reaches no lower than the floor
		if len(listed) > 0 {
			var c struct {
				Messages []message.Message `json:"messages"`
			}
			path := "/v1/topics/" + topic + "/messages/" + strconv.FormatInt(listed[0], 10) + "/context?before=5&after=2"
			if code := rpGet(t, e.Env, reader, "", path, &c); code != 200 || len(c.Messages) == 0 {
				t.Fatalf("%s: context: %d %+v", topic, code, c)
			}
			for _, m := range c.Messages {
				if !slices.Contains(stored, m.Seq) || !slices.Contains(listed, m.Seq) && m.Status != message.StatusDeleted {
					t.Fatalf("%s: context holds %+v", topic, m)
				}
			}
		}
		// search in the archived month: only messages still normal are hits
		var s rpPage
		window := url.Values{"q": {"old"}, "from": {m2.Start().Format(time.RFC3339)}, "to": {m2.Start().Add(48 * time.Hour).Format(time.RFC3339)}, "limit": {"50"}}
		if code := rpGet(t, e.Env, reader, "", "/v1/topics/"+topic+"/search?"+window.Encode(), &s); code != 200 {
			t.Fatalf("%s: search: %d", topic, code)
		}
		var want []int64
		for seq := int64(8); seq >= 5; seq-- {
			if slices.Contains(listed, seq) {
				want = append(want, seq)
			}
		}
		if got := s.seqs(); !slices.Equal(got, want) {
			t.Fatalf("%s: search hits %v, want %v", topic, got, want)
		}
	}
	all := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	check("dk", []int64{6, 8, 10, 12}, all[4:])
	check("dhhh", all, all)
	check("dpp", nil, nil)
	for _, seq := range []int64{5, 7, 9, 11} {
		for _, r := range chRevisions(t, e.Env, "dk", seq) {
			if r.content != "" {
				t.Fatalf("dk/%d: a revision keeps the erased content: %+v", seq, r)
			}
		}
	}
	// badges count what pages list; the list and a sync show no last
	// message of the purged group
	_, badges := rsUnread(t, e, reader)
	if badges["dpp"].Unread != 0 || badges["dk"].Unread != 4 || badges["dhhh"].Unread != 12 {
		t.Fatalf("badges: dpp %+v, dk %+v, dhhh %+v; want 0, 4, 12", badges["dpp"], badges["dk"], badges["dhhh"])
	}
	last := map[string]*message.Message{}
	for _, tp := range rsTopics(t, e, reader, 50) {
		last[tp.Topic] = tp.LastMessage
	}
	for _, tp := range rsSync(t, e, reader, "", 50).Topics {
		if tp.Topic == "dpp" && tp.LastMessage != nil {
			t.Fatalf("the purged group in a sync: %+v", tp)
		}
	}
	if last["dpp"] != nil || last["dk"] == nil || last["dk"].Seq != 12 || last["dhhh"] == nil || last["dhhh"].Seq != 12 {
		t.Fatalf("the topic list's last messages: %+v", last)
	}
	// a stream caught up from the start: nothing below the floor, the
	// erased messages as tombstones, their changes without content
	c := stMustDial(t, e.Env, "/v1/topics/dk/stream?since=0&changes_since=0", tok)
	var frames []string
	for {
		f, err := c.next()
		if err != nil {
			t.Fatalf("catch-up after %v: %v", frames, err)
		}
		if f.Type == "live" {
			break
		}
		frames = append(frames, f.Type)
		switch f.Type {
		case "message":
			m := f.Message
			if m.Seq < 5 || int64(m.FromUser) == erased && (m.Status == message.StatusNormal || chText(m) != "") {
				t.Fatalf("catch-up message %+v", m)
			}
		case "change":
			// the erase's: one change of the user's seqs of a batch
			if f.Change.Action != message.ActionErase || len(f.Change.Seqs) == 0 || f.Change.Seq != f.Change.Seqs[0] {
				t.Fatalf("catch-up change %+v", f.Change)
			}
			for _, seq := range f.Change.Seqs {
				if seq < 5 || by(seq) != erased {
					t.Fatalf("catch-up change %+v", f.Change)
				}
			}
		}
	}
	if !slices.Contains(frames, "message") || !slices.Contains(frames, "change") {
		t.Fatalf("catch-up frames %v", frames)
	}
}
