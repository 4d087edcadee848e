-- Raise a topic's reserved high-water to a value MySQL has committed.
--
-- KEYS[1] topic last seq, KEYS[2] topic reserved high-water (master-only)
-- ARGV[1] the committed reserved_hi
--
-- Reply: the high-water now in force, or -1 when the counter itself is gone
-- (the caller re-seeds from MySQL instead).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
local want = tonumber(ARGV[1])
if want > cur then
  redis.set_repl(redis.REPL_NONE)
  redis.call('SET', KEYS[2], ARGV[1])
  redis.set_repl(redis.REPL_ALL)
  return want
end
return cur
