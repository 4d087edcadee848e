package routing

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/imshard/imshard/config"
)

// KeySpace is the Redis key space of one installation: every key and
// pub/sub channel it names starts with the installation's redis.key_prefix,
// so two installations sharing a Redis — even with a tenant of the same id —
// never touch each other's keys. The prefix holds neither a brace nor a glob
// metacharacter (config.KeyPrefixPattern): the first "{" of a key is still
// its tenant's hash tag, so a tenant's keys keep sharing one Cluster slot;
// and since the installation's "im:{" starts where its prefix ends, no key
// or SCAN pattern of one prefix is a key or a match of another.
//
// Only NewKeySpace makes a usable one: the zero value refuses to name a
// key (ErrNoKeySpace), so a component the configured key space did not reach
// fails loudly instead of writing under no prefix.
type KeySpace struct {
	prefix string
	made   bool
}

// ErrNoKeySpace is the error of a KeySpace not made by NewKeySpace.
var ErrNoKeySpace = errors.New("routing: no Redis key space (a KeySpace not made by NewKeySpace)")

// NewKeySpace is the key space under prefix (redis.key_prefix; "" is the
// key space of an installation without one).
func NewKeySpace(prefix string) (KeySpace, error) {
	if !config.KeyPrefixPattern.MatchString(prefix) {
		return KeySpace{}, fmt.Errorf("invalid redis.key_prefix %q: must match %s", prefix, config.KeyPrefixPattern)
	}
	return KeySpace{prefix: prefix, made: true}, nil
}

// Keys builds every Redis key of one tenant. All of them carry the hash tag
// {tenant}, so a tenant's keys share one Redis Cluster slot and one Lua call
// or pipeline can touch any of them. Request values that may hold arbitrary
// bytes (client_msg_id) are hex-encoded: no request value shapes a key
// pattern.
type Keys struct {
	prefix string // "<key_prefix>im:{tenant}:groupmsg:"
}

// Tenant returns the key builder of a tenant; the id must be valid.
func (s KeySpace) Tenant(tenant string) (Keys, error) {
	if !s.made {
		return Keys{}, ErrNoKeySpace
	}
	if err := ValidTenant(tenant); err != nil {
		return Keys{}, err
	}
	return Keys{prefix: s.prefix + "im:{" + tenant + "}:groupmsg:"}, nil
}

// tenantBase is "<key_prefix>im:{tenant}:", where every key of the tenant
// starts.
func (k Keys) tenantBase() string { return k.prefix[:len(k.prefix)-len("groupmsg:")] }

// TenantPattern is the SCAN pattern matching every key of the tenant; the
// prefix and the tenant id are validated, so they carry no glob
// metacharacters.
func (k Keys) TenantPattern() string { return k.tenantBase() + "*" }

// BenchReference is where `imshard bench send`'s reference send keeps the
// keys of one run: inside the tenant's key space (its hash tag, and dropped
// with it), apart from every key the service uses.
func (k Keys) BenchReference(run string) string { return k.tenantBase() + "benchref:" + run + ":" }

// DropTenantKeys deletes every Redis key of the tenant on every node: a
// benchmark's clean-up, and a tenant restore's (the keys describe the state
// before the restore; the service rebuilds them from MySQL).
func (s KeySpace) DropTenantKeys(ctx context.Context, rdb rueidis.Client, tenant string) error {
	keys, err := s.Tenant(tenant)
	if err != nil {
		return err
	}
	for _, node := range rdb.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(keys.TenantPattern()).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return err
			}
			if len(e.Elements) > 0 {
				if err := rdb.Do(ctx, rdb.B().Unlink().Key(e.Elements...).Build()).Error(); err != nil {
					return err
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// ActiveMonth is the tenant's active month (STRING YYYYMM).
func (k Keys) ActiveMonth() string { return k.prefix + "active_month" }

// OverlayMonths is the SET of the months (YYYYMM) with rows in the
// tenant's archive overlay, and overlayComplete once it lists them all
// (routing.MayHaveOverlay).
func (k Keys) OverlayMonths() string { return k.prefix + "overlay_months" }

// ReadyMonths is the ZSET of months the shard manager made writable.
func (k Keys) ReadyMonths() string { return k.prefix + "ready_months" }

// Seq is a topic's last issued seq (master-only, fenced: see lua/fenced.lua).
func (k Keys) Seq(topic string) string { return k.prefix + "seq:" + topic }

// SeqReservation is a topic's durable reservation high-water mirrored in
// Redis together with the run_id of the Redis server that seeded the
// topic's counter ("run_id:high-water"): a counter under another stamp is
// stale (master-only, see lua/fenced.lua).
func (k Keys) SeqReservation(topic string) string { return k.prefix + "seqres:" + topic }

// legacySeqHW and legacySeqStamp are the high-water and the stamp of the
// layout before SeqReservation, which the library's seed moves from.
func (k Keys) legacySeqHW(topic string) string    { return k.prefix + "seqhw:" + topic }
func (k Keys) legacySeqStamp(topic string) string { return k.prefix + "seqstamp:" + topic }

// seqState are the keys of the library's seed and extend: the counter, its
// reservation and the strings of the layout before.
func (k Keys) seqState(topic string) []string {
	return []string{k.Seq(topic), k.SeqReservation(topic), k.legacySeqHW(topic), k.legacySeqStamp(topic)}
}

// Route is the topic's month routes (ZSET member YYYYMM, score first seq).
func (k Keys) Route(topic string) string { return k.prefix + "route:" + topic }

// RouteMeta is the topic's month ranges (HASH YYYYMM → min,max,count).
func (k Keys) RouteMeta(topic string) string { return k.prefix + "route_meta:" + topic }

// Idempotency is the send-dedup key of (topic, from_user, client_msg_id).
func (k Keys) Idempotency(topic string, fromUser int64, clientMsgID string) string {
	return k.prefix + "idem:" + topic + ":" + strconv.FormatInt(fromUser, 10) + ":" + hex.EncodeToString([]byte(clientMsgID))
}

// alloc are the keys of the library's alloc function (lua/fenced.lua).
func (k Keys) alloc(topic string) []string {
	return []string{k.ActiveMonth(), k.ReadyMonths(), k.Seq(topic), k.SeqReservation(topic), k.Pending(topic),
		k.MigrationGate()}
}

// Send are the keys of the library's send function (lua/fenced.lua): the
// idempotency record of (topic, from_user, client_msg_id), the horizon, the
// topic's ACL cache, the allocation's keys with the migration gate last,
// the topic's message version, persist's progress and the tenant's memory
// start — one hash tag, one call.
func (k Keys) Send(topic string, fromUser int64, clientMsgID string) []string {
	return append(append([]string{k.Idempotency(topic, fromUser, clientMsgID), k.IdemSince(), k.Group(topic), k.Members(topic)},
		k.alloc(topic)...), k.MessagesVersion(topic), k.PersistedBefore(), k.IdemMemory(), k.HiddenVersion(topic),
		k.SendRateTenant(), k.SendRateUser(fromUser), k.SendRateTopic(topic))
}

// SendRateTenant, SendRateUser and SendRateTopic are the send's rate-limit
// buckets of the tenant, of one sender and of one topic (STRING, the
// bucket's GCRA theoretical arrival time in Redis-time µs; it expires once
// the bucket is full again): decided and charged inside the send call.
func (k Keys) SendRateTenant() string { return k.prefix + "rl:send" }
func (k Keys) SendRateUser(user int64) string {
	return k.prefix + "rl:send:user:" + strconv.FormatInt(user, 10)
}
func (k Keys) SendRateTopic(topic string) string { return k.prefix + "rl:send:topic:" + topic }

// MigrationGate is the tenant's migration write gate (STRING
// "run_id:n:SC:state", master-only, fenced: see lua/fenced.lua): what the
// migration's state in MySQL allows, as the migrate commands set it; every
// allocation reads it in its one call.
func (k Keys) MigrationGate() string { return k.prefix + "migration_gate" }

// HotMessages is the topic's 24 h hot cache (ZSET score seq, member JSON).
func (k Keys) HotMessages(topic string) string { return k.prefix + "hot:" + topic }

// MessagesVersion is the topic's message-change version: the change path
// (modules/changes) sets it to a new, larger value — at least the Redis time
// in microseconds — before it commits a recall, edit or delete, and every
// page reads it in its round trip, so a process's copy of the topic's
// newest messages made under an older version is never used again.
func (k Keys) MessagesVersion(topic string) string { return k.prefix + "msgver:" + topic }

// MessagesVersionTTL is how long a topic's message version outlives its
// last move (lua/msg_change.lua); a lost version only costs the query
// processes their copies and remembered counts.
const MessagesVersionTTL = 24 * time.Hour

// HotRange is the topic's hot-cache coverage record.
func (k Keys) HotRange(topic string) string { return k.prefix + "hotrange:" + topic }

// Floor is the copy of a topic's retention floor that readers check
// (STRING seq, with a TTL; the record is im_topic_floors, see floors.go).
func (k Keys) Floor(topic string) string { return k.prefix + "floor:" + topic }

// Group and Members cache the ACL facts of a topic.
func (k Keys) Group(topic string) string   { return k.prefix + "acl:group:" + topic }
func (k Keys) Members(topic string) string { return k.prefix + "acl:members:" + topic }

// ACLVersion counts ACL changes of a topic: a cache fill computed before a
// change must not land after it (see modules/acl).
func (k Keys) ACLVersion(topic string) string { return k.prefix + "acl:version:" + topic }

// Hidden caches the callers' deletion ranges of a topic (HASH user id →
// ranges, see modules/readpath); HiddenVersion counts their changes, so a fill
// computed before a change cannot land after it.
func (k Keys) Hidden(topic string) string        { return k.prefix + "hidden:ranges:" + topic }
func (k Keys) HiddenVersion(topic string) string { return k.prefix + "hidden:version:" + topic }

// ReadCursors caches a user's memberships with their read cursors (HASH
// topic → read_seq, one field per topic of a group the user is a member of
// that is not dissolved, the field "~" once it names all of them, and the
// field "#", its generation, moved by every script that writes it; only
// modules/acl reads or writes it); ReadCursorsVersion counts the changes that rewrite them
// from MySQL (every membership change of the user), so a fill computed
// before one cannot land after it.
func (k Keys) ReadCursors(user int64) string { return k.prefix + "rc:" + strconv.FormatInt(user, 10) }
func (k Keys) ReadCursorsVersion(user int64) string {
	return k.prefix + "rcver:" + strconv.FormatInt(user, 10)
}

// GroupsEpoch counts the changes of the tenant's existing groups (any may
// be a dissolve or its undoing, or the retry of one): every user's cached
// memberships (ReadCursors) name the epoch they were read at, and one read
// at an older epoch is read again.
func (k Keys) GroupsEpoch() string { return k.prefix + "groups:epoch" }

// Realtime is the pub/sub channel of a topic's new and changed messages.
func (k Keys) Realtime(topic string) string { return k.prefix + "rt:" + topic }

// ReadFrames is the pub/sub channel of a user's read-cursor moves, which
// the realtime stream passes to that user's sockets.
func (k Keys) ReadFrames(user int64) string {
	return k.prefix + "rtread:" + strconv.FormatInt(user, 10)
}

// Gaps is the topic's set of recorded gap seqs (allocated, never persisted).
func (k Keys) Gaps(topic string) string { return k.prefix + "gaps:" + topic }

// Abandoned is the topic's set of seqs that timed out into a gap before
// anyone acknowledged them (ZSET score seq): their events must never be
// stored, and a late ack of one is not a sent message.
func (k Keys) Abandoned(topic string) string { return k.prefix + "abandoned:" + topic }

// Pending is the topic's in-flight seqs (ZSET seq → allocation time ms).
func (k Keys) Pending(topic string) string { return k.prefix + "pending:" + topic }

// PersistedBefore is the Redis-time ms before which every record produced
// to kafka.topic is stored, compensated or dead-lettered (STRING, written
// by persist, see modules/persist/progress.go): what lifts a topic's
// resume fence (fence.go). Losing it only keeps fences standing until
// persist writes it again.
func (k Keys) PersistedBefore() string { return k.prefix + "persisted_before" }

// ShardLock is the lock one shard manager holds while acting on the tenant.
func (k Keys) ShardLock() string { return k.prefix + "lock:shardmgr" }

// MigrateLock is the lock the migrate module holds while it backfills or
// verifies the tenant's migration from the legacy table.
func (k Keys) MigrateLock() string { return k.prefix + "lock:migrate" }

// RouteRepair is the tenant's queue of topics whose Redis route needs repair.
func (k Keys) RouteRepair() string { return k.prefix + "route_repair" }

// RoutesComplete is the tenant's "routes complete through month M" watermark.
func (k Keys) RoutesComplete() string { return k.prefix + "routes_complete" }

// global is where the keys that are no tenant's data start: under their own
// hash tag, which no tenant id can equal ('-' is not allowed in tenant ids).
func (s KeySpace) global() (string, error) {
	if !s.made {
		return "", ErrNoKeySpace
	}
	return s.prefix + "im:{-global}:", nil
}

// SnowflakeNode is the lease key of a Snowflake node id. Each installation
// leases its node ids apart: its message ids are unique among its own.
func (s KeySpace) SnowflakeNode(node int) (string, error) {
	g, err := s.global()
	if err != nil {
		return "", err
	}
	return g + "snowflake:node:" + strconv.Itoa(node), nil
}

// BenchChannel is the pub/sub channel of `imshard bench stream`'s raw
// baseline.
func (s KeySpace) BenchChannel() (string, error) {
	g, err := s.global()
	if err != nil {
		return "", err
	}
	return g + "bench:stream:raw", nil
}

// RoutePattern is the SCAN pattern of every topic route ZSET of the tenant
// (`imshard route check`); topics carry no glob metacharacters.
func (k Keys) RoutePattern() string { return k.Route("*") }

// IdemSince is the Redis-time ms from which this Redis alone answers the
// tenant's send retries: before it, Redis may have lost idempotency records
// of messages MySQL holds (master-only, fenced: see lua/fenced.lua).
func (k Keys) IdemSince() string { return k.prefix + "idem_since" }

// IdemMemory is the Redis-time ms from which this Redis remembers every
// send of the tenant ("run_id:ms", master-only, fenced: see lua/fenced.lua,
// memory_start): the records of sends made before it may be lost, and
// MySQL answers for them only once persist passed it by the produce
// timeout.
func (k Keys) IdemMemory() string { return k.prefix + "idem_memory" }
