-- Drop a claim that allocated nothing (the allocation itself failed), so a
-- retry starts afresh instead of waiting for the claim to go stale.
--
-- KEYS[1] idempotency HASH, ARGV[1] owner token
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HEXISTS', KEYS[1], 'event') == 0 then
  return redis.call('DEL', KEYS[1])
end
return 0
