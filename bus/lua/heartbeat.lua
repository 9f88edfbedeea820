-- Extend the leases of entries this consumer still holds.
--
-- KEYS[1]    the stream
-- KEYS[2]    rs:{tag}:dedupe:<group>      KEYS[3]  rs:{tag}:dedupe-expiry:<group>
--            (both only when the handlers are idempotent)
-- ARGV[1]    group     ARGV[2]  consumer     ARGV[3]  lease, ms
-- ARGV[4…]   per entry: its id, then its idempotency key when idempotent
--
-- XCLAIM … JUSTID alone would steal an entry back from the consumer that took it over, so
-- the owner is checked first. Returns one flag per id: 1 extended, 0 lease lost. A held
-- entry's in-flight marker, still its own, expires a lease from now.
--
-- A lost entry's in-flight marker is released when it is still this consumer's own: a
-- consumer that took the entry over would have re-marked it, so the entry was dropped from
-- the pending list (XGROUP DELCONSUMER, a destroyed group) and nobody runs it; a retry of
-- the same idempotency key must not wait for the marker to expire.
--
-- flags: allow-oom (nothing it writes grows: leases are kept at maxmemory)
local records, expiry = KEYS[2], KEYS[3]
local now = records and clock_ms()
local step = records and 2 or 1
local held = {}
for i = 4, #ARGV, step do
  local id, key = ARGV[i], ARGV[i + 1]
  local ours = records and redis.call('HGET', records, key) == 'I' .. id .. '|' .. ARGV[2]
  if leased(KEYS[1], ARGV[1], id, ARGV[2]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    if ours then
      redis.call('ZADD', expiry, 'XX', now + tonumber(ARGV[3]), key)
    end
    held[#held + 1] = 1
  else
    if ours then
      dedupe_drop(records, expiry, key)
    end
    held[#held + 1] = 0
  end
end
if records then
  dedupe_keep(records, expiry, tonumber(ARGV[3]))
end
return held
