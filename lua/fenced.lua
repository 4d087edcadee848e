#!lua name=imshard_fenced_{{version}}
-- The fenced library: the seq allocator and the send idempotency claim, as a
-- Redis Function library rather than EVAL scripts, because they keep one
-- piece of state in the Lua VM itself — the server's run_id, read
-- once per process. Topic counters are stamped with the run_id of the server
-- that seeded them. After a restart (from RDB or AOF), a failover (a replica
-- holds whatever its last full sync copied) or a restore, the stamp no longer
-- matches the server answering, the counter counts as lost, and the caller
-- re-seeds it from the durable MySQL high-water — above every seq any
-- incarnation ever handed out. A stale counter can never issue a seq twice.
--
-- Counters, high-waters and stamps are written with REPL_NONE: replicas need
-- them never, so they cost no replication traffic.

local run_id = nil
local function incarnation()
  if not run_id then
    run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  end
  return run_id
end

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

-- alloc: the next seq of a topic and the tenant's active month, in one step.
--
-- KEYS[1] active month (STRING YYYYMM, replicated)
-- KEYS[2] ready months (ZSET member YYYYMM, score YYYYMM): months whose table
--         the shard manager has made writable
-- KEYS[3] topic last seq, KEYS[4] topic reserved high-water,
-- KEYS[5] topic pending seqs (ZSET score seq, member "seq:allocation_ms"):
--         allocated but not yet persisted; readers stop below the lowest
--         (invariant 12, docs/invariants.md)
-- KEYS[6] topic counter stamp (run_id of the server that seeded it)
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
--   {3}                      the counter is missing or from another server
--                            incarnation: seed it from MySQL
--   {4, floor}               the reservation is used up: reserve above
--                            floor, retry
local function alloc(keys, args)
  local active = redis.call('GET', keys[1])
  if not active then
    return {1}
  end
  local t = redis.call('TIME')
  if args[1] == '1' then
    local now = utc_month(tonumber(t[1]))
    local cur = tonumber(active)
    if now > cur then
      local due = redis.call('ZREVRANGEBYSCORE', keys[2], now, '(' .. cur, 'LIMIT', 0, 1)
      if due[1] then
        return {2, due[1]}
      end
    end
  end
  if redis.call('GET', keys[6]) ~= incarnation() then
    return {3}
  end
  local last = redis.call('GET', keys[3])
  if not last then
    return {3}
  end
  last = tonumber(last)
  local hw = tonumber(redis.call('GET', keys[4]) or '0')
  if last + 1 > hw then
    return {4, math.max(hw, last)}
  end
  redis.set_repl(redis.REPL_NONE)
  local seq = redis.call('INCR', keys[3])
  redis.set_repl(redis.REPL_ALL)
  redis.call('ZADD', keys[5], seq, seq .. ':' .. (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
  local ask = 0
  if hw - seq < tonumber(args[2]) then
    ask = hw
  end
  return {0, seq, active, ask}
end

-- seed: restore a topic's counter at the durable high-water.
--
-- KEYS[1] topic last seq, KEYS[2] reserved high-water, KEYS[3] stamp
-- ARGV[1] reserved_hi read from MySQL: every seq ever issued is <= it
--
-- Reply: 1 seeded, 0 this incarnation had seeded it already (nothing changed).
local function seed(keys, args)
  if redis.call('GET', keys[3]) == incarnation() and redis.call('EXISTS', keys[1]) == 1 then
    return 0
  end
  local hi = tonumber(args[1])
  -- a counter above the durable high-water cannot be stale (the high-water
  -- bounds everything issued); keep it rather than step back
  local cur = tonumber(redis.call('GET', keys[1]) or '0')
  redis.set_repl(redis.REPL_NONE)
  redis.call('SET', keys[1], math.max(cur, hi))
  redis.call('SET', keys[2], hi)
  redis.call('SET', keys[3], incarnation())
  redis.set_repl(redis.REPL_ALL)
  return 1
end

-- extend: raise a topic's reserved high-water to a value MySQL committed.
--
-- KEYS as seed; ARGV[1] the committed reserved_hi
--
-- Reply: the high-water now in force, or -1 when the counter is gone or from
-- another incarnation (the caller re-seeds instead).
local function extend(keys, args)
  if redis.call('GET', keys[3]) ~= incarnation() or redis.call('EXISTS', keys[1]) == 0 then
    return -1
  end
  local cur = tonumber(redis.call('GET', keys[2]) or '0')
  local want = tonumber(args[1])
  if want > cur then
    redis.set_repl(redis.REPL_NONE)
    redis.call('SET', keys[2], args[1])
    redis.set_repl(redis.REPL_ALL)
    return want
  end
  return cur
end

-- idem_claim: claim the idempotency record of one send (topic, from_user,
-- client_msg_id).
--
-- KEYS[1] idempotency HASH: status (pending → acked → done, or failed),
--         event (the Kafka event JSON, set once seq and month are known),
--         resp (the 201 body, set after the broker ack), owner, claimed_at
-- KEYS[2] the tenant's idempotency horizon ("run_id:ms", see idem_since)
-- ARGV[1] owner token of this attempt
-- ARGV[2] TTL in milliseconds (send.idempotency_ttl)
-- ARGV[3] stale bound in milliseconds (send.produce_timeout)
--
-- Replies:
--   {1, trusted, horizon_set}   claimed: this attempt allocates; trusted = 1
--                               when the horizon has passed (no record here
--                               means no earlier send), horizon_set = 0 when
--                               this server incarnation has no horizon (Redis
--                               lost it, or it came from a snapshot or a
--                               full sync and may predate lost records)
--   {0, status, event, resp}    a record exists (event/resp may be nil)
--
-- A record without event and resp is a claim whose sender has not allocated
-- yet; once older than the stale bound its sender died between claim and
-- allocation (nothing was allocated), so the claim is taken over.
local function idem_claim(keys, args)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local rec = redis.call('HMGET', keys[1], 'status', 'event', 'resp', 'claimed_at')
  if rec[2] or rec[3] then
    return {0, rec[1] or '', rec[2], rec[3]}
  end
  if rec[1] and now - tonumber(rec[4] or '0') < tonumber(args[3]) then
    return {0, rec[1], false, false}
  end
  redis.call('DEL', keys[1])
  redis.call('HSET', keys[1], 'status', 'pending', 'owner', args[1], 'claimed_at', now)
  redis.call('PEXPIRE', keys[1], args[2])
  local h = redis.call('GET', keys[2])
  local stamp, since = nil, nil
  if h then
    stamp, since = string.match(h, '^(%w+):(%d+)$')
  end
  if stamp ~= incarnation() then
    return {1, 0, 0}
  end
  if now >= tonumber(since) then
    return {1, 1, 1}
  end
  return {1, 0, 1}
end

-- idem_since: set or lower the tenant's idempotency horizon: from this
-- Redis-time ms on, a claim that finds no record is a new send without
-- asking MySQL. Stamped with the server incarnation like the counters: a
-- restarted, restored or promoted server may lack records the horizon
-- vouched for, so there it counts as unset until re-established.
--
-- KEYS[1] horizon ("run_id:ms"), ARGV[1] proposed horizon ms
-- Reply: the horizon in force (ms).
local function idem_since(keys, args)
  local h = redis.call('GET', keys[1])
  if h then
    local stamp, since = string.match(h, '^(%w+):(%d+)$')
    if stamp == incarnation() and tonumber(since) <= tonumber(args[1]) then
      return tonumber(since)
    end
  end
  redis.set_repl(redis.REPL_NONE)
  redis.call('SET', keys[1], incarnation() .. ':' .. args[1])
  redis.set_repl(redis.REPL_ALL)
  return tonumber(args[1])
end

redis.register_function('imshard_alloc_{{version}}', alloc)
redis.register_function('imshard_seed_{{version}}', seed)
redis.register_function('imshard_extend_{{version}}', extend)
redis.register_function('imshard_idem_claim_{{version}}', idem_claim)
redis.register_function('imshard_idem_since_{{version}}', idem_since)
