-- next_version(cur) is a version to replace cur (a version read from Redis:
-- a decimal string, or nil/false when there is none), as a decimal string:
-- at least the Redis time in microseconds and always above cur, so a version
-- lost with its key (expiry, a flush, a delete) is never handed out again
-- while the clock moves forward, and two writes in one microsecond still
-- differ. It is put in front of the scripts that move a version (embed.go).
local function next_version(cur)
  local t = redis.call('TIME')
  local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
  cur = tonumber(cur) or 0
  if v <= cur then
    v = cur + 1
  end
  return string.format('%d', v)
end
