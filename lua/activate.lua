-- Move the tenant's active month forward to a ready month.
--
-- KEYS[1] active month, KEYS[2] ready months (see fenced.lua, alloc)
-- ARGV[1] the month YYYYMM (the caller has recorded it in MySQL already)
-- ARGV[2] the month of Redis TIME, read by the caller just before
--
-- Replies: {1, month} moved; {0, current} already at or past it (no-op);
--          {-1, ""} not ready; {-2, now} after the Redis-time month.
local want = tonumber(ARGV[1])
if want > tonumber(ARGV[2]) then
  return {-2, ARGV[2]}
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {-1, ''}
end
local cur = redis.call('GET', KEYS[1])
if cur and tonumber(cur) >= want then
  return {0, cur}
end
redis.call('SET', KEYS[1], ARGV[1])
return {1, ARGV[1]}
