-- Merge month ranges into the Redis routes of one or more topics of a
-- tenant, atomically: persist merges every topic a batch
-- touched in one call instead of one call per topic.
--
-- KEYS    pairs per topic: route (ZSET member YYYYMM, score first seq of that
--         month), route meta (HASH field YYYYMM, value
--         "min_seq=A,max_seq=B,count=N")
-- ARGV    per topic, in KEYS order: the number of its ranges, then groups of
--         four: month, min_seq, max_seq, count (count is added: persist
--         passes only rows its commit actually inserted)
local a = 1
for k = 1, #KEYS, 2 do
  local route, meta = KEYS[k], KEYS[k + 1]
  local groups = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, groups do
    local month = ARGV[a]
    local lo, hi, n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    a = a + 4
    redis.call('ZADD', route, 'LT', lo, month)
    local cur = redis.call('HGET', meta, month)
    if cur then
      local clo = tonumber(string.match(cur, 'min_seq=(%d+)'))
      local chi = tonumber(string.match(cur, 'max_seq=(%d+)'))
      local cn = tonumber(string.match(cur, 'count=(%d+)'))
      if clo and clo < lo then lo = clo end
      if chi and chi > hi then hi = chi end
      if cn then n = n + cn end
    end
    redis.call('HSET', meta, month, string.format('min_seq=%d,max_seq=%d,count=%d', lo, hi, n))
  end
end
return 1
