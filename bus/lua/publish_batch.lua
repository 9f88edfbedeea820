-- Publish many entries to one stream, each at most once per message id within the window.
--
-- KEYS[1]  rs:{tag}:published     zset: message id -> publish time (server ms)
-- ARGV[1]  rs:{tag}:<stream>      the stream (an argument: see publish.lua)
-- ARGV[2]  dedupe window, ms
-- ARGV[3…] per message (the layout of bus._scripts.merge): 0 (its key count), m (its
--          argument count), then m arguments: its message id, field, value, …
--
-- Returns one reply per message: the new entry id, or false when that id was already
-- published in the window (a re-sent batch, or the same id twice in one batch).
--
-- At maxmemory Redis refuses the whole function before it runs (no allow-oom flag), so a
-- refused batch writes nothing.
local now = clock_ms()
local window_start = now - tonumber(ARGV[2])
local out = {}
local a = 3
while a <= #ARGV do
  local nargs = tonumber(ARGV[a + 1])
  local id = ARGV[a + 2]
  -- ZADD NX answers for a new id in one command; an id already there is a repeat unless it
  -- is older than the window and not trimmed yet (then it is published again)
  local fresh = redis.call('ZADD', KEYS[1], 'NX', now, id) == 1
  if not fresh and tonumber(redis.call('ZSCORE', KEYS[1], id)) <= window_start then
    redis.call('ZADD', KEYS[1], now, id)
    fresh = true
  end
  if fresh then
    out[#out + 1] = redis.call('XADD', ARGV[1], '*', unpack(ARGV, a + 3, a + 1 + nargs))
  else
    out[#out + 1] = false
  end
  a = a + 2 + nargs
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', window_start)
return out
