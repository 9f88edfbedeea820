-- Finish many entries of one stream and group: record each handler's result, publish its
-- reply (same slot only) and acknowledge, each fenced by its lease. record.lua records a
-- result without acknowledging (for a reply to another slot, published first).
--
-- KEYS[1]  the stream                 KEYS[2]  rs:{tag}:failures:<name>:<group>
-- KEYS[3]  rs:{tag}:dedupe:<group>    KEYS[4]  rs:{tag}:dedupe-expiry:<group>
--          (both only when the handlers are idempotent)
-- ARGV[1]  group        ARGV[2]  consumer     ARGV[3]  dedupe TTL, s
-- ARGV[4…] per entry (the layout of bus._scripts.merge): 0 (its key count), m (its
--          argument count), then m arguments:
--          entry id, its idempotency key ('' when not idempotent), result ('R…', or '' to
--          record nothing and clear the in-flight marker so that a retry may run again),
--          1 if it may have a failure history else 0, its reply stream ('' when there is
--          no reply), reply field, value, …
--
-- With a reply, the result is the record without its payload ('R<type>\0'): the record is
-- that and the reply's payload, its last argument (the 'data' field, bus/_envelope.py), so
-- the payload is sent once and the record is what the reply carries.
--
-- The reply stream is an argument, not a key, so that a participant's ACL user may hold it
-- write-only (%W~: it adds replies and cannot read anyone's); it is in the same slot.
--
-- The reply needs no publish dedupe: it is added in the script that acknowledges the entry,
-- only while this consumer owns it, so a repeat of this call (redis-py re-sends after a lost
-- reply) or a late call of a consumer whose lease moved on finds the entry no longer its
-- own and adds nothing.
--
-- Returns one reply per entry, as record.lua: 'lost' (lease taken over: nothing
-- written), 'done', or {'duplicate', first} (a concurrent delivery recorded a different
-- result first: nothing written; the caller completes again with the first result).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local records, expiry = KEYS[3], KEYS[4]
local now = records and clock_ms()
local out = {}
local a = 4
while a <= #ARGV do
  local nargs = tonumber(ARGV[a + 1])
  local id, key, result, failed, target = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
  if target ~= '' and result ~= '' then
    result = result .. ARGV[a + 1 + nargs]
  end
  local outcome = 'done'
  if not leased(stream, group, id, consumer) then
    outcome = 'lost'
  elseif records then
    local value, held = dedupe_get(records, expiry, key, now)
    if value and string.sub(value, 1, 1) == 'R' and value ~= result then
      outcome = {'duplicate', value}
    elseif result ~= '' then
      dedupe_put(records, expiry, key, result, now + 1000 * tonumber(ARGV[3]))
    elseif held then
      dedupe_drop(records, expiry, key)
    end
  end
  if outcome == 'done' then
    if target ~= '' then
      redis.call('XADD', target, '*', unpack(ARGV, a + 7, a + 1 + nargs))
    end
    redis.call('XACK', stream, group, id)
    if failed == '1' then
      redis.call('HDEL', KEYS[2], id)
    end
  end
  out[#out + 1] = outcome
  a = a + 2 + nargs
end
if records then
  dedupe_keep(records, expiry, 1000 * tonumber(ARGV[3]))
end
return out
