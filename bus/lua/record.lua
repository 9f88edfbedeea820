-- Record a handler's result without acknowledging the entry: for a reply to another slot,
-- which is published (deduplicated by its id) between this and the acknowledgement, so a
-- crash in between leaves the entry pending and its redelivery replies with this result.
-- Fenced. (A same-slot reply is recorded, published and acknowledged at once by
-- complete_batch.lua.)
--
-- KEYS[1]  the stream
-- KEYS[2]  rs:{tag}:dedupe:<group>     KEYS[3]  rs:{tag}:dedupe-expiry:<group>  (idempotent only)
-- ARGV[1]  group        ARGV[2]  consumer      ARGV[3]  entry id
-- ARGV[4]  dedupe TTL, s                        ARGV[5]  result ('R…') to record, or ''
--          to record nothing (the in-flight marker is cleared so a retry may run again)
-- ARGV[6]  the idempotency key (idempotent only)
--
-- Returns 'lost' (lease taken over: nothing written), 'done', or {'duplicate', first}
-- when a concurrent delivery recorded a different result first: nothing is written and the
-- caller completes again with that first result, so every reply carries the first result.
if not leased(KEYS[1], ARGV[1], ARGV[3], ARGV[2]) then
  return 'lost'
end
if KEYS[2] then
  local now = clock_ms()
  local value, held = dedupe_get(KEYS[2], KEYS[3], ARGV[6], now)
  if value and string.sub(value, 1, 1) == 'R' and value ~= ARGV[5] then
    return {'duplicate', value}
  end
  if ARGV[5] ~= '' then
    dedupe_put(KEYS[2], KEYS[3], ARGV[6], ARGV[5], now + 1000 * tonumber(ARGV[4]))
    dedupe_keep(KEYS[2], KEYS[3], 1000 * tonumber(ARGV[4]))
  elseif held then
    dedupe_drop(KEYS[2], KEYS[3], ARGV[6])
  end
end
return 'done'
