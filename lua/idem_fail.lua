-- Mark a send's produce as failed, unless a concurrent retry has meanwhile
-- got it acknowledged (or persisted). The event stays: a retry re-produces it.
--
-- KEYS[1] idempotency HASH
if redis.call('HGET', KEYS[1], 'status') == 'pending' then
  redis.call('HSET', KEYS[1], 'status', 'failed')
  return 1
end
return 0
