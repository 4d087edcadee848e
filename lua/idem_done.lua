-- Mark send idempotency records done after their events were persisted.
--
-- KEYS    idempotency HASHes (fields status, event, resp; TTL
--         send.idempotency_ttl), one or many: persist marks a whole batch's
--         records in one call
-- Only an existing record is touched: a record that expired must not come
-- back as a bare {status=done} without its event and response (send would
-- then answer a retry with nothing), and its TTL is kept as it is.
-- Returns how many records were marked.
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'status', 'done')
    n = n + 1
  end
end
return n
