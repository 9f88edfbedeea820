-- Move due timers into the partition's inbox, atomically: read due, XADD, remove.
--
-- KEYS[1] timers zset    KEYS[2] timer data hash: timer id -> '<len>:<saga id><event JSON>',
--         or with '<len>:<k mac>' (the entry's signature) between them
-- KEYS[3] inbox stream
-- ARGV[1] now in ms, or -1 for the Redis clock      ARGV[2] most timers to fire
-- ARGV[3] the principal that signed the timers (the context's orchestrator): the entries' 'p'
--
-- One script per batch, so two schedulers never fire the same timer and a scheduler killed
-- between batches leaves every unfired timer in the set; the saga side ignores a firing
-- that is no longer current (by timer id). "Due" is judged here, by one clock (Redis TIME,
-- or the fake clock a test passes in), never by a worker's clock.
--
-- Returns {fired, now, next due time or -1, lag of each fired timer...}: the scheduler
-- sleeps until the next due time (measured on this same clock) instead of polling blindly;
-- a lag is how late (ms, on this clock) a timer fired, for the timer-lag metric.
local now = clock_ms(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local result = {#due / 2, now, -1}
for i = 1, #due, 2 do
  local timer_id = due[i]
  result[#result + 1] = now - tonumber(due[i + 1])
  local stored = redis.call('HGET', KEYS[2], timer_id)
  if stored then
    local saga_id, data, auth
    local length = string.match(stored, '^(%d+):')
    if length then  -- '<len>:<saga id>[<len>:<k mac>]<event JSON>'
      local from = #length + 2
      saga_id = string.sub(stored, from, from + tonumber(length) - 1)
      data = string.sub(stored, from + tonumber(length))
      local signed = string.match(data, '^(%d+):')
      if signed then  -- signed by the orchestrator when the timer was set: the fields to write
        auth = string.sub(data, #signed + 2, #signed + 1 + tonumber(signed))
        data = string.sub(data, #signed + 2 + tonumber(signed))
      end
    else  -- the first layout: the event here, the saga id in '<timer id>:c'
      saga_id = redis.call('HGET', KEYS[2], timer_id .. ':c') or ''
      data = stored
    end
    if auth then
      local k, mac = string.match(auth, '(%S+) (%S+)$')
      redis.call('XADD', KEYS[3], '*', 'id', timer_id, 'type', 'TimerFired', 'at', now, 'v', 2,
        'corr', saga_id, 'data', data, 'p', ARGV[3], 'k', k, 'mac', mac)
    else
      redis.call('XADD', KEYS[3], '*', 'id', timer_id, 'type', 'TimerFired', 'at', now, 'v', 2,
        'corr', saga_id, 'data', data)
    end
  end
  redis.call('ZREM', KEYS[1], timer_id)
  redis.call('HDEL', KEYS[2], timer_id, timer_id .. ':c')
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
result[3] = next_due[2] or -1
return result
