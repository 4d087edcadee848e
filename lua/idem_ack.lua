-- Record that a send's event is in Kafka (or, from the dedup table, in
-- MySQL): the retry answer is resp from now on.
--
-- KEYS[1] idempotency HASH
-- ARGV[1] status to set ('acked' or 'done'), ARGV[2] event JSON ('' = keep),
-- ARGV[3] resp JSON, ARGV[4] TTL in milliseconds
--
-- 'done' (set by persist after its commit) is never downgraded: the ack can
-- reach the sender after the consumer has already stored the message.
if redis.call('HGET', KEYS[1], 'status') ~= 'done' then
  redis.call('HSET', KEYS[1], 'status', ARGV[1])
end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'event', ARGV[2])
end
redis.call('HSET', KEYS[1], 'resp', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
