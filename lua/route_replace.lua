-- Replace a topic's Redis route with exactly the given month ranges (a
-- rebuild from the MySQL mirror), atomically: readers never see half of it.
--
-- KEYS[1] route ZSET, KEYS[2] route meta HASH (see persisted.lua)
-- ARGV    groups of four: month, min_seq, max_seq, count
redis.call('DEL', KEYS[1], KEYS[2])
for i = 1, #ARGV, 4 do
  redis.call('ZADD', KEYS[1], tonumber(ARGV[i + 1]), ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], string.format('min_seq=%d,max_seq=%d,count=%d',
    tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])))
end
return 1
