-- A read-cursor move, in the request's one Redis round trip (pipelined with
-- the membership lookup), before the MySQL write whose commit the answer
-- follows: raise the user's cached cursor of the topic to seq (never lower
-- it) unless seq is above the topic's last issued seq (the request is
-- refused and nothing is written).
-- Only a field the entry already holds is raised. The fills that write the
-- entry (cursor_fill.lua) name exactly the user's memberships read from
-- MySQL, and this script runs before the move's membership is decided: so
-- it never adds a topic to the entry, and a non-member's move writes
-- nothing here. Without the field (no entry, an entry not filled yet, a
-- topic the entry does not name) nothing is written either; the caller,
-- once the membership held and MySQL committed the cursor, drops the entry
-- so that a fill that read MySQL before that commit does not land the lower
-- cursor. A fill that read MySQL before the commit of a move that raised
-- the field keeps the higher value, so the cache never goes below an
-- acknowledged cursor.
-- A raise moves the entry's generation (field "#", next_version in
-- version.lua), so a query process holding
-- the entry as it read it (modules/query, "Remembered badges") sees that it
-- changed by reading that one field.
-- The realtime frame of a raise is published by the caller once MySQL
-- committed the cursor, not here: a device must not clear a badge for a
-- cursor that may still roll back.
-- Without the seq counter (Redis lost it) the bound cannot be checked here
-- and nothing is written; the caller checks the bound against the route and
-- drops the entry once MySQL committed.
--
-- KEYS[1] the user's cursors (HASH), KEYS[2] the topic's seq counter
-- ARGV[1] topic, ARGV[2] seq, ARGV[3] ttl ms
-- Returns {last issued seq (the caller refuses seq above it) or -1 when the
-- counter is missing, 1 when the cached cursor was raised, 0 when the entry
-- names the topic and it was not, -1 when the entry does not name it}.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local named = cur and 0 or -1
local last = redis.call('GET', KEYS[2])
if not last then
  return {-1, named}
end
last = tonumber(last)
local seq = tonumber(ARGV[2])
if seq > last or not cur then
  return {last, named}
end
if seq <= (tonumber(cur) or 0) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {last, 0}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], '#', next_version(redis.call('HGET', KEYS[1], '#')))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {last, 1}
