-- Fill a user's cached read cursors with every cursor row MySQL holds for
-- them, unless a change that rewrote them (a join) bumped the version since
-- the caller read it before querying MySQL (the protocol of cache_fill.lua).
-- Unlike cache_fill.lua it merges field by field, keeping the higher
-- cursor: a cursor move raises its field before its MySQL write commits
-- (cursor_put.lua), so a fill that read MySQL before that commit must not
-- put the lower cursor back. "~" marks the entry complete.
--
-- KEYS[1] version, KEYS[2] the user's cursors (HASH topic → read_seq)
-- ARGV[1] version the caller read ("" = none), ARGV[2] ttl ms,
-- ARGV[3], ARGV[4], … topic, read_seq pairs
local v = redis.call('GET', KEYS[1]) or ''
if v ~= ARGV[1] then
  return 0
end
for i = 3, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[i])) or 0
  if tonumber(ARGV[i + 1]) > cur then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[2], '~', '1')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
