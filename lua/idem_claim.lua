-- Claim the idempotency record of one send (topic, from_user, client_msg_id).
--
-- KEYS[1] idempotency HASH: status (pending → acked → done, or failed),
--         event (the Kafka event JSON, set once seq and month are known),
--         resp (the 201 body, set after the broker ack), owner, claimed_at
-- ARGV[1] owner token of this attempt
-- ARGV[2] TTL in milliseconds (send.idempotency_ttl)
-- KEYS[2] the tenant's idempotency horizon (ms, see idem_since.lua)
-- ARGV[3] stale bound in milliseconds (send.produce_timeout)
--
-- Replies:
--   {1, trusted, horizon_set}   claimed: this attempt allocates; trusted = 1
--                               when the horizon has passed (no record here
--                               means no earlier send), horizon_set = 0 when
--                               there is no horizon at all (Redis lost it)
--   {0, status, event, resp}    a record exists (event/resp may be nil)
--
-- A record without event and resp is a claim whose sender has not allocated
-- yet; once older than the stale bound its sender died between claim and
-- allocation (nothing was allocated), so the claim is taken over.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = redis.call('HMGET', KEYS[1], 'status', 'event', 'resp', 'claimed_at')
if rec[2] or rec[3] then
  return {0, rec[1] or '', rec[2], rec[3]}
end
if rec[1] and now - tonumber(rec[4] or '0') < tonumber(ARGV[3]) then
  return {0, rec[1], false, false}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'status', 'pending', 'owner', ARGV[1], 'claimed_at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local since = redis.call('GET', KEYS[2])
if not since then
  return {1, 0, 0}
end
if now >= tonumber(since) then
  return {1, 1, 1}
end
return {1, 0, 1}
