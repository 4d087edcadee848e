-- After a message change committed: put the changed message (or its
-- tombstone) back into the topic's hot cache, so pages keep being answered
-- by Redis. Only while the topic's message version is still the one this
-- change set (a later change's own put carries the newer state), and only
-- when the cache holds an older seq (a message older than everything cached
-- stays out: the cache holds the newest stretch of a topic).
--
-- KEYS[1] hot cache (ZSET score seq), KEYS[2] topic message version
-- ARGV[1] seq, ARGV[2] member (the message JSON), ARGV[3] the change's version
if redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return 0
end
if redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
return 1
