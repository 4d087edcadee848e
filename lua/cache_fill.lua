-- Fill a read-through cache with what MySQL said, unless the cached facts
-- changed since the caller read their version: a lookup that raced a change
-- must not put the old answer back (ACL grants, deletion ranges).
--
-- KEYS[1] version (bumped by every change), KEYS[2] HASH, KEYS[3] STRING
-- (optional: only when ARGV[5] is given)
-- ARGV[1] version the caller read before querying MySQL ("" = none)
-- ARGV[2] ttl ms, ARGV[3] HASH field, ARGV[4] HASH value, ARGV[5] STRING value
local v = redis.call('GET', KEYS[1]) or ''
if v ~= ARGV[1] then
  return 0
end
if KEYS[3] then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[2])
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
