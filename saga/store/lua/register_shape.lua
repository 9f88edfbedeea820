-- Register or replace one definition version's shape, unless another writer changed it
-- since this one read it (compare-and-set: two workers deploying different code cannot
-- overwrite each other's registration unseen). Idempotent: registering the registered
-- shape again changes nothing.
--
-- KEYS[1] shapes hash (name@version -> shape JSON)
-- KEYS[2] info hash   (name@version -> registration record JSON)
--
-- ARGV[1] name@version   ARGV[2] the shape this writer read ('' when there was none)
-- ARGV[3] the new shape  ARGV[4] the new registration record
--
-- Returns 1 when the new shape is registered (now or already), 0 when the registered
-- shape is no longer ARGV[2] (read again and decide again).
local key, seen, shape = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('HGET', KEYS[1], key) or ''
if current == shape then
  return 1
end
if current ~= seen then
  return 0
end
redis.call('HSET', KEYS[1], key, shape)
redis.call('HSET', KEYS[2], key, ARGV[4])
return 1
