-- Lift a topic's resume fence (see seed in fenced.lua) once nothing
-- allocated before its re-seed can still arrive: each seq of it that holds
-- no stored row becomes a recorded gap — unless the seq has a pending entry
-- of its own again (a send retry re-producing it, idem_retry.lua), which
-- times out or is stored like any other — and the fence leaves the pending
-- set, in one step, so no retry slips between the two. Each such gap is
-- also marked abandoned, as a timed-out seq is (pending_abandon.lua): should
-- an event of it still come out of Kafka, persist drops it rather than store
-- a row under a seq readers walked past.
--
-- KEYS[1] topic pending seqs, KEYS[2] topic gaps, KEYS[3] topic abandoned
-- seqs (ZSETs score seq)
-- ARGV[1] the fence member, ARGV[2..] the fence's seqs without a stored row
--
-- Reply: 1 lifted, 0 the fence was gone already (lifted by another reader)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
for i = 2, #ARGV do
  if redis.call('ZCOUNT', KEYS[1], ARGV[i], ARGV[i]) == 0 then
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i])
    redis.call('ZADD', KEYS[3], ARGV[i], ARGV[i])
  end
end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
