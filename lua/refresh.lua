-- Extend a lock only while it holds our token.
-- KEYS[1] lock, ARGV[1] token, ARGV[2] ttl in milliseconds.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
