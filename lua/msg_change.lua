-- Before a message change (recall, edit, delete for everyone) commits: take
-- the changed messages out of the topic's hot cache and move the topic's
-- message version forward, so neither Redis nor any query process's copy of
-- the newest messages (or count remembered from them) can serve an old
-- version once the change is answered. The version comes from next_version
-- (version.lua). A change of one message is one stretch (seq, seq); a batch
-- of changes of the topic (a user erase) one stretch per run of its seqs; a
-- group purge or a retention trim takes out a whole stretch ("-inf", last)
-- the same way, before and after each batch it removes.
--
-- KEYS[1] hot cache (ZSET score seq), KEYS[2] topic message version (STRING)
-- ARGV[1] version ttl ms; ARGV[2], ARGV[3], … stretches as (first, last)
-- pairs of seqs
-- returns the new version
--
-- A stretch that ends below the cache's lowest seq holds none of it and is
-- skipped: an erase's thousands of old seqs cost one read, not one
-- ZREMRANGEBYSCORE each (the first of a stretch may be "-inf", its last is
-- a seq).
local low = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if low then
  low = tonumber(low)
  for i = 2, #ARGV, 2 do
    if tonumber(ARGV[i + 1]) >= low then
      redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
end
local v = next_version(redis.call('GET', KEYS[2]))
redis.call('SET', KEYS[2], v, 'PX', ARGV[1])
return v
