-- Acknowledge entries, each only if this consumer still holds its lease (fenced ack).
--
-- KEYS[1]  the stream             KEYS[2]  rs:{tag}:failures:<group> (failure history hash)
-- ARGV[1]  group                  ARGV[2]  consumer
-- ARGV[3…] entry ids
--
-- XACK itself checks no owner: a consumer whose lease was taken over could complete an
-- entry that another consumer is handling. Returns one flag per id: 1 acked, 0 not held.
--
-- flags: allow-oom (it only removes: it runs at maxmemory, so workers finish what they hold)
local acked = {}
for i = 3, #ARGV do
  if leased(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    acked[#acked + 1] = 1
  else
    acked[#acked + 1] = 0
  end
end
return acked
