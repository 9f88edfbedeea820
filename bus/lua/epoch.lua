-- The deployment's epoch: the one key that says "this Redis still holds our data".
--
-- KEYS[1]   rs:epoch: an epoch id, or "lost:<epoch>" once a worker saw the data vanish
-- ARGV[1]   "join", "check" or "accept"
-- ARGV[2]   join and accept: a fresh epoch id; check: the epoch this worker joined
-- ARGV[3]   check: the marker to leave when the key is missing ("lost:<epoch>")
--
-- join    an absent key is a brand-new deployment: it gets ARGV[2]. Returns {status, value}
--         with status "ok" (joined value) or "lost" (an operator must accept a new epoch).
-- check   "ok" when the key still holds ARGV[2]; "missing" when it is gone (the marker is
--         left, so workers started later refuse too); "lost" or "changed" otherwise.
-- accept  sets ARGV[2] whatever the key held (the operator's decision); returns {"ok", ARGV[2]}.
local value = redis.call('GET', KEYS[1])
local mode = ARGV[1]
if mode == 'accept' then
  redis.call('SET', KEYS[1], ARGV[2])
  return {'ok', ARGV[2]}
end
if mode == 'join' then
  if not value then
    redis.call('SET', KEYS[1], ARGV[2])
    return {'ok', ARGV[2]}
  end
  if string.sub(value, 1, 5) == 'lost:' then return {'lost', value} end
  return {'ok', value}
end
if value == ARGV[2] then return {'ok', value} end
if not value then
  redis.call('SET', KEYS[1], ARGV[3])
  return {'missing', ARGV[3]}
end
if string.sub(value, 1, 5) == 'lost:' then return {'lost', value} end
return {'changed', value}
