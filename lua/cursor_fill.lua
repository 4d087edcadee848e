-- Fill a user's cached memberships and read cursors with what MySQL holds
-- (every topic of a group they are a member of that is not dissolved, with
-- its cursor), unless a change that rewrote them (a join, a leave) bumped
-- the version since the caller read it before querying MySQL (the protocol
-- of cache_fill.lua). Unlike cache_fill.lua it merges field by field,
-- keeping the higher cursor: a cursor move raises its field before its
-- MySQL write commits (cursor_put.lua), so a fill that read MySQL before
-- that commit must not put the lower cursor back. A field of a topic MySQL
-- did not name (left, dissolved, or from an entry of an older form) is
-- dropped: the entry names exactly the memberships. "~" marks the entry
-- complete and carries the groups epoch the caller read before querying
-- MySQL (a dissolve bumps it, and a reader finding an older one reads again).
--
-- The fill moves the entry's generation (field "#", as cursor_put.lua does).
--
-- A field "^TOPIC" holds the topic's preferences (pinned, notification
-- mute) when one is set; it is written as MySQL said (a preferences change
-- drops the entry and bumps the version after its commit).
--
-- KEYS[1] version, KEYS[2] the user's cursors (HASH topic → read_seq)
-- ARGV[1] version the caller read ("" = none), ARGV[2] ttl ms,
-- ARGV[3] the value of "~", ARGV[4], ARGV[5], … topic, read_seq pairs and
-- "^TOPIC", preferences pairs
local v = redis.call('GET', KEYS[1]) or ''
if v ~= ARGV[1] then
  return 0
end
local named = {}
for i = 4, #ARGV, 2 do
  named[ARGV[i]] = true
  if string.sub(ARGV[i], 1, 1) == '^' then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  else
    local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[i]))
    if not cur or tonumber(ARGV[i + 1]) > cur then
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    end
  end
end
for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not named[f] and f ~= '~' and f ~= '#' then
    redis.call('HDEL', KEYS[2], f)
  end
end
redis.call('HSET', KEYS[2], '~', ARGV[3], '#', next_version(redis.call('HGET', KEYS[2], '#')))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
