-- Before a message change (recall, edit, delete for everyone) commits: take
-- the message out of the topic's hot cache and move the topic's message
-- version forward, so neither Redis nor any query process's copy of the
-- newest messages (or count remembered from them) can serve the old version
-- once the change is answered. The version comes from next_version
-- (version.lua). A group purge or a retention trim takes out a whole
-- stretch of seqs the same way, before and after each batch it removes.
--
-- KEYS[1] hot cache (ZSET score seq), KEYS[2] topic message version (STRING)
-- ARGV[1] seq (of a stretch: its first, "-inf" from the start), ARGV[2]
-- version ttl ms, ARGV[3] optional: the stretch's last seq
-- returns the new version
redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[3] or ARGV[1])
local v = next_version(redis.call('GET', KEYS[2]))
redis.call('SET', KEYS[2], v, 'PX', ARGV[2])
return v
