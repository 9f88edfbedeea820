-- Record a failed delivery, then schedule a redelivery or move the entry to the dead-letter
-- stream, atomically with its acknowledgement. Fenced: only the lease holder may do this.
--
-- KEYS[1]  the stream                 KEYS[2]  rs:{tag}:failures:<group>
-- KEYS[3]  rs:{tag}:dedupe:<group>      KEYS[4]  rs:{tag}:dedupe-expiry:<group>
--          (both only when the handler is idempotent: its own in-flight marker is cleared,
--          never the marker of another delivery of the same key)
-- ARGV[1]  group        ARGV[2]  consumer        ARGV[3]  entry id
-- ARGV[4]  'retry' or 'dead'                     ARGV[5]  error text (one link of the chain)
-- ARGV[6]  reason (why it is dead, when it is)   ARGV[7]  redelivery delay, ms
-- ARGV[8]  lease, ms    ARGV[9]  delivery limit  ARGV[10] raw field cap, bytes
-- ARGV[11] most raw fields copied                ARGV[12] rs:{tag}:dlq (the dead-letter stream)
-- ARGV[13] whose letter it counts against ('': no quota)   ARGV[14] most letters per window
-- ARGV[15] the window, ms                      ARGV[16] the idempotency key, or ''
-- ARGV[17…] context field, value, … for the DLQ
--
-- A quota bounds what one principal can make a stream that many write (a saga inbox) store:
-- letters are counted per principal in '<dlq>:quota:<window number>' (a hash, same slot,
-- gone after two windows); past the quota one letter says so, and the rest are acknowledged
-- and counted there, not kept. Returns 'over' for those.
--
-- The dead-letter stream is an argument, not a key, so that a participant's ACL user may
-- hold it write-only (%W~: it adds letters and cannot read or delete them); same slot.
--
-- A retry leaves the entry pending with its idle time set so that the reclaimer takes it
-- after the delay (redelivery rides on lease expiry; no timer is needed). A dead letter
-- copies the raw entry from the stream itself, so the caller never re-sends a huge payload.
-- Returns 'lost', 'retry' or 'dead'. A repeat of a 'retry' call records nothing new; a repeat
-- of a 'dead' call finds the entry acknowledged and returns 'lost'.
local stream, group, consumer, id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local held = leased(stream, group, id, consumer)
if not held then
  return 'lost'
end
local deliveries = tonumber(held[4])
local now = clock_ms()

local history = {first = now, errors = {}}
local stored = redis.call('HGET', KEYS[2], id)
if stored then
  history = cjson.decode(stored)
end
-- One link per delivery: redis-py re-sends this call when its reply is lost, and the
-- delivery count (XCLAIM JUSTID leaves it alone) tells the repeat from a new failure.
if history.delivery ~= deliveries then
  history.delivery = deliveries
  table.insert(history.errors, ARGV[5])
  while #history.errors > 10 do
    table.remove(history.errors, 1)
  end
end
if KEYS[3] then
  dedupe_release(KEYS[3], KEYS[4], ARGV[16], id)
end

if ARGV[4] == 'retry' and deliveries < tonumber(ARGV[9]) then
  redis.call('HSET', KEYS[2], id, cjson.encode(history))
  local idle = math.max(0, tonumber(ARGV[8]) - tonumber(ARGV[7]))
  redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', idle, 'JUSTID')
  return 'retry'
end

local reason = ARGV[6]
if ARGV[4] == 'retry' then
  reason = 'delivery limit of ' .. ARGV[9] .. ' reached'
end
local letter = {
  'stream', stream, 'entry', id, 'group', group, 'consumer', consumer,
  'deliveries', deliveries, 'reason', reason, 'errors', cjson.encode(history.errors),
  'first_failed_ms', history.first, 'last_failed_ms', now,
}
if ARGV[13] ~= '' then
  local window = tonumber(ARGV[15])
  local tally = ARGV[12] .. ':quota:' .. math.floor(now / window)
  local count = redis.call('HINCRBY', tally, ARGV[13], 1)
  if count == 1 then
    redis.call('PEXPIRE', tally, 2 * window)
  end
  if count > tonumber(ARGV[14]) then
    if count == tonumber(ARGV[14]) + 1 then
      redis.call('XADD', ARGV[12], '*', 'stream', stream, 'entry', id, 'group', group,
        'consumer', consumer, 'reason', 'dead-letter quota of ' .. ARGV[14] .. ' per ' .. window
        .. ' ms reached by ' .. ARGV[13] .. ': its further letters in this window are counted in '
        .. tally .. ', not kept', 'principal', ARGV[13], 'last_failed_ms', now)
    end
    redis.call('XACK', stream, group, id)
    redis.call('HDEL', KEYS[2], id)
    return 'over'
  end
end
for i = 17, #ARGV, 2 do
  letter[#letter + 1] = ARGV[i]
  letter[#letter + 1] = ARGV[i + 1]
end
local entry = redis.call('XRANGE', stream, id, id)
if entry[1] then
  local fields, cap, most = entry[1][2], tonumber(ARGV[10]), tonumber(ARGV[11])
  local truncated = 0
  for i = 1, #fields, 2 do
    if (i + 1) / 2 > most then
      truncated = 1
      break
    end
    local value = fields[i + 1]
    if #value > cap then
      value = string.sub(value, 1, cap)
      truncated = 1
    end
    letter[#letter + 1] = 'raw.' .. fields[i]
    letter[#letter + 1] = value
  end
  letter[#letter + 1] = 'raw_truncated'
  letter[#letter + 1] = truncated
else
  letter[#letter + 1] = 'raw_missing'
  letter[#letter + 1] = 1
end
redis.call('XADD', ARGV[12], '*', unpack(letter))
redis.call('XACK', stream, group, id)
redis.call('HDEL', KEYS[2], id)
return 'dead'
