-- Acknowledge entries, each only if this consumer still holds its lease (fenced ack).
--
-- KEYS[1]  the stream             KEYS[2]  rs:{tag}:failures:<group> (failure history hash)
-- KEYS[3]  rs:{tag}:dedupe:<group>  KEYS[4]  rs:{tag}:dedupe-expiry:<group>
--          (both only for entries whose idempotency key this consumer claimed: an entry
--          skipped after its read claimed it, lua/read_claim.lua)
-- ARGV[1]  group                  ARGV[2]  consumer
-- ARGV[3…] entry ids; with KEYS[3], each followed by its idempotency key, whose in-flight
--          marker is cleared when it is the entry's own
--
-- XACK itself checks no owner: a consumer whose lease was taken over could complete an
-- entry that another consumer is handling. Returns one flag per id: 1 acked, 0 not held.
--
-- flags: allow-oom (it only removes: it runs at maxmemory, so workers finish what they hold)
local records, expiry = KEYS[3], KEYS[4]
local step = records and 2 or 1
local acked = {}
for i = 3, #ARGV, step do
  if leased(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    if records then
      dedupe_release(records, expiry, ARGV[i + 1], ARGV[i])
    end
    acked[#acked + 1] = 1
  else
    acked[#acked + 1] = 0
  end
end
return acked
