#!lua name=imshard_fenced_{{version}}
-- The fenced library: the seq allocator and the send path's calls, as a
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
-- them never, so they cost no replication traffic. The tenant's migration
-- gate (see gate_read) is stamped and written the same way.

local run_id = nil
local function incarnation()
  if not run_id then
    run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  end
  return run_id
end

-- match is string.match for the strings every send parses again: the
-- tenant's gate and horizon, a topic's reservation and cached group, a
-- member's cached role. Each string's captures are kept in the VM (like
-- the run_id), so one seen before costs a table lookup instead of a
-- pattern match; a Lua string is a value, so the kept captures are the
-- match's own. The memo is dropped whole once it holds memo_max strings.
local memo, memo_n, memo_max = {}, 0, 4096
local function match(s, pattern)
  local by = memo[pattern]
  if not by then
    by = {}
    memo[pattern] = by
  end
  local c = by[s]
  if not c then
    if memo_n >= memo_max then
      by, memo_n = {}, 0
      memo = {[pattern] = by}
    end
    c = {string.match(s, pattern)}
    by[s], memo_n = c, memo_n + 1
  end
  return unpack(c)
end

-- the UTC month of an epoch second; the last day's answer is kept, so a send
-- computes it once a day rather than once a call
local month_day, month_of_day = nil, nil
local function utc_month(secs)
  local day = math.floor(secs / 86400)
  if day == month_day then
    return month_of_day
  end
  -- days-from-civil inverse (proleptic Gregorian), exact for any epoch second
  local z = day + 719468
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
  month_day, month_of_day = day, y * 100 + m
  return month_of_day
end

-- A topic's reservation is one STRING "run_id:high-water": the durable
-- high-water mirrored from MySQL and the stamp of the server that seeded
-- the counter, read together with the counter in the call's one MGET.
-- (Until the library of this layout, the two were the strings seqhw: and
-- seqstamp:; seed moves a topic from them, see there.) The reply is the
-- high-water, or nil when the reservation is missing or from another server
-- incarnation: the counter counts as lost.
local function reserved(res)
  if not res then
    return nil
  end
  local stamp, hw = match(res, '^(%w+):(%d+)$')
  if stamp ~= incarnation() then
    return nil
  end
  return tonumber(hw)
end

-- The migration write gate of a tenant (docs/migration.md, "The write
-- gate"): one STRING "run_id:n:SC:state" that the migrate commands set,
-- through gate_set, after they moved the migration's state in MySQL. S is
-- 1 while the state refuses sends, C while it refuses changes (recall,
-- edit, delete for everyone); state names the state; n counts the writes
-- of this incarnation, so that a writer replaces exactly the value it read
-- (gate_set). Every allocation reads it in the same call, so once a command
-- set it no process can allocate a seq the legacy writers may also issue,
-- however old that process's own copy of the state. A gate that is
-- missing or from another server incarnation (a flush, a restart from an
-- old snapshot, a failover) answers nothing: the caller rebuilds it from
-- MySQL (routing.ConvergeMigrationGate) before any allocation.
--
-- gate_read returns n (0: missing or stale), the flags and the state.
local function gate_read(v)
  if not v then
    return 0
  end
  local stamp, n, flags, state = match(v, '^(%w+):(%d+):([01][01]):(%w*)$')
  if stamp ~= incarnation() then
    return 0
  end
  return tonumber(n), flags, state
end

-- gate_shut is the reply of an allocation the gate v does not let through:
-- {10, state} while it refuses sends, {11} when it must be rebuilt; nil
-- when it is open.
local function gate_shut(v)
  local n, flags, state = gate_read(v)
  if n == 0 then
    return {11}
  end
  if string.sub(flags, 1, 1) == '1' then
    return {10, state}
  end
  return nil
end

-- alloc: the next seq of a topic and the tenant's active month, in one step.
--
-- KEYS[1] active month (STRING YYYYMM, replicated)
-- KEYS[2] ready months (ZSET member YYYYMM, score YYYYMM): months whose table
--         the shard manager has made writable
-- KEYS[3] topic last seq (STRING, INCR; readers GET it)
-- KEYS[4] topic reservation (STRING "run_id:high-water", see reserved)
-- KEYS[5] topic pending seqs (ZSET score seq, member "seq:allocation_ms"):
--         allocated but not yet persisted; readers stop below the lowest
--         (invariant 12, docs/invariants.md)
-- KEYS[6] the tenant's migration gate (see gate_read)
-- ARGV[1] "1" when shard.auto_advance is on
-- ARGV[2] low-water distance: below it the reply asks for a reservation ahead
--
-- Replies (first element is the status):
--   {0, seq, month, hw_or_0, member} allocated; hw_or_0 > 0 asks the caller
--                            to reserve the next step now, before it runs
--                            out; member is the seq's entry in KEYS[5]
--   {1}                      no active month: recover it from MySQL
--   {2, month}               a newer ready month is due: record it in MySQL,
--                            activate it, retry (never set here: every
--                            activation is recorded in MySQL before Redis)
--   {3}                      the counter or its reservation is missing, or
--                            from another server incarnation: seed it from
--                            MySQL
--   {4, floor}               the reservation is used up: reserve above
--                            floor, retry
--   {10, state}              the tenant's migration refuses sends (state)
--   {11}                     the migration gate is missing or stale:
--                            rebuild it from MySQL, retry
--
-- The gate is read before anything else: a refused call changes nothing.
-- alloc_with takes the keys one by one and the clock as read: the send call
-- shares it without building tables per call.
local function alloc_with(ready_key, seq_key, pending_key, auto, low, secs, ms, active, last, res)
  if not active then
    return {1}
  end
  if auto == '1' then
    local now = utc_month(secs)
    local cur = tonumber(active)
    if now > cur then
      local due = redis.call('ZREVRANGEBYSCORE', ready_key, now, '(' .. cur, 'LIMIT', 0, 1)
      if due[1] then
        return {2, due[1]}
      end
    end
  end
  local hw = reserved(res)
  if not hw or not last then
    return {3}
  end
  last = tonumber(last)
  if last + 1 > hw then
    return {4, math.max(hw, last)}
  end
  redis.set_repl(redis.REPL_NONE)
  local seq = redis.call('INCR', seq_key)
  redis.set_repl(redis.REPL_ALL)
  local member = string.format('%d:%d', seq, ms)
  redis.call('ZADD', pending_key, seq, member)
  local ask = 0
  if hw - seq < tonumber(low) then
    ask = hw
  end
  return {0, seq, active, ask, member}
end

-- clock is Redis time: seconds, ms and µs
local function clock()
  local t = redis.call('TIME')
  local secs, us = tonumber(t[1]), tonumber(t[2])
  return secs, secs * 1000 + math.floor(us / 1000), secs * 1000000 + us
end

local function alloc(keys, args)
  -- one read of the four strings it decides on
  local v = redis.call('MGET', keys[1], keys[3], keys[4], keys[6])
  local shut = gate_shut(v[4])
  if shut then
    return shut
  end
  local secs, ms = clock()
  return alloc_with(keys[2], keys[3], keys[5], args[1], args[2], secs, ms, v[1], v[2], v[3])
end

-- seed: restore a topic's counter at the durable high-water.
--
-- KEYS[1] topic last seq, KEYS[2] topic reservation ("run_id:high-water"),
-- KEYS[3] and KEYS[4] the topic's high-water and stamp strings of the
-- layout before (seqhw:, seqstamp:), KEYS[5] topic pending seqs
-- ARGV[1] reserved_hi read from MySQL: every seq ever issued is <= it
-- ARGV[2] the lowest seq MySQL did not prove stored when the caller read it
--
-- A seeded counter lost the pending set with it (or, restored from an older
-- state, holds one that misses later seqs): seqs from ARGV[2] up to the new
-- counter may still be on their way through Kafka, acknowledged or not. So
-- the same call puts a resume fence in the pending set, member
-- "from:f:to:T0ms" at score 0 (no seq's score: removals by seq never touch
-- it), T0 the Redis time of the re-seed. Readers stop below `from` until
-- nothing allocated before T0 can still arrive (routing.Flight, fence.go).
-- A reader of an older release reads the member as seq `from` in flight at
-- an unknown time, and stops below it too.
--
-- A topic still in the layout before moves here, atomically: when its old
-- stamp is this incarnation's, its old high-water (committed to MySQL before
-- it was set, like every high-water) becomes the reservation and the counter
-- goes on where it was; otherwise it is seeded as a lost one. Either way the
-- old strings go.
--
-- Reply: 2 seeded and fenced, 1 seeded (nothing to fence), 0 this
-- incarnation had seeded it already (nothing changed, or only moved from
-- the layout before).
local function seed(keys, args)
  local v = redis.call('MGET', keys[1], keys[2], keys[3], keys[4])
  if v[1] and reserved(v[2]) then
    return 0
  end
  local inc = incarnation()
  redis.set_repl(redis.REPL_NONE)
  if v[3] or v[4] then
    redis.call('DEL', keys[3], keys[4])
    if v[1] and v[4] == inc and string.match(v[3] or '', '^%d+$') then
      redis.call('SET', keys[2], inc .. ':' .. v[3])
      redis.set_repl(redis.REPL_ALL)
      return 0
    end
  end
  local hi = tonumber(args[1])
  -- a counter above the durable high-water cannot be stale (the high-water
  -- bounds everything issued); keep it rather than step back
  local cur = tonumber(v[1] or '0')
  local top = math.max(cur, hi)
  redis.call('SET', keys[1], top)
  redis.call('SET', keys[2], string.format('%s:%d', inc, hi))
  redis.set_repl(redis.REPL_ALL)
  local from = tonumber(args[2])
  if from <= top then
    local _, ms = clock()
    redis.call('ZADD', keys[5], 0, string.format('%d:f:%d:%d', from, top, ms))
    return 2
  end
  return 1
end

-- extend: raise a topic's reserved high-water to a value MySQL committed.
--
-- KEYS as seed; ARGV[1] the committed reserved_hi
--
-- Reply: the high-water now in force, or -1 when the counter or its
-- reservation is gone or from another incarnation (the caller re-seeds
-- instead).
local function extend(keys, args)
  local v = redis.call('MGET', keys[1], keys[2])
  local cur = reserved(v[2])
  if not v[1] or not cur then
    return -1
  end
  local want = tonumber(args[1])
  if want > cur then
    redis.set_repl(redis.REPL_NONE)
    redis.call('SET', keys[2], string.format('%s:%d', incarnation(), want))
    redis.set_repl(redis.REPL_ALL)
    return want
  end
  return cur
end

-- idem_since: set or lower the tenant's idempotency horizon: from this
-- Redis-time ms on, a claim that finds no record is a new send without
-- asking MySQL. Stamped with the server incarnation like the counters: a
-- restarted, restored or promoted server may lack records the horizon
-- vouched for, so there it counts as unset until re-established.
--
-- The caller computed the horizon from MySQL after a send call found the
-- tenant's memory of sends complete (see memory_start): it is set only while
-- that memory is still the one the caller saw, so a loss of Redis since
-- cannot leave a horizon made from a MySQL that was not complete for it.
--
-- KEYS[1] horizon ("run_id:ms"), KEYS[2] memory start (see memory_start)
-- ARGV[1] proposed horizon ms, ARGV[2] the memory start the send call
-- reported
-- Reply: the horizon in force (ms), or -1 when the memory changed: nothing
-- set.
local function idem_since(keys, args)
  if redis.call('GET', keys[2]) ~= incarnation() .. ':' .. args[2] then
    return -1
  end
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

-- send: everything a send needs from Redis before its produce, in one call
-- (docs/architecture.md, "The send path"): the membership check from the
-- ACL cache, the idempotency claim, the allocation (as alloc) and the
-- stored event, so a retry re-produces the same event. The steady state —
-- membership cached, horizon trusted, reservation available, no month due —
-- answers {0, …}; every other reply names the one thing the caller must do
-- (read MySQL, activate, seed, reserve) before it calls again with the same
-- owner token, which then continues its own claim.
--
-- KEYS[1] idempotency HASH: status (pending → acked → done, or failed),
--         event (the Kafka event JSON without group_id, seq_id and
--         shard_month: those are the fields gid, seq, month), ver (the
--         topic's message version at the allocation), resp (the 201
--         body, only when MySQL answered a retry or sent found the record
--         lost), owner and claimed_at
--         (only while a claim waits for the caller's slow path)
-- KEYS[2] the tenant's idempotency horizon ("run_id:ms", see idem_since)
-- KEYS[3] ACL group cache (STRING "group_id|status" or "-")
-- KEYS[4] ACL members cache (HASH user id → "role|muted_until_ms" or "-")
-- KEYS[5..9] as alloc's KEYS[1..5]: active month, ready months, topic last
--         seq, topic reservation, pending seqs
-- KEYS[10] the tenant's migration gate (as alloc's KEYS[6]), read first
-- KEYS[11] the topic's message version (STRING, moved by every message
--         change before it commits): kept in the record as 'ver', so sent
--         can tell whether a change may have come before its ack
-- KEYS[12] persist's progress, persisted_before (STRING Redis ms, see
--         modules/persist/progress.go), KEYS[13] the tenant's memory start
--         (see memory_start); both read only when the horizon does not vouch
-- KEYS[14] the topic's deletion-range version (STRING, moved by every hide)
-- ARGV[1] owner token of this attempt
-- ARGV[2] idempotency TTL ms (send.idempotency_ttl)
-- ARGV[3] stale bound ms (send.produce_timeout; also how long after a
--         fence's re-seed or the memory start a send may still be stored)
-- ARGV[4] sender's user id: check the membership in the ACL cache; "" when
--         the caller has checked it against MySQL already (after a reply 8)
-- ARGV[5] group id the caller's own check found (with ARGV[4] = "")
-- ARGV[6] "1" when the caller asked MySQL for an earlier send (after a
--         reply 9, or when its own claim's seq became a gap): no horizon
--         check
-- ARGV[7] "1" when shard.auto_advance is on; ARGV[8] low-water distance
-- ARGV[9] the event JSON without allocation (message.Unallocated)
-- ARGV[10] the message version's TTL ms: a topic without one gets one here
-- KEYS[15..17] the send's rate-limit buckets: the tenant's, the sender's,
--         the topic's (STRING, the bucket's theoretical arrival time in
--         Redis-time µs, expiring once the bucket is full again)
-- ARGV[11..16] each bucket's emission interval (µs a send uses up; "0":
--         the bucket is off) and burst, in the order of KEYS[15..17]
--
-- Replies (first element is the status):
--   {0, seq, month, ask, gid, member, bucket, remaining, reset_us}
--        allocated and the event stored; ask > 0 asks for a reservation
--        ahead (as alloc's hw_or_0); member is the seq's pending entry (for
--        sent); bucket (0: none is on) is the rate-limit bucket with the
--        fewest sends left, remaining of them at once, full again in
--        reset_us
--   {1} {2, month} {3} {4, floor}   alloc's slow paths; the claim is held
--   {10, state} {11}   alloc's gate replies, before any claim or check
--   {5, status, event, resp, gid, seq, month}   a record exists: a retry
--   {6}  a live claim of another attempt: wait for it
--   {7, reason}  the ACL refuses: nogroup, dissolved, notmember, muted
--   {8}  the ACL cache has no answer: check MySQL, then call with ARGV[4] = ""
--   {9, horizon_set, start, complete}  claimed, but Redis alone cannot
--        vouch that no earlier send exists: ask MySQL, then call with
--        ARGV[6] = "1". start is the tenant's memory start; complete is 1
--        when persist passed everything Kafka took before start + the
--        produce timeout, so MySQL answers for every topic from then on
--        (only then may a horizon be computed from it, see idem_since)
--   {13, bucket, retry_us}  a rate limit refuses the send (bucket 1 the
--        tenant's, 2 the sender's, 3 the topic's: the one that frees last);
--        nothing claimed, allocated or charged, see limit
--   {12, wait_ms}  nothing claimed or allocated: a resume fence of the topic
--        stands, so a send made before Redis lost its memory may still be
--        stored; MySQL's "no earlier send" is not complete for wait_ms more
--        (at least; persist's progress decides)
-- Whenever the horizon does not vouch (or ARGV[6] = "1"), a counter this
-- server does not hold answers {3} first, so the seed fences the topic
-- before its fences are read.
--
-- Room for later steps of the same call: a step that needs keys takes them
-- after KEYS[17] and its arguments after ARGV[16], all with the tenant tag.

-- limit: the send's rate limits (GCRA, docs/operations.md "Limits"),
-- decided for all three buckets before the call claims or allocates
-- anything, and charged only by the call that allocates (charge), so a
-- refused send changes nothing and a send that takes slow paths is charged
-- once. A retry answered from its record ({5}) or waiting for a live claim
-- ({6}) is decided before it and never charged. The buckets' stored values
-- are v[9..11] of the call's MGET; now is Redis time in µs.
--
-- A bucket's tat (theoretical arrival time) is when it is full again: each
-- send it let through moves it an interval on; a send passes while
-- tat + interval - burst * interval <= now. Reply: nil and
-- the new tats with the tightest bucket (fewest left), or the refusing
-- bucket that frees last and its wait.
local function limit(v, args, now)
  local nexts, tight, left, reset = {}, 0, nil, 0
  local refused, wait = 0, 0
  for b = 1, 3 do
    local interval = tonumber(args[9 + 2 * b])
    if interval > 0 then
      local burst = tonumber(args[10 + 2 * b])
      local tat = math.max(tonumber(v[8 + b] or '0') or 0, now)
      local nxt = tat + interval
      local allow_at = nxt - interval * burst
      if allow_at > now then
        if allow_at - now > wait then
          refused, wait = b, allow_at - now
        end
      else
        nexts[b] = nxt
        local n = math.floor((now - allow_at) / interval)
        if not left or n < left then
          tight, left, reset = b, n, nxt - now
        end
      end
    end
  end
  if refused > 0 then
    return {13, refused, wait}
  end
  return nil, nexts, tight, left or 0, reset
end

-- charge stores the buckets' new tats, each expiring when its bucket would
-- be full again (the state then says nothing a missing key does not).
-- Both numbers are written with '%d' (exact up to 2^63; the tats are whole
-- µs): a float's formatting — '%.0f', or a number argument, which Redis
-- formats with '%.17g' — costs Redis about twice as much.
local function charge(keys, nexts, now)
  for b = 1, 3 do
    if nexts[b] then
      redis.call('SET', keys[14 + b], string.format('%d', nexts[b]), 'PX',
        string.format('%d', (nexts[b] - now) / 1000 + 1))
    end
  end
end

-- memory_start is the Redis time (ms) from which this server remembers the
-- tenant's sends: every send whose idempotency record it may have lost (a
-- flush, a restart, a failover) made its call before it. KEYS is the
-- STRING "run_id:ms", set here when missing or from another incarnation —
-- the first call that finds the horizon untrusted, so after any loss.
local function memory_start(key, now)
  local stamp, ms = string.match(redis.call('GET', key) or '', '^(%w+):(%d+)$')
  if stamp == incarnation() then
    return tonumber(ms)
  end
  redis.set_repl(redis.REPL_NONE)
  redis.call('SET', key, incarnation() .. ':' .. now)
  redis.set_repl(redis.REPL_ALL)
  return now
end

-- fence_wait is how long (ms, at least 1) a resume fence of the topic
-- (see seed) still stands by persist's progress, or nil when none does.
-- While one stands, a message sent before Redis lost the topic's counter
-- may still be in Kafka, acknowledged and not stored: MySQL saying "no
-- earlier send" proves nothing for the topic yet. A fence is lifted by the
-- same rule (routing fence.go): persisted_before >= T0 + produce timeout.
local function fence_wait(pending_key, persisted_key, timeout, now)
  local fences = redis.call('ZRANGEBYSCORE', pending_key, 0, 0)
  if not fences[1] then
    return nil
  end
  local persisted = tonumber(redis.call('GET', persisted_key) or '0') or 0
  local wait = nil
  for _, f in ipairs(fences) do
    local at = tonumber(string.match(f, '^%d+:f:%d+:(%d+)$') or '')
    if at and persisted < at + timeout then
      wait = math.max(wait or 1, at + timeout - now)
    end
  end
  return wait
end

-- hold keeps a claim while the caller takes a slow path: the record is this
-- attempt's claim, unless it is already (owner is the record's)
local function hold(key, owner, now, ttl, held_by)
  if held_by ~= owner then
    redis.call('DEL', key)
    redis.call('HSET', key, 'status', 'pending', 'owner', owner, 'claimed_at', now)
    redis.call('PEXPIRE', key, ttl)
  end
end

local function send(keys, args)
  local secs, now, now_us = clock()
  local gid = args[5]
  -- every string the call decides on, in one read
  local v = redis.call('MGET', keys[3], keys[2], keys[5], keys[7], keys[8], keys[10], keys[11], keys[14],
    keys[15], keys[16], keys[17])
  local shut = gate_shut(v[6])
  if shut then
    return shut
  end
  if args[4] ~= '' then
    -- the decision acl.Membership makes in Go, on the cached facts
    local g = v[1]
    local m = redis.call('HGET', keys[4], args[4])
    if not g or not m then
      return {8}
    end
    if g == '-' then
      return {7, 'nogroup'}
    end
    local id, status = match(g, '^(%d+)|(.*)$')
    if not id then
      return {8}
    end
    if status == 'dissolved' then
      return {7, 'dissolved'}
    end
    if m == '-' then
      return {7, 'notmember'}
    end
    local role, muted = match(m, '^(.*)|(%d+)$')
    if not role then
      return {8}
    end
    if tonumber(muted) > now or (status == 'muted' and role ~= 'admin' and role ~= 'owner') then
      return {7, 'muted'}
    end
    gid = id
  end
  local rec = redis.call('HMGET', keys[1], 'status', 'event', 'resp', 'claimed_at', 'owner', 'gid', 'seq', 'month')
  if rec[2] or rec[3] then
    return {5, rec[1] or '', rec[2], rec[3], rec[6], rec[7], rec[8]}
  end
  if rec[1] and rec[5] ~= args[1] and now - tonumber(rec[4] or '0') < tonumber(args[3]) then
    return {6}
  end
  local refusal, nexts, tight, left, reset = limit(v, args, now_us)
  if refusal then
    return refusal
  end
  local stamp, since = match(v[2] or '', '^(%w+):(%d+)$')
  local set = stamp == incarnation()
  if args[6] == '1' or not set or now < tonumber(since) then
    -- Redis alone cannot vouch that this is a new send; MySQL can only
    -- once nothing sent before Redis's memory began can still be stored.
    -- A counter this server does not hold is seeded first: the seed fences
    -- the topic's seqs MySQL did not prove stored (they may be in Kafka).
    local timeout = tonumber(args[3])
    if not v[4] or not reserved(v[5]) then
      hold(keys[1], args[1], now, args[2], rec[5])
      return {3}
    end
    local wait = fence_wait(keys[9], keys[12], timeout, now)
    if wait then
      return {12, wait}
    end
    if args[6] ~= '1' then
      local start = memory_start(keys[13], now)
      local persisted = tonumber(redis.call('GET', keys[12]) or '0') or 0
      local complete = 0
      if persisted >= start + timeout then
        complete = 1
      end
      hold(keys[1], args[1], now, args[2], rec[5])
      if set then
        return {9, 1, start, complete}
      end
      return {9, 0, start, complete}
    end
  end
  local a = alloc_with(keys[6], keys[7], keys[9], args[7], args[8], secs, now, v[3], v[4], v[5])
  if a[1] ~= 0 then
    hold(keys[1], args[1], now, args[2], rec[5])
    return a
  end
  if rec[1] then
    redis.call('DEL', keys[1])
  end
  charge(keys, nexts, now_us)
  a[5], a[6], a[7], a[8], a[9] = gid, a[5], tight, left, reset
  -- a topic that takes sends holds a message and a deletion-range
  -- version: a process's copy of its newest messages and its remembered
  -- counts are trusted only under versions Redis holds, and a version lost
  -- with its key is never handed out again (next_version), so nothing a
  -- process kept from before a loss can match
  local ver = v[7]
  if not ver then
    ver = next_version(nil)
    redis.call('SET', keys[11], ver, 'PX', args[10])
  end
  if not v[8] then
    redis.call('SET', keys[14], next_version(nil))
  end
  redis.call('HSET', keys[1], 'status', 'pending', 'event', args[9], 'gid', gid, 'seq', a[2], 'month', a[3],
    'ver', ver)
  redis.call('PEXPIRE', keys[1], args[2])
  return a
end

-- sent: everything after the broker's ack, in one call: the record acked,
-- the seq no longer timing out into a gap, the message in the hot cache,
-- the realtime publish — for one send or for several of the tenant's
-- sends whose acks came together (the send role coalesces them: one call
-- instead of one each). Send i (from 0) has KEYS[6i+1..6i+6] and
-- ARGV[8i+1..8i+8], numbered below as for the first.
--
-- KEYS[1] idempotency HASH, KEYS[2] topic pending seqs, KEYS[3] hot cache,
-- KEYS[4] the topic's realtime channel (SPUBLISH: a key for the slot),
-- KEYS[5] the topic's message version, KEYS[6] the topic's abandoned seqs
-- ARGV[1] seq, ARGV[2] idempotency TTL ms
-- ARGV[3] the 201 body: if the record was lost since the send call (a
--         flush, a failover) it is written again as status acked with this
--         resp, so a retry still answers with the original body
-- ARGV[4] hot-cache member ("" = no hot cache), ARGV[5] hot-cache TTL ms,
-- ARGV[6] hot-cache size per topic: trimmed to it at every 16th seq, so it
--         holds up to 15 more between trims (one trim call instead of 16)
-- ARGV[7] the seq's pending entry as send returned it ("" = unknown)
-- ARGV[8] the realtime frame
--
-- 'done' (set by persist after its commit) is never downgraded: the ack can
-- reach the sender after the consumer has already stored the message.
--
-- The message as sent goes to the hot cache and the stream only while no
-- change of it can have committed (invariant 14, docs/invariants.md): a
-- change answers 409 while the seq is pending, so a seq still pending here
-- has none yet, and the change's own call, which comes later, takes this
-- member out again. A seq no longer pending was stored already: then only
-- an unmoved message version since the allocation (the record's ver) rules
-- a change out; otherwise the cache and the stream are left to storage.
--
-- The pending entry decides whether the ack came in time (invariant 12): a
-- reader turns an entry unacknowledged past send.produce_timeout into a gap
-- and marks the seq abandoned in one step (pending_abandon.lua), an ack
-- replaces the entry, so exactly one of them wins. An ack that finds its
-- seq abandoned changes nothing: readers walked past the seq, persist drops
-- its event, and the record stays unacknowledged, so a retry sends the
-- message afresh under a new seq (idem_retry.lua).
--
-- Reply: an array with one element per send: 1 cached and published; 2
-- stored already and a change may have come first: neither cached nor
-- published (the record is acked all the same); 0 the seq was abandoned:
-- nothing done, the send must not answer 201; a string, the error that
-- stopped this send's part (the others' parts are done all the same). The
-- publish comes last: a failure before it is reported with it.
local function sent_one(keys, args, k, a)
  -- the entry the allocation made, when the caller knows it (a retry's
  -- may carry a later time): found by member, else by score
  local own = args[a + 7] ~= '' and redis.call('ZREM', keys[k + 2], args[a + 7]) == 1
  local acked = own
  if not acked and redis.call('ZCOUNT', keys[k + 2], args[a + 1], args[a + 1]) > 0 then
    redis.call('ZREMRANGEBYSCORE', keys[k + 2], args[a + 1], args[a + 1])
    acked = true
  end
  if acked then
    redis.call('ZADD', keys[k + 2], args[a + 1], args[a + 1] .. ':a')
  elseif redis.call('ZSCORE', keys[k + 6], args[a + 1]) then
    return 0
  end
  if own then
    -- The allocation's own entry was still there, so the record needs no
    -- read: persist replaces the entry before it stores the seq (its
    -- claim) and removes it in the same step that marks the record done,
    -- so the record is not done; it is the one send stored (pending, or
    -- failed by a produce that gave up before this ack) unless Redis lost
    -- it, which the status field's being new tells.
    if redis.call('HSET', keys[k + 1], 'status', 'acked') == 1 then
      redis.call('HSET', keys[k + 1], 'resp', args[a + 3])
      redis.call('PEXPIRE', keys[k + 1], args[a + 2])
    end
  else
    local rec = redis.call('HMGET', keys[k + 1], 'status', 'ver')
    if not rec[1] then
      redis.call('HSET', keys[k + 1], 'status', 'acked', 'resp', args[a + 3])
      redis.call('PEXPIRE', keys[k + 1], args[a + 2])
    elseif rec[1] ~= 'done' then
      redis.call('HSET', keys[k + 1], 'status', 'acked')
    end
    if not acked and rec[2] ~= (redis.call('GET', keys[k + 5]) or '') then
      return 2
    end
  end
  if args[a + 4] ~= '' then
    redis.call('ZADD', keys[k + 3], args[a + 1], args[a + 4])
    redis.call('PEXPIRE', keys[k + 3], args[a + 5])
    if tonumber(args[a + 1]) % 16 == 0 then
      redis.call('ZREMRANGEBYRANK', keys[k + 3], 0, -tonumber(args[a + 6]) - 1)
    end
  end
  redis.call('SPUBLISH', keys[k + 4], args[a + 8])
  return 1
end

local function sent(keys, args)
  local out = {}
  for i = 0, #keys / 6 - 1 do
    local ok, r = pcall(sent_one, keys, args, 6 * i, 8 * i)
    if not ok then
      -- a redis.call error is a table {err = ...}
      r = type(r) == 'table' and (r.err or 'error') or tostring(r)
    end
    out[i + 1] = r
  end
  return out
end

-- gate_get: the tenant's migration gate as this incarnation holds it.
--
-- KEYS[1] the gate
-- Reply: {n, flags, state}; n 0 when the gate is missing or stale.
local function gate_get(keys)
  local n, flags, state = gate_read(redis.call('GET', keys[1]))
  return {n, flags or '', state or ''}
end

-- gate_set: replace the gate the caller read with gate_get, and only that
-- one: a writer that read the gate, then MySQL, and finds the gate written
-- meanwhile (by a command that moved the state since, or another rebuild)
-- writes nothing and reads both again.
--
-- KEYS[1] the gate; ARGV[1] n as read (0: missing or stale); ARGV[2]
-- "SC:state" as MySQL says
-- Reply: 1 written, 0 the gate changed since it was read.
local function gate_set(keys, args)
  local n = gate_read(redis.call('GET', keys[1]))
  if n ~= tonumber(args[1]) then
    return 0
  end
  redis.set_repl(redis.REPL_NONE)
  redis.call('SET', keys[1], incarnation() .. ':' .. (n + 1) .. ':' .. args[2])
  redis.set_repl(redis.REPL_ALL)
  return 1
end

redis.register_function('imshard_alloc_{{version}}', alloc)
redis.register_function('imshard_seed_{{version}}', seed)
redis.register_function('imshard_extend_{{version}}', extend)
redis.register_function('imshard_idem_since_{{version}}', idem_since)
redis.register_function('imshard_send_{{version}}', send)
redis.register_function('imshard_sent_{{version}}', sent)
redis.register_function('imshard_gate_get_{{version}}', gate_get)
redis.register_function('imshard_gate_set_{{version}}', gate_set)
