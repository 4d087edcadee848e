-- A read-cursor move, in the request's one Redis round trip, before the
-- MySQL write whose commit the answer follows: raise the user's cached
-- cursor of the topic to seq (never lower it) unless seq is above the
-- topic's last issued seq (the request is refused and nothing is written).
-- The field is written even while the entry is incomplete (no "~"): a fill
-- that read MySQL before the move's commit keeps the higher value
-- (cursor_fill.lua), so the cache never goes below an acknowledged cursor.
-- A raise moves the entry's generation (field "#", next_version in
-- version.lua), so a query process holding
-- the entry as it read it (modules/query, "Remembered badges") sees that it
-- changed by reading that one field.
-- The realtime frame of a raise is published by the caller once MySQL
-- committed the cursor, not here: a device must not clear a badge for a
-- cursor that may still roll back.
-- Without the seq counter (Redis lost it) the bound cannot be checked here:
-- the entry is dropped and its version bumped; the caller checks the bound
-- against the route and drops the entry again once MySQL committed.
--
-- KEYS[1] the user's cursors (HASH), KEYS[2] their version, KEYS[3] the
-- topic's seq counter
-- ARGV[1] topic, ARGV[2] seq, ARGV[3] ttl ms
-- Returns {last issued seq (the caller refuses seq above it) or -1 when the
-- counter is missing, 1 when the cached cursor was raised else 0}.
local last = redis.call('GET', KEYS[3])
if not last then
  redis.call('INCR', KEYS[2])
  redis.call('DEL', KEYS[1])
  return {-1, 0}
end
last = tonumber(last)
local seq = tonumber(ARGV[2])
if seq > last then
  return {last, 0}
end
local raised = 0
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
if seq > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], '#', next_version(redis.call('HGET', KEYS[1], '#')))
  raised = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {last, raised}
