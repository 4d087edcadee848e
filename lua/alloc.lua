-- Allocate the next seq of a topic and the tenant's active month in one step.
--
-- KEYS[1] active month (STRING YYYYMM, replicated)
-- KEYS[2] ready months (ZSET member YYYYMM, score YYYYMM): months whose table
--         the shard manager has made writable
-- KEYS[3] topic last seq (STRING, master-only)
-- KEYS[4] topic reserved high-water (STRING, master-only)
-- KEYS[5] topic pending seqs (ZSET score seq, member "seq:allocation_ms"):
--         allocated but not yet persisted; readers stop below the lowest
--         (DESIGN invariant 12)
-- ARGV[1] "1" when shard.auto_advance is on
-- ARGV[2] low-water distance: below it the reply asks for a reservation ahead
--
-- Replies (first element is the status):
--   {0, seq, month, hw_or_0} allocated; hw_or_0 > 0 asks the caller to
--                            reserve the next step now, before it runs out
--   {1}                      no active month: recover it from MySQL
--   {2, month}               a newer ready month is due: record it in MySQL,
--                            activate it, retry (never set here: every
--                            activation is recorded in MySQL before Redis)
--   {3}                      the topic counter is missing: seed it from MySQL
--   {4, hw}                  the reservation is used up: reserve, retry
--
-- The seq and high-water keys are written with REPL_NONE: they live only on
-- the master, so a failover, a restart or a flush loses them outright and the
-- caller re-seeds from the durable reservation, above anything ever issued.
-- A replica holding a stale counter could otherwise hand out a seq twice.

local function utc_month(secs)
  -- days-from-civil inverse (proleptic Gregorian), exact for any epoch second
  local z = math.floor(secs / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return y * 100 + m
end

local active = redis.call('GET', KEYS[1])
if not active then
  return {1}
end

local t = redis.call('TIME')
if ARGV[1] == '1' then
  local now = utc_month(tonumber(t[1]))
  local cur = tonumber(active)
  if now > cur then
    local due = redis.call('ZREVRANGEBYSCORE', KEYS[2], now, '(' .. cur, 'LIMIT', 0, 1)
    if due[1] then
      return {2, due[1]}
    end
  end
end

local last = redis.call('GET', KEYS[3])
if not last then
  return {3}
end
local hw = tonumber(redis.call('GET', KEYS[4]) or '0')
if tonumber(last) + 1 > hw then
  return {4, hw}
end

redis.set_repl(redis.REPL_NONE)
local seq = redis.call('INCR', KEYS[3])
redis.set_repl(redis.REPL_ALL)
redis.call('ZADD', KEYS[5], seq, seq .. ':' .. (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))

local ask = 0
if hw - seq < tonumber(ARGV[2]) then
  ask = hw
end
return {0, seq, active, ask}
