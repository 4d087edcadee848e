-- Move a version forward (next_version): a version lost with its key is
-- never handed out again, so a process's copy made under an old one never
-- matches a later one (an INCR would count from 1 again after a loss).
--
-- KEYS[1] the version (its TTL, if any, is kept)
-- Reply: the new version.
local v = next_version(redis.call('GET', KEYS[1]))
redis.call('SET', KEYS[1], v, 'KEEPTTL')
return v
