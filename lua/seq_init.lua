-- Seed a topic's seq counter after it was lost (or never existed).
--
-- KEYS[1] topic last seq, KEYS[2] topic reserved high-water (master-only)
-- ARGV[1] reserved_hi read from MySQL: every seq ever issued is <= it
--
-- Reply: 1 seeded, 0 another caller seeded it first (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.set_repl(redis.REPL_NONE)
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
redis.set_repl(redis.REPL_ALL)
return 1
