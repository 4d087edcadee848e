-- A reader's decision that a seq will never arrive: it is still pending as
-- the allocation (or a retry) left it, unacknowledged, past
-- send.produce_timeout (invariant 12, docs/invariants.md). It becomes a
-- recorded gap, which readers walk past, and is marked abandoned: persist
-- drops its event should Kafka still hand it over (persist_claim.lua) and the
-- send's call after a late ack answers that the seq is gone (sent in
-- fenced.lua), so no message is ever stored or acknowledged under a seq
-- readers skipped.
--
-- One owner decides: the pending entry. An ack (sent, persist's claim) or a
-- retry's fresh time replaces the entry, so the reader's decision holds
-- only while the very member it judged is still there — the removal below
-- is the check.
--
-- KEYS[1] topic pending seqs (ZSET score seq, member "seq:allocation_ms")
-- KEYS[2] topic gaps (ZSET score seq), KEYS[3] topic abandoned seqs (ZSET
--         score seq)
-- ARGV[1] the pending member the reader found stale, ARGV[2] its seq
--
-- Replies: 1 recorded as a gap; 0 the member is no longer there (acked,
-- refreshed or stored meanwhile): nothing changed.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[2])
return 1
