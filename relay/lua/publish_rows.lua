-- Publish a run of outbox rows to streams of one hash tag, each row at most once per
-- dedupe window, in the order given.
--
-- KEYS[1]   rs:{tag}:published   zset: message id -> publish time, server ms (shared with
--                                bus publishes, so a relay row and a direct publish of the
--                                same message id dedupe against each other)
-- KEYS[2…]  the distinct stream keys the rows go to (all in the same tag)
-- ARGV[1]   dedupe window, ms
-- ARGV[2]   1 if a row may create its stream, 0 if the stream must exist already
-- ARGV[3…]  per row: stream (index into KEYS), message id, field count n, then n
--           field/value pairs
--
-- Returns one result per row, in order:
--   entry id   published now
--   0          already published within the window: a relay died between publishing and
--              marking the row sent, and this is the repeat
--   -1         the key holds another type, not a stream (the row cannot be published)
--   -2         the stream does not exist and ARGV[2] forbids creating it (unknown stream)
--
-- Everything is checked before the first write (Lua does not roll back), and each row's
-- XADD comes before its dedupe mark, so a failed XADD leaves no mark behind. At maxmemory
-- Redis refuses the whole function before it runs (no allow-oom flag).
local now = clock_ms()
local window_start = now - tonumber(ARGV[1])
local may_create = ARGV[2] == '1'

local usable = {}
for i = 2, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind == 'stream' then
    usable[i] = true
  elseif kind == 'none' then
    usable[i] = may_create or -2
  else
    usable[i] = -1
  end
end

local plan = {}
local at = 3
while at <= #ARGV do
  local key_index = tonumber(ARGV[at])
  local count = tonumber(ARGV[at + 2])
  local row = {key = key_index, id = ARGV[at + 1], first = at + 3, last = at + 2 + count * 2}
  if usable[key_index] ~= true then
    row.result = usable[key_index]
  end
  plan[#plan + 1] = row
  at = row.last + 1
end

local results = {}
for i, row in ipairs(plan) do
  if row.result == nil then
    -- Also catches a message id repeated earlier in this same run.
    local seen = redis.call('ZSCORE', KEYS[1], row.id)
    if seen and tonumber(seen) > window_start then
      row.result = 0
    else
      row.result = redis.call('XADD', KEYS[row.key], '*', unpack(ARGV, row.first, row.last))
      redis.call('ZADD', KEYS[1], now, row.id)
    end
  end
  results[i] = row.result
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', window_start)
return results
