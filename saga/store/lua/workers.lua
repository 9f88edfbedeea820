-- The workers serving a context's definition versions: each registers what it serves and
-- renews the registration (a heartbeat) before it expires; an expired registration is a
-- worker that is gone. Expiry is judged by one clock: Redis TIME, or the injected clock.
--
-- KEYS[1] workers zset (worker id -> expiry ms)   KEYS[2] served hash (worker id -> JSON)
--
-- ARGV[1] 'beat', 'leave' or 'list'
-- ARGV[2] now in ms, or -1 for the Redis clock
-- beat:  ARGV[3] worker id, ARGV[4] ttl ms, ARGV[5] what it serves (JSON)
-- leave: ARGV[3] worker id
--
-- Expired registrations are removed first. Returns {now, id1, json1, id2, json2, ...}: the
-- live workers after the operation.
local op = ARGV[1]
local now = clock_ms(ARGV[2])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #expired > 0 then
  redis.call('ZREM', KEYS[1], unpack(expired))
  redis.call('HDEL', KEYS[2], unpack(expired))
end
if op == 'beat' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[5])
elseif op == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[3])
  redis.call('HDEL', KEYS[2], ARGV[3])
end
local result = {now}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for _, id in ipairs(live) do
  result[#result + 1] = id
  result[#result + 1] = redis.call('HGET', KEYS[2], id) or '{}'
end
return result
