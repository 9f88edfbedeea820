-- Publish a run of outbox rows to streams of one hash tag, each row at most once per
-- dedupe window, in the order given.
--
-- KEYS[1]   rs:{tag}:published   zset: message id -> publish time, server ms (shared with
--                                bus publishes, so a relay row and a direct publish of the
--                                same message id dedupe against each other)
-- ARGV[1]   dedupe window, ms
-- ARGV[2]   1 if a row may create its stream, 0 if the stream must exist already
-- ARGV[3]   n, the number of distinct streams; ARGV[4…3+n] their keys (all in the tag)
-- then      per row: stream (1…n, its index among them), message id, field count f, then f
--           field/value pairs
--
-- The streams are arguments, not keys, so that the relay's ACL user may hold them
-- write-only (%W~: it adds rows and cannot read a participant's replies); they are in the
-- key's slot.
--
-- Returns one result per row, in order:
--   entry id   published now
--   0          already published within the window: a relay died between publishing and
--              marking the row sent, and this is the repeat
--   -1         the key holds another type, not a stream (the row cannot be published)
--   -2         the stream does not exist and ARGV[2] forbids creating it (unknown stream)
--
-- Each row's XADD comes before its dedupe mark, so a row that cannot be published leaves
-- no mark behind (the others of the run are published). At maxmemory Redis refuses the
-- whole function before it runs (no allow-oom flag).
local now = clock_ms()
local window_start = now - tonumber(ARGV[1])
local create = ARGV[2] == '1'
local nstreams = tonumber(ARGV[3])

local results = {}
local at = 4 + nstreams
while at <= #ARGV do
  local key = ARGV[3 + tonumber(ARGV[at])]
  local id = ARGV[at + 1]
  local last = at + 2 + tonumber(ARGV[at + 2]) * 2
  -- Also catches a message id repeated earlier in this same run.
  local seen = redis.call('ZSCORE', KEYS[1], id)
  local result
  if seen and tonumber(seen) > window_start then
    result = 0
  else
    local added
    if create then
      added = redis.pcall('XADD', key, '*', unpack(ARGV, at + 3, last))
    else
      added = redis.pcall('XADD', key, 'NOMKSTREAM', '*', unpack(ARGV, at + 3, last))
    end
    if type(added) == 'table' and added.err then
      result = -1  -- WRONGTYPE: the key is not a stream
    elseif not added then
      result = -2  -- NOMKSTREAM met no stream
    else
      result = added
      redis.call('ZADD', KEYS[1], now, id)
    end
  end
  results[#results + 1] = result
  at = last + 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', window_start)
return results
