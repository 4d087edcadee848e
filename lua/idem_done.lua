-- Mark a send idempotency record done after its event was persisted.
--
-- KEYS[1] idempotency HASH (fields status, event, resp; TTL send.idempotency_ttl)
-- Only an existing record is touched: a record that expired must not come
-- back as a bare {status=done} without its event and response (send would
-- then answer a retry with nothing), and its TTL is kept as it is.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'status', 'done')
  return 1
end
return 0
