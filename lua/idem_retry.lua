-- Prepare the re-produce of a stored event whose first attempt is pending or
-- failed (invariant 12, docs/invariants.md: a seq pending past the produce timeout becomes
-- a gap that readers skip; it must not be stored after all).
--
-- KEYS[1] idempotency HASH
-- KEYS[2] topic pending seqs (ZSET score seq, member "seq:allocms"/"seq:a")
-- KEYS[3] topic gaps (ZSET score seq)
-- ARGV[1] seq of the stored event, ARGV[2] owner token, ARGV[3] TTL ms
--
-- Replies:
--   1  re-produce the stored event; its pending entry (if still there and
--      not acknowledged) got a fresh time, so the timeout does not turn it
--      into a gap meanwhile
--   0  the seq is a recorded gap: the record is reset to a claim of this
--      attempt, which allocates a new seq (the old one was never stored)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'status', 'pending', 'owner', ARGV[2], 'claimed_at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 0
end
-- no pending entry and no gap: persist already removed it, nothing to time
-- out; an acknowledged entry (the first attempt's ack, or persist's claim
-- before it stores the event) must never time out again, so it stays. With
-- no entry, a resume fence (score 0, "from:f:to:T0ms", see seed in
-- fenced.lua) may cover the seq: the entry was lost with the counter, and
-- this re-produce, which may be acknowledged after the fence is lifted, is
-- tracked on its own again, so the lift never records it as a gap
local seq = tonumber(ARGV[1])
local cur = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[1])
if cur[1] then
  if cur[1] ~= ARGV[1] .. ':a' then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[1])
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1] .. ':' .. now)
  end
else
  for _, f in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], 0, 0)) do
    local from, to = string.match(f, '^(%d+):f:(%d+):%d+$')
    if from and seq >= tonumber(from) and seq <= tonumber(to) then
      redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1] .. ':' .. now)
      break
    end
  end
end
if redis.call('HGET', KEYS[1], 'status') == 'failed' then
  redis.call('HSET', KEYS[1], 'status', 'pending')
end
return 1
