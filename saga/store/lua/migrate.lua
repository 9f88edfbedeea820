-- Move one saga to another version of its definition (saga versions migrate), atomically:
-- check the revision and the version it runs, rewrite the hash fields that changed, delete
-- the step fields that are gone, append the history entry, move its count from the old
-- definition version to the new one, and mark it as moved. Nothing is written unless every
-- check passes (Lua does not roll back), so a repeat or a lost race changes nothing.
--
-- KEYS[1] saga hash   KEYS[2] history list   KEYS[3] counts hash
-- KEYS[4] the index of its status (scored by when the saga last moved)
--
-- ARGV[1] expected '<revision>:<tag>' (see transition.lua)   ARGV[2] expected version (the hash's 'version' field)
-- ARGV[3] old definition key    ARGV[4] new definition key (name@version)
-- ARGV[5] the saga's status     ARGV[6] history entry (saga/store/history.py; its revision is ARGV[1] + 1)
-- ARGV[7] now in ms, or -1 for the Redis clock
-- then: n, n × (field, value)   the fields to set ('rev' excepted; a new 'tag' among them)
-- then: m, m × field            the fields to delete
--
-- Returns {'ok', revision} or {'conflict', current revision, current version}.
local saga = KEYS[1]
local expected, expected_tag = string.match(ARGV[1], '^(%d+):(.*)$')
local seen = redis.call('HMGET', saga, 'rev', 'version', 'tag')
local current, version = tonumber(seen[1] or '0'), seen[2] or ''
if current ~= tonumber(expected) or version ~= ARGV[2] or current == 0 or (seen[3] or '') ~= expected_tag then
  return {'conflict', current, version}
end
local now = clock_ms(ARGV[7])
local revision = current + 1
local i = 8
local nset = tonumber(ARGV[i])
local fields = {'rev', revision}
for f = 1, nset * 2 do
  fields[#fields + 1] = ARGV[i + f]
end
redis.call('HSET', saga, unpack(fields))
i = i + nset * 2 + 1
local ndel = tonumber(ARGV[i])
if ndel > 0 then
  redis.call('HDEL', saga, unpack(ARGV, i + 1, i + ndel))
end
redis.call('RPUSH', KEYS[2], ARGV[6])
local status = ARGV[5]
redis.call('HINCRBY', KEYS[3], ARGV[3] .. '|' .. status, -1)
redis.call('HINCRBY', KEYS[3], ARGV[4] .. '|' .. status, 1)
redis.call('ZADD', KEYS[4], now, string.match(saga, ':saga:(.*)$'))
return {'ok', revision}
