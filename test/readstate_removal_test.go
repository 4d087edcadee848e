package test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/inbox"
	"github.com/imshard/imshard/modules/routing"
)

// Tests of the read state of topics a user does not (or no longer) belong
// to: a user's cached entry names exactly their memberships, a cursor move
// never adds a topic to it, every leave or dissolve — a retried one too —
// takes the topic out of it, and every join or undoing of a dissolve — a
// retried one too — puts it back.

// rsRemovalSetup makes two groups, own and far, each with a stored
// message; other is a member of both, user of own, and of far too when
// member. The user's badges are read twice, so their cache entry is
// complete and this process holds it.
func rsRemovalSetup(t *testing.T, env *sendEnv, own, far string, user, other int64, member bool) {
	t.Helper()
	for i, tp := range []string{own, far} {
		env.group(tp, int64(780+i), "active")
		env.member(tp, other, "member", time.Time{})
	}
	env.member(own, user, "member", time.Time{})
	if member {
		env.member(far, user, "member", time.Time{})
	}
	for _, tp := range []string{own, far} {
		env.mustSend(env.Token(other, ""), tp, sendBody(tp+"-1", "text of "+tp))
		chWaitSettled(t, env.Env, tp)
	}
	for range 2 {
		rsUnread(t, env, user)
	}
}

// rsShowsNothingOf fails unless user's badges, topic list and a sync from
// the start show nothing of topic: not listed, no badge, and in the sync at
// most an entry marking it removed (no last message, seq or counts).
func rsShowsNothingOf(t *testing.T, env *sendEnv, step string, user int64, topic string) {
	t.Helper()
	if _, by := rsUnread(t, env, user); by[topic] != (inbox.UnreadTopic{}) {
		t.Fatalf("%s: the badges show %+v", step, by[topic])
	}
	for _, e := range rsTopics(t, env, user, 10) {
		if e.Topic == topic {
			t.Fatalf("%s: the topic list shows %+v", step, e)
		}
	}
	for _, e := range rsSync(t, env, user, "", 100).Topics {
		if e.Topic == topic && (!e.Removed || e.LastMessage != nil || e.LastSeq != 0 || e.Unread != 0 || e.MentionUnread != 0) {
			t.Fatalf("%s: the sync shows %+v", step, e)
		}
	}
}

// rsShowsUnread fails unless user's badges show unread messages of topic,
// their topic list lists it, and a sync from the start reports it with its
// last message (not removed).
func rsShowsUnread(t *testing.T, env *sendEnv, step string, user int64, topic string, unread int) {
	t.Helper()
	if _, by := rsUnread(t, env, user); by[topic].Unread != unread {
		t.Fatalf("%s: the badges show %+v, want %d unread", step, by[topic], unread)
	}
	listed := false
	for _, e := range rsTopics(t, env, user, 10) {
		listed = listed || e.Topic == topic
	}
	if !listed {
		t.Fatalf("%s: the topic list does not show %s", step, topic)
	}
	for _, e := range rsSync(t, env, user, "", 100).Topics {
		if e.Topic == topic && (e.Removed || e.LastMessage == nil || e.Unread != unread) {
			t.Fatalf("%s: the sync shows %+v", step, e)
		}
	}
}

// rsCachedEntry is user's cache entry and its version, as Redis holds them.
func rsCachedEntry(t *testing.T, env *sendEnv, user int64) (map[string]string, string) {
	t.Helper()
	ctx := context.Background()
	res := env.Redis.DoMulti(ctx, env.Redis.B().Hgetall().Key(env.Keys().ReadCursors(user)).Build(),
		env.Redis.B().Get().Key(env.Keys().ReadCursorsVersion(user)).Build())
	m, err := res[0].AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	v, err := res[1].ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	return m, v
}

// TestReadStateNonMemberCursorPutNeverShowsTopic: a user moving their
// cursor in a group they are not a member of is refused with 403 and
// changes nothing — their cache entry keeps every field, its generation
// ("#", moved by any write of the script) and its version, MySQL holds no
// cursor of theirs — so their badges, list and sync never show the group.
func TestReadStateNonMemberCursorPutNeverShowsTopic(t *testing.T) {
	env := rsStart(t)
	const own, far, user, other = "rsnm-own", "rsnm-far", int64(81), int64(82)
	rsRemovalSetup(t, env, own, far, user, other, false)
	entry, version := rsCachedEntry(t, env, user)
	if entry["~"] == "" || entry["#"] == "" || entry[own] == "" {
		t.Fatalf("the entry is not complete: %v", entry)
	}
	if code, _ := rsRead(t, env, user, far, 1); code != 403 {
		t.Fatalf("a non-member's cursor move: %d, want 403", code)
	}
	if e, v := rsCachedEntry(t, env, user); !maps.Equal(e, entry) || v != version {
		t.Fatalf("a refused cursor move changed the entry %v (version %q) to %v (version %q)", entry, version, e, v)
	}
	if n := chCount(t, env.Env, acl.CursorsTable, sq.Eq{"user_id": user, "topic": far}); n != 0 {
		t.Fatalf("a refused cursor move stored %d cursor rows", n)
	}
	rsShowsNothingOf(t, env, "after a refused move", user, far)
}

// TestReadStateRetriedLeaveDropsCachedTopic: a leave committed in MySQL
// whose drop of the user's cache entry never happened (emulated: the
// member row deleted and the cursor touched, as the leave's transaction
// does, with nothing told to Redis) is healed by retrying the leave: the
// retry finds no row and still drops the entry, so neither Redis nor the
// copy this process holds shows the topic any more.
func TestReadStateRetriedLeaveDropsCachedTopic(t *testing.T) {
	env := rsStart(t)
	const own, far, user, other = "rsrl-own", "rsrl-far", int64(83), int64(84)
	rsRemovalSetup(t, env, own, far, user, other, true)
	rsHalfDoneLeave(t, env, far, user)
	if _, by := rsUnread(t, env, user); by[far].Unread != 1 {
		t.Fatalf("the half-done leave should leave the cached topic in the badges: %+v", by)
	}
	rsLeave(t, env, far, user)
	rsShowsNothingOf(t, env, "after the retried leave", user, far)
}

// TestReadStateRetriedDissolveDropsCachedTopic: a dissolve committed in
// MySQL whose move of the groups epoch never happened (emulated: the
// status set in MySQL, nothing told to Redis) is healed by retrying the
// dissolve: the group was dissolved already, and the retry still moves the
// epoch, so no member's entry — nor the copy this process holds — shows the
// group any more.
func TestReadStateRetriedDissolveDropsCachedTopic(t *testing.T) {
	env := rsStart(t)
	const own, far, user, other = "rsrd-own", "rsrd-far", int64(85), int64(86)
	rsRemovalSetup(t, env, own, far, user, other, true)
	if _, err := sq.Update(acl.GroupsTable).Set("status", acl.GroupDissolved).Where(sq.Eq{"topic": far}).
		RunWith(env.DB).ExecContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, by := rsUnread(t, env, user); by[far].Unread != 1 {
		t.Fatalf("the half-done dissolve should leave the cached topic in the badges: %+v", by)
	}
	env.group(far, 781, acl.GroupDissolved)
	rsShowsNothingOf(t, env, "after the retried dissolve", user, far)
}

// TestReadStateRetriedJoinShowsGroup: a join committed in MySQL whose drop
// of the user's cache entry never happened (emulated: the member row and
// the cursor at the topic's last stored message inserted, as the join's
// transaction does, with nothing told to Redis) is healed by retrying it —
// a repeat, or a change of role or mute made meanwhile: the retry finds the
// row and still drops the entry, so neither Redis nor the copy this
// process holds keeps the group out of the badges, list and sync.
func TestReadStateRetriedJoinShowsGroup(t *testing.T) {
	env := rsStart(t)
	for i, retry := range []struct {
		name, role string
		muted      time.Time
	}{
		{"a repeat", acl.RoleMember, time.Time{}},
		{"a role change", acl.RoleAdmin, time.Time{}},
		{"a mute", acl.RoleMember, time.Now().Add(time.Hour)},
	} {
		own, far := fmt.Sprintf("rsrj%d-own", i), fmt.Sprintf("rsrj%d-far", i)
		user, other := int64(87+2*i), int64(88+2*i)
		rsRemovalSetup(t, env, own, far, user, other, false)
		rsHalfDoneJoin(t, env, far, user)
		env.mustSend(env.Token(other, ""), far, sendBody(far+"-2", "after the join"))
		chWaitSettled(t, env.Env, far)
		if _, by := rsUnread(t, env, user); by[far] != (inbox.UnreadTopic{}) {
			t.Fatalf("%s: the half-done join should leave the topic out of the cached badges: %+v", retry.name, by)
		}
		env.member(far, user, retry.role, retry.muted)
		rsShowsUnread(t, env, "after the join retried as "+retry.name, user, far, 1)
	}
}

// TestReadStateSyncKeepsStoredCursorOfTopicNotCached: a sync reports each
// topic MySQL names as the user's with the cursor MySQL holds for it, the
// user's cache entry only raising it. Here the entry is complete and does
// not name the topic — a join committed in MySQL whose drop of the entry
// is still to come (emulated), the same entry a sync meets when a leave
// commits between its membership read and its cursor read — and the sync
// still answers the stored cursor, not 0 with every message unread.
func TestReadStateSyncKeepsStoredCursorOfTopicNotCached(t *testing.T) {
	env := rsStart(t)
	const own, far, user, other = "rssc-own", "rssc-far", int64(97), int64(98)
	rsRemovalSetup(t, env, own, far, user, other, false)
	cursor := rsHalfDoneJoin(t, env, far, user)
	last := env.mustSend(env.Token(other, ""), far, sendBody(far+"-2", "after the join")).Seq
	chWaitSettled(t, env.Env, far)
	if entry, _ := rsCachedEntry(t, env, user); entry["~"] == "" || entry[far] != "" {
		t.Fatalf("the entry should be complete without %s: %v", far, entry)
	}
	var got *inbox.InboxTopic
	page := rsSync(t, env, user, "", 100)
	for i, e := range page.Topics {
		if e.Topic == far {
			got = &page.Topics[i]
		}
	}
	if got == nil || got.Removed || got.ReadSeq != cursor || got.LastSeq != last || got.Unread != 1 || got.LastMessage == nil {
		t.Fatalf("the sync reports %s as %+v, want read_seq %d, last_seq %d, 1 unread, its last message", far, got, cursor, last)
	}
}

// TestReadStateRememberedRouteNeverFromMissedMirror: the topic list of a
// user whose cache entry still names a topic MySQL no longer counts them a
// member of (a leave committed whose drop of the entry is still to come,
// or failed: emulated) reads that topic's route mirror by topic, not
// through the memberships that miss it; so the mirror this process
// remembers for every user of the tenant is the topic's own, and another
// member's list shows its last seq and message.
func TestReadStateRememberedRouteNeverFromMissedMirror(t *testing.T) {
	env := rsStart(t)
	const own, far, user, other = "rsrm-own", "rsrm-far", int64(99), int64(100)
	rsRemovalSetup(t, env, own, far, user, other, true)
	last, err := routing.LastStoredSeq(context.Background(), env.DB, far)
	if err != nil {
		t.Fatal(err)
	}
	rsHalfDoneLeave(t, env, far, user)
	rsTopics(t, env, user, 10)
	for _, reader := range []int64{other, user} {
		for _, e := range rsTopics(t, env, reader, 10) {
			if e.Topic == far && (e.LastSeq != last || e.LastMessage == nil || e.LastMessage.Seq != last) {
				t.Fatalf("user %d's list shows %s as %+v, want last_seq %d and its message", reader, far, e, last)
			}
		}
	}
}

// TestReadStateRetriedUndissolveShowsGroup: bringing a dissolved group back
// (active or muted), committed in MySQL with the move of the groups epoch
// never made (emulated: the status set in MySQL, nothing told to Redis),
// is healed by retrying it: the group holds that status already, and the
// retry still moves the epoch, so no member's entry — nor the copy this
// process holds — keeps the group out of the badges, list and sync.
func TestReadStateRetriedUndissolveShowsGroup(t *testing.T) {
	env := rsStart(t)
	for i, status := range []string{acl.GroupActive, acl.GroupMuted} {
		own, far := fmt.Sprintf("rsru%d-own", i), fmt.Sprintf("rsru%d-far", i)
		user, other := int64(93+2*i), int64(94+2*i)
		rsRemovalSetup(t, env, own, far, user, other, true)
		env.group(far, 781, acl.GroupDissolved)
		for range 2 {
			rsUnread(t, env, user)
		}
		rsShowsNothingOf(t, env, "dissolved", user, far)
		if _, err := sq.Update(acl.GroupsTable).Set("status", status).Where(sq.Eq{"topic": far}).
			RunWith(env.DB).ExecContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, by := rsUnread(t, env, user); by[far] != (inbox.UnreadTopic{}) {
			t.Fatalf("%s: the half-done undissolve should leave the topic out of the cached badges: %+v", status, by)
		}
		env.group(far, 781, status)
		rsShowsUnread(t, env, "after the undissolve to "+status+" retried", user, far, 1)
	}
}

// rsLeave removes user from topic through the API.
func rsLeave(t *testing.T, env *sendEnv, topic string, user int64) {
	t.Helper()
	if code, out := env.Do("DELETE", fmt.Sprintf("/v1/topics/%s/members/%d", topic, user), env.svc, nil); code != 200 && code != 204 {
		t.Fatalf("leave: %d %s", code, out)
	}
}

// rsHalfDoneLeave commits user's leave of topic in MySQL as the leave's
// transaction does (the member row deleted, the cursor row touched) and
// tells Redis nothing: a leave whose drop of the user's cache entry is
// still to come, or failed.
func rsHalfDoneLeave(t *testing.T, env *sendEnv, topic string, user int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Delete(acl.MembersTable).Where(sq.Eq{"topic": topic, "user_id": user}).RunWith(tx).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Update(acl.CursorsTable).Set("updated_at", sq.Expr("CURRENT_TIMESTAMP(3)")).
		Where(sq.Eq{"topic": topic, "user_id": user}).RunWith(tx).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// rsHalfDoneJoin commits user's join of topic in MySQL as the join's
// transaction does (the member row, and the cursor at the topic's last
// stored message) and tells Redis nothing: a join whose drop of the
// user's cache entry is still to come, or failed. It returns that cursor.
func rsHalfDoneJoin(t *testing.T, env *sendEnv, topic string, user int64) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	last, err := routing.LastStoredSeq(ctx, tx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Insert(acl.MembersTable).Columns("topic", "user_id", "role").Values(topic, user, acl.RoleMember).
		RunWith(tx).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Insert(acl.CursorsTable).Columns("user_id", "topic", "read_seq").Values(user, topic, last).
		RunWith(tx).ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return last
}
