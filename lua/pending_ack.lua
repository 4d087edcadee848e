-- Mark a pending seq as acknowledged by Kafka: it will be persisted, so it
-- no longer times out into a gap. A seq already removed (persisted before
-- the ack reached us, or recorded as a gap) is left alone.
--
-- KEYS[1] topic pending seqs (ZSET score seq, member "seq:allocms" or "seq:a")
-- ARGV[1] seq
if redis.call('ZCOUNT', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[1] .. ':a')
return 1
