-- Before a message change (recall, edit, delete for everyone) commits: take
-- the message out of the topic's hot cache and move the topic's message
-- version forward, so neither Redis nor any query process's copy of the
-- newest messages (or count remembered from them) can serve the old version
-- once the change is answered. The version comes from next_version
-- (version.lua).
--
-- KEYS[1] hot cache (ZSET score seq), KEYS[2] topic message version (STRING)
-- ARGV[1] seq, ARGV[2] version ttl ms
-- returns the new version
redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])
local v = next_version(redis.call('GET', KEYS[2]))
redis.call('SET', KEYS[2], v, 'PX', ARGV[2])
return v
