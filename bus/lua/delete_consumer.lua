-- Delete a consumer only if it holds nothing pending (deleting it would drop its entries).
--
-- KEYS[1]  the stream     ARGV[1]  group     ARGV[2]  consumer
-- Returns 1 when deleted, 0 when it still holds entries.
-- flags: allow-oom (it only removes)
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p[1] then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
