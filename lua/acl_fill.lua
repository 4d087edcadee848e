-- Fill a topic's ACL cache with what MySQL said, unless the ACL changed
-- since the caller read the version: a lookup that raced a change must not
-- put the old grant back for a whole TTL.
--
-- KEYS[1] group cache (STRING), KEYS[2] members cache (HASH), KEYS[3] version
-- ARGV[1] version the caller read before querying MySQL ("" = none)
-- ARGV[2] group value, ARGV[3] member field, ARGV[4] member value, ARGV[5] ttl ms
local v = redis.call('GET', KEYS[3]) or ''
if v ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[5])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
