-- Publish one entry, at most once per message id within the dedupe window.
--
-- KEYS[1]  rs:{tag}:<stream>      the stream
-- KEYS[2]  rs:{tag}:published     zset: message id -> publish time (server ms)
-- ARGV[1]  message id             ARGV[2]  dedupe window, ms
-- ARGV[3…] field, value, …        the envelope fields
--
-- Returns the new entry id, or false when this id was already published in the window
-- (redis-py re-sent the call after a lost reply, or a relay re-published a row).
--
-- At maxmemory Redis refuses the whole function before it runs (no allow-oom flag), so a
-- refused publish writes nothing.
local now = clock_ms()
local window_start = now - tonumber(ARGV[2])
-- ZADD NX answers for a new id in one command; an id already there is a repeat unless it
-- is older than the window and not trimmed yet (then it is published again).
if redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1]) == 0 then
  if tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1])) > window_start then
    return false
  end
  redis.call('ZADD', KEYS[2], now, ARGV[1])
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', window_start)
return id
