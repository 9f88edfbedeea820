-- Publish one entry, at most once per message id within the dedupe window.
--
-- KEYS[1]  rs:{tag}:published     zset: message id -> publish time (server ms)
-- ARGV[1]  rs:{tag}:<stream>      the stream (an argument, so that a publisher's ACL user may
--                                 hold it write-only: %W~, adding entries and reading none)
-- ARGV[2]  message id             ARGV[3]  dedupe window, ms
-- ARGV[4…] field, value, …        the envelope fields
--
-- Returns the new entry id, or false when this id was already published in the window
-- (redis-py re-sent the call after a lost reply, or a relay re-published a row).
--
-- At maxmemory Redis refuses the whole function before it runs (no allow-oom flag), so a
-- refused publish writes nothing.
local now = clock_ms()
local window_start = now - tonumber(ARGV[3])
-- ZADD NX answers for a new id in one command; an id already there is a repeat unless it
-- is older than the window and not trimmed yet (then it is published again).
if redis.call('ZADD', KEYS[1], 'NX', now, ARGV[2]) == 0 then
  if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2])) > window_start then
    return false
  end
  redis.call('ZADD', KEYS[1], now, ARGV[2])
end
local id = redis.call('XADD', ARGV[1], '*', unpack(ARGV, 4))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', window_start)
return id
