-- Before persist stores a batch, for one or more topics of a tenant in one
-- call: each event's seq is decided against the readers' timeout, atomically
-- with it (pending_abandon.lua). A seq recorded as abandoned — it timed out
-- into a gap before anyone acknowledged it, and readers walked past it — is
-- never stored: its event is dropped. Any other seq still pending is marked
-- acknowledged ("seq:a"), so it can no longer time out into a gap while
-- persist stores it; a seq in neither set (stored already, or a Redis that
-- lost its sets) is stored as it comes.
--
-- KEYS    per topic: pending set, abandoned set
-- ARGV    per topic, in KEYS order: the number of its seqs, then the seqs
-- Returns the abandoned seqs as pairs {topic's position (1-based), seq}.
local out = {}
local a = 1
for t = 1, #KEYS / 2 do
  local pending, abandoned = KEYS[2 * t - 1], KEYS[2 * t]
  local n = tonumber(ARGV[a])
  a = a + 1
  for i = a, a + n - 1 do
    local seq = ARGV[i]
    if redis.call('ZSCORE', abandoned, seq) then
      out[#out + 1] = t
      out[#out + 1] = tonumber(seq)
    elseif redis.call('ZCOUNT', pending, seq, seq) > 0 then
      redis.call('ZREMRANGEBYSCORE', pending, seq, seq)
      redis.call('ZADD', pending, seq, seq .. ':a')
    end
  end
  a = a + n
end
return out
