-- Publish many entries to one stream, each at most once per message id within the window.
--
-- KEYS[1]  rs:{tag}:<stream>      the stream
-- KEYS[2]  rs:{tag}:published     zset: message id -> publish time (server ms)
-- ARGV[1]  dedupe window, ms
-- ARGV[2…] per message (the layout of bus._scripts.merge): 0 (its key count), m (its
--          argument count), then m arguments: its message id, field, value, …
--
-- Returns one reply per message: the new entry id, or false when that id was already
-- published in the window (a re-sent batch, or the same id twice in one batch). Ids older
-- than the window are dropped first, so ZADD NX alone tells a repeat from a new id.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
local out = {}
local a = 2
while a <= #ARGV do
  local nargs = tonumber(ARGV[a + 1])
  if redis.call('ZADD', KEYS[2], 'NX', now, ARGV[a + 2]) == 1 then
    out[#out + 1] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, a + 3, a + 1 + nargs))
  else
    out[#out + 1] = false
  end
  a = a + 2 + nargs
end
return out
