-- Take a token from a rate limit's bucket for one command, or give one back.
--
-- KEYS[1] rs:{limit:<name>}:bucket  hash: 'tokens', 'at' (ms of the last refill), and the
--                                   operator's 'rate' (per second) and 'burst' when set
-- KEYS[2] rs:{limit:<name>}:grants  zset: command id -> when its token is due (ms)
--
-- ARGV[1] now in ms, or -1 for the Redis clock (the clock timers are judged by)
-- ARGV[2] the declared rate (per second)   ARGV[3] the declared burst
--         (both used until an operator sets the limit: rate_set.lua)
-- ARGV[4] command id                       ARGV[5] 'take' or 'release'
--
-- A take refills the bucket for the time since the last one (at most 'burst' tokens) and
-- takes one. When none is left the token is promised at a later time: the count goes below
-- zero, each promise one token further out, and the command waits as a durable timer until
-- then. A command that was promised a token is recorded, so a repeat of its take (a redelivery,
-- a re-decided conflict, a retried call, the timer coming due) is given the same time and
-- takes nothing. Grants are kept a minute past their time.
--
-- A release gives back the token of a command that will not be sent after all (cancelled,
-- compensated or forced while it waited): a waiting command never uses up a token.
--
-- Returns, for a take, {when the command may go (ms), now (ms)}: at once when the first is
-- not after the second; for a release, 1 if a token went back, 0 if the command held none.
local bucket, grants = KEYS[1], KEYS[2]
local now = clock_ms(ARGV[1])
local id, mode = ARGV[4], ARGV[5]
local due = redis.call('ZSCORE', grants, id)
if mode == 'take' and due then
  return {tonumber(due), now}
end
if mode == 'release' and not due then
  return 0
end
local b = redis.call('HMGET', bucket, 'tokens', 'at', 'rate', 'burst')
local rate = tonumber(b[3] or ARGV[2])
local burst = tonumber(b[4] or ARGV[3])
local tokens = tonumber(b[1] or burst)
local at = tonumber(b[2] or now)
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  at = now
end
if mode == 'release' then
  redis.call('ZREM', grants, id)
  redis.call('HSET', bucket, 'tokens', tostring(math.min(burst, tokens + 1)), 'at', at)
  return 1
end
tokens = tokens - 1
local when = now
if tokens < 0 then
  when = now + math.ceil(-tokens * 1000 / rate)
end
redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', at)
redis.call('ZADD', grants, when, id)
redis.call('ZREMRANGEBYSCORE', grants, '-inf', now - 60000)
return {when, now}
