-- Move due timers into the partition's inbox, atomically: read due, XADD, remove.
--
-- KEYS[1] timers zset    KEYS[2] timer data hash: timer id -> '<len>:<saga id><event JSON>',
--         or with '<len>:<k mac>' (the entry's signature) between them
-- KEYS[3] inbox stream
--
-- KEYS[2] is 'rs:private:{tag}:timerdata'; an earlier release kept it at 'rs:{tag}:timerdata'
-- (same slot, derived here): what that still holds for a timer still pending is moved into
-- KEYS[2] first (one EXISTS a batch once it is gone; a cancelled timer's leftover is dropped).
-- ARGV[1] now in ms, or -1 for the Redis clock      ARGV[2] most timers to fire
-- ARGV[3] the principal that signed the timers (the context's orchestrator): the entries' p
--
-- One script per batch, so two schedulers never fire the same timer and a scheduler killed
-- between batches leaves every unfired timer in the set; the saga side ignores a firing
-- that is no longer current (by timer id). "Due" is judged here, by one clock (Redis TIME,
-- or the fake clock a test passes in), never by a worker's clock.
--
-- Returns {fired, now, next due time or -1, lag of each fired timer...}: the scheduler
-- sleeps until the next due time (measured on this same clock) instead of polling blindly;
-- a lag is how late (ms, on this clock) a timer fired, for the timer-lag metric.
-- The entry's 'e' field (bus/_envelope.py), written as MessagePack byte by byte (fakeredis
-- has no cmsgpack): {3, id, 'TimerFired', at, src '', corr, cause '', idem '', reply '',
-- n 1, hdr {}, p, k, mac (bin)}.
local function str(s)
  local n = #s
  if n < 32 then
    return string.char(0xa0 + n) .. s
  elseif n < 256 then
    return string.char(0xd9, n) .. s
  end
  return string.char(0xda, math.floor(n / 256), n % 256) .. s  -- ids and names are far shorter than 64 KiB
end

local function packed_envelope(id, at, corr, signer, k, mac)
  local ms = {}
  for i = 8, 1, -1 do  -- at as a uint 64, big-endian
    ms[i] = at % 256
    at = math.floor(at / 256)
  end
  return string.char(0x9e, 0x03) .. str(id) .. str('TimerFired') .. string.char(0xcf, unpack(ms))
    .. string.char(0xa0) .. str(corr) .. string.char(0xa0, 0xa0, 0xa0, 0x01, 0x80) .. str(signer)
    .. str(k) .. string.char(0xc4, #mac) .. mac
end

local legacy = string.gsub(KEYS[2], '^rs:private:{', 'rs:{')
if legacy ~= KEYS[2] and redis.call('EXISTS', legacy) == 1 then
  local old = redis.call('HGETALL', legacy)
  for i = 1, #old, 2 do
    local owner = string.gsub(old[i], ':c$', '')  -- the first layout's '<timer id>:c' field
    if redis.call('ZSCORE', KEYS[1], owner) then
      redis.call('HSETNX', KEYS[2], old[i], old[i + 1])
    end
  end
  redis.call('DEL', legacy)
end

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
    local signer, k, mac = '', '', ''
    if auth then  -- '<k> <mac>': the key id has no space, the MAC's raw bytes follow the first
      local space = string.find(auth, ' ', 1, true)
      signer, k, mac = ARGV[3], string.sub(auth, 1, space - 1), string.sub(auth, space + 1)
    end
    redis.call('XADD', KEYS[3], '*', 'e', packed_envelope(timer_id, now, saga_id, signer, k, mac),
      'data', data)
  end
  redis.call('ZREM', KEYS[1], timer_id)
  redis.call('HDEL', KEYS[2], timer_id, timer_id .. ':c')
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
result[3] = next_due[2] or -1
return result
