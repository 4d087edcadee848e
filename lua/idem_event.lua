-- Store the event of a claimed send before it is produced, so that a retry
-- re-produces exactly it (same seq, month and event_id).
--
-- KEYS[1] idempotency HASH
-- ARGV[1] owner token, ARGV[2] event JSON, ARGV[3] TTL in milliseconds
--
-- Reply: 1 stored; 0 the claim was taken over by another attempt (this one
-- must abandon its seq). A record lost meanwhile (flush, failover) is
-- recreated: the event is what a retry needs.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'pending', 'owner', ARGV[1], 'event', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
