-- Finish an entry: record the handler's result, publish its reply, acknowledge. Fenced.
--
-- KEYS[1]  the stream                 KEYS[2]  rs:{tag}:failures:<name>:<group>
-- KEYS[3]  dedupe key, or KEYS[1] when the handler is not idempotent
-- KEYS[4]  reply stream, or KEYS[1] when no reply is published here
-- KEYS[5]  the reply tag's rs:{tag}:published (dedupe of the reply's publish)
-- ARGV[1]  group        ARGV[2]  consumer      ARGV[3]  entry id
-- ARGV[4]  dedupe TTL, s                        ARGV[5]  result ('R…') to record, or ''
--          to record nothing (the in-flight marker is cleared so a retry may run again)
-- ARGV[6]  reply message id                     ARGV[7]  publish dedupe window, ms
-- ARGV[8]  1 to acknowledge, 0 to only record (the reply goes to another slot first)
-- ARGV[9…] reply fields
--
-- Returns 'lost' (lease taken over: nothing written), 'done', or {'duplicate', first}
-- when a concurrent delivery recorded a different result first: nothing is written and the
-- caller completes again with that first result, so every reply carries the first result.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not (p[1] and p[1][2] == ARGV[2]) then
  return 'lost'
end
if KEYS[3] ~= KEYS[1] then
  local value = redis.call('GET', KEYS[3])
  if value and string.sub(value, 1, 1) == 'R' and value ~= ARGV[5] then
    return {'duplicate', value}
  end
  if ARGV[5] ~= '' then
    redis.call('SET', KEYS[3], ARGV[5], 'EX', ARGV[4])
  elseif value then
    redis.call('DEL', KEYS[3])
  end
end
if KEYS[4] ~= KEYS[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local window_start = now - tonumber(ARGV[7])
  local seen = redis.call('ZSCORE', KEYS[5], ARGV[6])
  if not (seen and tonumber(seen) > window_start) then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', window_start)
    redis.call('ZADD', KEYS[5], now, ARGV[6])
    redis.call('XADD', KEYS[4], '*', unpack(ARGV, 9))
  end
end
if ARGV[8] == '1' then
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
  redis.call('HDEL', KEYS[2], ARGV[3])
end
return 'done'
