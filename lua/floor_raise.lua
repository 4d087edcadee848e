-- Raise a topic's copy of its retention floor (KEYS[1]) to ARGV[1], never
-- lower it, and keep it for ARGV[2] seconds. Both the retention's raise and
-- a reader putting back the floor it read from MySQL run this, so a reader
-- that read MySQL before a raise cannot undo the raise's copy.
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) > cur then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
