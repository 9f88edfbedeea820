-- Extend the leases of entries this consumer still holds.
--
-- KEYS[1]    the stream
-- KEYS[2…]   per entry: its in-flight dedupe marker, or KEYS[1] when it has none
-- ARGV[1]    group     ARGV[2]  consumer     ARGV[3]  lease, ms
-- ARGV[4…]   entry ids, in the order of KEYS[2…]
--
-- XCLAIM … JUSTID alone would steal an entry back from the consumer that took it over, so
-- the owner is checked first. Returns one flag per id: 1 extended, 0 lease lost.
--
-- A lost entry's in-flight marker is released when it is still this consumer's own: a
-- consumer that took the entry over would have re-marked it, so the entry was dropped from
-- the pending list (XGROUP DELCONSUMER, a destroyed group) and nobody runs it; a retry of
-- the same idempotency key must not wait for the marker to expire.
--
-- flags: allow-oom (nothing it writes grows: leases are kept at maxmemory)
local held = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local marker = KEYS[i - 2]
  if leased(KEYS[1], ARGV[1], id, ARGV[2]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    if marker ~= KEYS[1] then
      local value = redis.call('GET', marker)
      if value and string.sub(value, 1, 1) == 'I' then
        redis.call('PEXPIRE', marker, ARGV[3])
      end
    end
    held[#held + 1] = 1
  else
    if marker ~= KEYS[1] and redis.call('GET', marker) == 'I' .. id .. '|' .. ARGV[2] then
      redis.call('DEL', marker)
    end
    held[#held + 1] = 0
  end
end
return held
