-- The reference send of `imshard bench send` (modules/bench): the simplest
-- correct send's one call before the produce, as a yardstick for the
-- product's. It claims the idempotency record and stores in it what a retry
-- needs to answer and re-produce the same event, allocates the seq, reads
-- the active month and marks the seq pending. No durable reservation, no
-- fencing, no membership: what the product does on top is what the bench
-- measures.
--
-- KEYS[1] idempotency HASH, KEYS[2] seq counter, KEYS[3] active month,
-- KEYS[4] pending seqs (ZSET)
-- ARGV[1] message id, ARGV[2] created_at, ARGV[3] request body,
-- ARGV[4] TTL seconds, ARGV[5] now ms, ARGV[6] month when none is set
--
-- Reply: {seq, message id, seq, month} for a new send; {-1, message id,
-- seq, month} for a duplicate.
local old = redis.call('HMGET', KEYS[1], 'seq', 'mid', 'month')
if old[1] then
  return {-1, old[2], old[1], old[3]}
end
local seq = redis.call('INCR', KEYS[2])
local m = redis.call('GET', KEYS[3]) or ARGV[6]
redis.call('HSET', KEYS[1], 'mid', ARGV[1], 'at', ARGV[2], 'body', ARGV[3], 'seq', seq, 'month', m, 'st', 'pending')
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[5], seq)
return {seq, ARGV[1], seq, m}
