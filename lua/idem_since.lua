-- Set or lower the tenant's idempotency horizon (Keys.IdemSince): from this
-- Redis-time ms on, a claim that finds no record is a new send without
-- asking MySQL. Written master-only (like the seq counters): a failover to a
-- replica that may lack recent records also lacks the horizon, so the send
-- path asks MySQL again until it is re-established.
--
-- KEYS[1] horizon (STRING ms), ARGV[1] proposed horizon ms
-- Reply: the horizon in force.
local cur = redis.call('GET', KEYS[1])
if cur and tonumber(cur) <= tonumber(ARGV[1]) then
  return tonumber(cur)
end
redis.set_repl(redis.REPL_NONE)
redis.call('SET', KEYS[1], ARGV[1])
redis.set_repl(redis.REPL_ALL)
return tonumber(ARGV[1])
