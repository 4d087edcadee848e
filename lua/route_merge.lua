-- Merge month ranges into a topic's Redis route (seed 000 §3.3), atomically.
--
-- KEYS[1] route (ZSET member YYYYMM, score first seq of that month)
-- KEYS[2] route meta (HASH field YYYYMM, value "min_seq=A,max_seq=B,count=N")
-- ARGV    groups of four: month, min_seq, max_seq, count (count is added:
--         persist passes only rows its commit actually inserted)
for i = 1, #ARGV, 4 do
  local month = ARGV[i]
  local lo, hi, n = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  redis.call('ZADD', KEYS[1], 'LT', lo, month)
  local cur = redis.call('HGET', KEYS[2], month)
  if cur then
    local clo = tonumber(string.match(cur, 'min_seq=(%d+)'))
    local chi = tonumber(string.match(cur, 'max_seq=(%d+)'))
    local cn = tonumber(string.match(cur, 'count=(%d+)'))
    if clo and clo < lo then lo = clo end
    if chi and chi > hi then hi = chi end
    if cn then n = n + cn end
  end
  redis.call('HSET', KEYS[2], month, string.format('min_seq=%d,max_seq=%d,count=%d', lo, hi, n))
end
return 1
