package acl

// Each user's cached read state in Redis (docs/operations.md "Read
// state"): the user's topics of groups not dissolved with their cursors
// and preferences in one HASH (routing.Keys.ReadCursors, field "~" once it
// names all of them, holding the tenant's groups epoch it was read at), so
// the badges read no MySQL membership. Only this file writes it, each
// write after or with its membership decision: a cursor move raises its
// field in the move's one round trip, before the MySQL write whose commit
// the answer follows, and only a field the entry names (lua/cursor_put.lua,
// MoveCursor); a reader that finds the entry incomplete — or complete at
// an older groups epoch: a group changed since, maybe dissolved or brought
// back — fills it from the memberships MySQL holds, field by field keeping
// the higher cursor and dropping the topics MySQL did not name, unless a
// membership change bumped the version meanwhile (routing.CacheVersion,
// lua/cursor_fill.lua, FillCursors); every membership change and every
// preferences change drops it (DropCursors). So the cache is never below
// an acknowledged cursor, never names a topic left once the leave
// answered, and a flushed Redis costs one MySQL read per user.

import (
	"context"
	"database/sql"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// cursorTTL is how long a user's cached cursors live without a move.
const cursorTTL = 24 * time.Hour

// Fields of an entry besides the topics' cursors (a topic name never is
// one of them nor begins with prefsMark).
const (
	// cursorsComplete is the field of a complete entry.
	cursorsComplete = "~"
	// cursorsGen is the field of an entry's generation (lua/cursor_put.lua,
	// lua/cursor_fill.lua).
	cursorsGen = "#"
	// prefsMark begins the field of a topic's preferences: "p" and 0 or 1
	// for pinned, then ":" and notify_muted_until in unix ms (0: none).
	// Only a topic with one set has the field; every preferences change
	// drops the entry.
	prefsMark = "^"
)

// CursorCacheUnavailable is the answer when Redis failed within a cursor
// move.
func CursorCacheUnavailable(err error) error {
	return httpapi.Wrap(httpapi.CodeUnavailable, "read-cursor cache unavailable; retry the move", err)
}

// CursorMove is what a cursor move found in the user's entry: the topic's
// last issued seq (-1: Redis holds no counter, nothing was checked), and
// whether the topic's field was raised, or is not in the entry at all.
type CursorMove struct {
	Last   int64
	Raised bool
	Absent bool
}

// Lost reports that Redis holds no seq counter of the topic: the caller
// checks the bound against the route.
func (m CursorMove) Lost() bool { return m.Last < 0 }

// MoveCursor raises user's cached cursor of topic within the topic's last
// issued seq (lua/cursor_put.lua) in one pipelined round trip with the
// membership lookup, and decides the membership (Allowed). The script
// raises only a field the entry already names, so a move whose membership
// is refused adds nothing to the entry; a refused move whose entry names
// the topic (a leave whose drop is still to come) drops the entry. The
// caller writes MySQL (MarkRead) only without an error, and drops the
// entry after its commit when no field was raised (Lost, Absent): a fill
// may have read MySQL between the script and the commit.
func (c *Checker) MoveCursor(ctx context.Context, keys routing.Keys, tenant, topic string, user, seq int64) (CursorMove, error) {
	rdb := c.p.Redis
	ks := []string{keys.ReadCursors(user), keys.Seq(topic)}
	args := []string{topic, strconv.FormatInt(seq, 10), strconv.FormatInt(cursorTTL.Milliseconds(), 10)}
	cmds := Cmds(rdb, keys, topic, user)
	res := rdb.DoMulti(ctx, append(cmds, c.p.Scripts.CursorPut.Cmd(rdb, ks, args))...)
	out, serr := c.p.Scripts.CursorPut.Result(ctx, rdb, res[len(cmds)], ks, args).AsIntSlice()
	if serr == nil && len(out) != 2 {
		serr = fmt.Errorf("acl: cursor script answered %v", out)
	}
	if err := Allowed(c.Resolve(ctx, tenant, topic, user, res[:len(cmds)])); err != nil {
		if serr == nil && out[1] >= 0 {
			// the entry names a topic the caller is not a member of (a
			// leave whose drop is still to come), or may not be: it is
			// dropped, and the next read fills it from MySQL
			if derr := c.DropCursors(ctx, keys, user); derr != nil {
				return CursorMove{}, CursorCacheUnavailable(derr)
			}
		}
		return CursorMove{}, err
	}
	if serr != nil {
		return CursorMove{}, CursorCacheUnavailable(serr)
	}
	return CursorMove{Last: out[0], Raised: out[1] == 1, Absent: out[1] < 0}, nil
}

// DropCursors bumps the version of user's cached entry (a fill that read
// MySQL before the change cannot land) and drops it: the next read fills
// it from MySQL.
func (c *Checker) DropCursors(ctx context.Context, keys routing.Keys, user int64) error {
	rdb := c.p.Redis
	for _, r := range rdb.DoMulti(ctx, rdb.B().Incr().Key(keys.ReadCursorsVersion(user)).Build(),
		rdb.B().Del().Key(keys.ReadCursors(user)).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("acl: drop the read cursors of %d: %w", user, err)
		}
	}
	return nil
}

// dropCursorsOf is DropCursors after a membership change of tenant.
func (c *Checker) dropCursorsOf(ctx context.Context, tenant string, user int64) error {
	keys, err := c.p.KeySpace.Tenant(tenant)
	if err != nil {
		return err
	}
	return c.DropCursors(ctx, keys, user)
}

// FillCursors reads user's memberships of groups not dissolved with their
// read states from MySQL and, when Redis answered (fill), puts them in the
// entry: both versions are read before MySQL, so a join, leave or dissolve
// committed after bumps one of them, and this fill does not land or
// count. A refused or failed fill costs the next read this one.
func (c *Checker) FillCursors(ctx context.Context, st Stmts, db *sql.DB, keys routing.Keys, user int64, fill bool) ([]MemberTopic, error) {
	var version, mark string
	if fill {
		rdb := c.p.Redis
		res := rdb.DoMulti(ctx, rdb.B().Get().Key(keys.ReadCursorsVersion(user)).Build(), rdb.B().Get().Key(keys.GroupsEpoch()).Build())
		var verr error
		version, verr = res[0].ToString()
		if rueidis.IsRedisNil(verr) {
			version, verr = "", nil
		}
		var ok bool
		mark, ok = completeMark(res[1])
		fill = verr == nil && ok
	}
	us, err := memberships(ctx, st, db, user)
	if err != nil {
		return nil, err
	}
	if fill {
		args := make([]string, 0, 3+2*len(us))
		args = append(args, version, strconv.FormatInt(cursorTTL.Milliseconds(), 10), mark)
		for _, u := range us {
			args = append(args, u.Topic, strconv.FormatInt(u.ReadSeq, 10))
			if p, ok := prefsField(u.Prefs); ok {
				args = append(args, prefsMark+u.Topic, p)
			}
		}
		_ = c.p.Scripts.CursorFill.Exec(ctx, c.p.Redis,
			[]string{keys.ReadCursorsVersion(user), keys.ReadCursors(user)}, args).Error()
	}
	return us, nil
}

// EntryCmds read user's cached entry whole, and the tenant's groups epoch
// it must carry to be complete; ReadEntry finishes the read.
func EntryCmds(rdb rueidis.Client, keys routing.Keys, user int64) []rueidis.Completed {
	return []rueidis.Completed{rdb.B().Hgetall().Key(keys.ReadCursors(user)).Build(), rdb.B().Get().Key(keys.GroupsEpoch()).Build()}
}

// Entry is a user's cached read state as EntryCmds read it.
type Entry struct {
	fields   map[string]string
	complete bool
}

// ReadEntry is the entry the results of EntryCmds show, and the error when
// Redis could not be read (no fill then). An entry that is not complete
// at the current groups epoch still holds the cursors of moves whose write
// is under way (Raised).
func ReadEntry(res []rueidis.RedisResult) (Entry, error) {
	fields, err := res[0].AsStrMap()
	if err != nil && !rueidis.IsRedisNil(err) {
		return Entry{}, err
	}
	e := Entry{fields: fields}
	mark, ok := completeMark(res[1])
	if !ok {
		return e, res[1].Error()
	}
	e.complete = fields[cursorsComplete] == mark
	return e, nil
}

// Complete reports whether the entry names all the user's topics at the
// current groups epoch.
func (e Entry) Complete() bool { return e.complete }

// Gen and Mark are the entry's generation and "~" fields, which
// HeldCmds read without the rest.
func (e Entry) Gen() string  { return e.fields[cursorsGen] }
func (e Entry) Mark() string { return e.fields[cursorsComplete] }

// Topics are the topics the entry names, in no order.
func (e Entry) Topics() iter.Seq[string] {
	return func(yield func(string) bool) {
		for f := range e.fields {
			if topicField(f) && !yield(f) {
				return
			}
		}
	}
}

// Size is how many fields the entry holds: at least its topics.
func (e Entry) Size() int { return len(e.fields) }

// Names reports whether the entry names topic.
func (e Entry) Names(topic string) bool {
	_, ok := e.fields[topic]
	return ok
}

// Raised is the cursor the entry holds for topic, 0 when none or
// malformed: a move whose write is under way raised it already.
func (e Entry) Raised(topic string) int64 {
	n, _ := strconv.ParseInt(e.fields[topic], 10, 64)
	return n
}

// State is topic's read state in a complete entry (zero for a topic it
// does not name); false if a value is not a cursor or a preferences field.
func (e Entry) State(topic string) (ReadState, bool) {
	var r ReadState
	if v, ok := e.fields[topic]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return ReadState{}, false
		}
		r.ReadSeq = n
	}
	if v, ok := e.fields[prefsMark+topic]; ok {
		p, ok := prefsFrom(v)
		if !ok {
			return ReadState{}, false
		}
		r.Prefs = p
	}
	return r, true
}

// HeldCmds read only the generation and "~" fields of user's entry, and
// the tenant's groups epoch: enough to tell that an entry a process holds
// as it read it is still the one in Redis (ReadHeld).
func HeldCmds(rdb rueidis.Client, keys routing.Keys, user int64) []rueidis.Completed {
	return []rueidis.Completed{
		rdb.B().Hmget().Key(keys.ReadCursors(user)).Field(cursorsComplete, cursorsGen).Build(),
		rdb.B().Get().Key(keys.GroupsEpoch()).Build(),
	}
}

// Held is what HeldCmds read: the entry's "~" and generation fields, and
// whether "~" is the current groups epoch's (the entry is complete).
type Held struct {
	Mark, Gen string
	Complete  bool
}

// ReadHeld finishes HeldCmds; false when Redis failed.
func ReadHeld(res []rueidis.RedisResult) (Held, bool) {
	fields, err := res[0].ToArray()
	mark, ok := completeMark(res[1])
	if err != nil || !ok || len(fields) != 2 {
		return Held{}, false
	}
	complete, _ := fields[0].ToString()
	gen, _ := fields[1].ToString()
	return Held{Mark: complete, Gen: gen, Complete: complete == mark}, true
}

// completeMark is the value of the "~" field of an entry filled at the
// groups epoch read by res ("" when Redis holds none); ok is false when
// the epoch could not be read.
func completeMark(res rueidis.RedisResult) (string, bool) {
	epoch, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		epoch, err = "", nil
	}
	return "e" + epoch, err == nil
}

// topicField reports whether a field of an entry is a topic's cursor (not
// "~", the generation or a topic's preferences).
func topicField(f string) bool {
	return f != cursorsComplete && f != cursorsGen && !strings.HasPrefix(f, prefsMark)
}

// prefsField is the preferences field value of p, ok false when none is
// set.
func prefsField(p Prefs) (string, bool) {
	if !p.Pinned && !p.NotifyMute.Valid {
		return "", false
	}
	var ms int64
	if p.NotifyMute.Valid {
		ms = p.NotifyMute.Time.UnixMilli()
	}
	v := "p0:"
	if p.Pinned {
		v = "p1:"
	}
	return v + strconv.FormatInt(ms, 10), true
}

// prefsFrom reads a prefsField value.
func prefsFrom(v string) (Prefs, bool) {
	pin, ms, ok := strings.Cut(v, ":")
	if !ok || (pin != "p0" && pin != "p1") {
		return Prefs{}, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return Prefs{}, false
	}
	p := Prefs{Pinned: pin == "p1"}
	if n > 0 {
		p.NotifyMute = sql.NullTime{Time: time.UnixMilli(n).UTC(), Valid: true}
	}
	return p, true
}
