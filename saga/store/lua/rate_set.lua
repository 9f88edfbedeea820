-- Change a rate limit at run time, and record who changed it, when, from what to what.
--
-- KEYS[1] rs:{limit:<name>}:bucket  hash: 'tokens', 'at', 'rate', 'burst' (rate_take.lua)
-- KEYS[2] rs:{limit:<name>}:log     list: the changes, newest first, the last 100 (JSON:
--                                   {"id", "at", "by", "old": {"rate", "burst"},
--                                   "new": {"rate", "burst"}}; rates per second)
--
-- ARGV[1] now in ms, or -1 for the Redis clock
-- ARGV[2] the new rate per second ('' keeps the current one)
-- ARGV[3] the new burst ('' keeps the current one)
-- ARGV[4] the declared rate, ARGV[5] the declared burst ('' when the caller knows none):
--         what the limit was before any change
-- ARGV[6] who changes it            ARGV[7] the change's id (a repeat changes nothing)
--
-- The bucket is refilled at the old rate up to now first, so the new rate counts from now;
-- tokens above a smaller burst are dropped. Commands already promised a token keep their
-- time. Returns the change as recorded (JSON), or the recorded one for a repeated id.
local bucket, log = KEYS[1], KEYS[2]
local now = clock_ms(ARGV[1])
local last = redis.call('LINDEX', log, 0)
if last and cjson.decode(last)['id'] == ARGV[7] then
  return last
end
local b = redis.call('HMGET', bucket, 'tokens', 'at', 'rate', 'burst')
local old_rate = tonumber(b[3] or ARGV[4])
local old_burst = tonumber(b[4] or ARGV[5])
local rate = tonumber(ARGV[2] ~= '' and ARGV[2] or old_rate)
local burst = tonumber(ARGV[3] ~= '' and ARGV[3] or old_burst)
if not rate or not burst then
  return redis.error_reply('ERR rate_set: give both a rate and a burst for a limit no worker declared')
end
local tokens, at = tonumber(b[1] or burst), tonumber(b[2] or now)
if old_rate and old_burst and now > at then
  tokens = math.min(old_burst, tokens + (now - at) * old_rate / 1000)
  at = now
end
tokens = math.min(burst, tokens)
redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', at, 'rate', tostring(rate), 'burst', burst)
local change = cjson.encode({
  id = ARGV[7], at = now, by = ARGV[6],
  old = {rate = old_rate or cjson.null, burst = old_burst or cjson.null},
  new = {rate = rate, burst = burst},
})
redis.call('LPUSH', log, change)
redis.call('LTRIM', log, 0, 99)
return change
