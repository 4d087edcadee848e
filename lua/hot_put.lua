-- After a message change committed: put the changed messages (or their
-- tombstones) back into the topic's hot cache, so pages keep being answered
-- by Redis. Only while the topic's message version is still the one this
-- change set (a later change's own put carries the newer state), and each
-- only when the cache holds an older seq (a message older than everything
-- cached stays out: the cache holds the newest stretch of a topic).
--
-- KEYS[1] hot cache (ZSET score seq), KEYS[2] topic message version
-- ARGV[1] the change's version; ARGV[2], ARGV[3], … (seq, member) pairs,
-- seqs ascending, member the message JSON
-- returns how many were put back
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
local n = 0
for i = 2, #ARGV, 2 do
  if redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[i]) > 0 then
    redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
    n = n + 1
  end
end
return n
