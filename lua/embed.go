// Package lua holds every Redis script imshard runs, embedded so that the
// scripts are reviewed as Lua, not as Go strings. Scripts receive every key
// through KEYS, all sharing the tenant hash tag, so they run unchanged on
// Redis Cluster.
package lua

import (
	_ "embed"
	"strings"
)

// Fenced is a Redis Function library of the operations whose master-only
// state must be fenced by the server incarnation: the seq allocator (alloc,
// seed, extend; invariants 1–3 in docs/invariants.md), the send idempotency claim and
// horizon, and the send path's two calls (send before the produce, sent after the ack). See fenced.lua. Its text carries the placeholder {{version}},
// which routing fills with a hash of the text.
//
//go:embed fenced.lua
var fenced string

// Fenced is the library's text with next_version (version.lua) right after
// its first line, which must stay the library's name.
var Fenced = withVersion(fenced)

func withVersion(library string) string {
	head, body, _ := strings.Cut(library, "\n")
	return head + "\n" + version + body
}

// version is the function next_version, put in front of the scripts that
// move a version.
//
//go:embed version.lua
var version string

// Activate moves the active month forward to a ready month, never back.
//
//go:embed activate.lua
var Activate string

// Unlock deletes a lock key only while it still holds the caller's token.
//
//go:embed unlock.lua
var Unlock string

// Refresh extends a lock key's expiry only while it still holds the token.
//
//go:embed refresh.lua
var Refresh string

// PendingAck marks a pending seq as acknowledged by Kafka.
//
//go:embed pending_ack.lua
var PendingAck string

// PendingAbandon records a pending seq that timed out as a gap and as
// abandoned, only while the reader's stale member is still there.
//
//go:embed pending_abandon.lua
var PendingAbandon string

// PersistClaim decides a batch's seqs before persist stores it: abandoned
// ones are dropped, pending ones marked acknowledged.
//
//go:embed persist_claim.lua
var PersistClaim string

// Persisted settles topics after persist's DB commit: month ranges merged
// into their routes, stored seqs out of their pending sets, idempotency
// records done.
//
//go:embed persisted.lua
var Persisted string

// RouteReplace replaces a topic's Redis route with exactly the given ranges.
//
//go:embed route_replace.lua
var RouteReplace string

// IdemAck records a send's broker ack (or dedup-table hit) and its answer.
//
//go:embed idem_ack.lua
var IdemAck string

// IdemFail marks a pending send's produce as failed.
//
//go:embed idem_fail.lua
var IdemFail string

// IdemRelease drops a claim that allocated nothing.
//
//go:embed idem_release.lua
var IdemRelease string

// IdemRetry prepares the re-produce of a stored, unacknowledged event.
//
//go:embed idem_retry.lua
var IdemRetry string

// FenceLift records a lifted resume fence's unstored seqs as gaps and
// removes the fence from the topic's pending set.
//
//go:embed fence_lift.lua
var FenceLift string

// CacheFill fills a read-through cache (a HASH field, optionally a STRING
// too) unless the cached facts' version changed meanwhile: the ACL cache and
// the deletion-range cache.
//
//go:embed cache_fill.lua
var CacheFill string

//go:embed msg_change.lua
var msgChange string

// MsgChange takes a message out of the hot cache and moves the topic's
// message version forward before a change commits (msg_change.lua after
// next_version, version.lua).
var MsgChange = version + msgChange

// FloorRaise raises a topic's copy of its retention floor, never lowering
// it (see modules/routing/floors.go).
//
//go:embed floor_raise.lua
var FloorRaise string

// HotPut puts a changed message back into the hot cache after the commit,
// unless a later change moved the topic's message version on.
//
//go:embed hot_put.lua
var HotPut string

// BenchSend is the reference send's one call before the produce, for
// `imshard bench send` (modules/bench): claim, allocation, pending mark.
//
//go:embed bench_send.lua
var BenchSend string

//go:embed cursor_put.lua
var cursorPut string

// CursorPut raises a user's cached read cursor of a topic, within the
// topic's last issued seq, in a cursor move's one round trip, and moves the
// entry's generation (cursor_put.lua after next_version, version.lua).
var CursorPut = version + cursorPut

//go:embed cursor_fill.lua
var cursorFill string

// CursorFill fills a user's cached memberships and read cursors from
// MySQL, keeping any higher cursor a move wrote meanwhile and dropping the
// topics MySQL did not name, unless a join or leave bumped the version
// (cursor_fill.lua after next_version, version.lua).
var CursorFill = version + cursorFill

//go:embed version_bump.lua
var versionBump string

// VersionBump moves a version forward as the scripts that change what it
// versions do (version_bump.lua after next_version, version.lua).
var VersionBump = version + versionBump
