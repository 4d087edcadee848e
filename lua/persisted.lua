-- What persist settles in Redis after a DB commit, for one or more topics of
-- a tenant in one call (a batch's topics: a few calls in one round trip, not
-- one per topic and step). Per topic, in this order: its month ranges merged
-- into its route, its stored seqs taken out of its pending set, its send
-- idempotency records marked done. Each topic's steps run in one script, so
-- they are atomic together.
--
-- KEYS    per topic: route (ZSET member YYYYMM, score first seq of that
--         month), route meta (HASH field YYYYMM, value
--         "min_seq=A,max_seq=B,count=N"), pending set (ZSET scored by seq),
--         then its idempotency HASHes (fields status, event, resp)
-- ARGV    per topic, in KEYS order: the number of its ranges, then groups
--         of four: month, min_seq, max_seq, count (count is added: persist
--         passes only rows its commit actually inserted; a redelivered
--         topic passes none and its route is rebuilt by a repair); the
--         number of its runs of consecutive stored seqs, then lo, hi of
--         each; the number of its idempotency keys
-- Only an existing idempotency record is touched: a record that expired
-- must not come back as a bare {status=done} without its event and response
-- (send would then answer a retry with nothing), and its TTL is kept.
-- Returns how many idempotency records were marked.
local k, a, marked = 1, 1, 0
while k <= #KEYS do
  local route, meta, pending = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  k = k + 3
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
  local runs = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, runs do
    redis.call('ZREMRANGEBYSCORE', pending, ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  local idem = tonumber(ARGV[a])
  a = a + 1
  for i = k, k + idem - 1 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      redis.call('HSET', KEYS[i], 'status', 'done')
      marked = marked + 1
    end
  end
  k = k + idem
end
return marked
