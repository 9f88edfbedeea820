-- Create, update or delete one schedule, checked against its revision (compare-and-set).
--
-- KEYS[1] rs:{<ctx>:sched}:specs   hash: schedule id -> Schedule (JSON)
-- KEYS[2] rs:{<ctx>:sched}:states  hash: schedule id -> ScheduleState (JSON)
-- KEYS[3] rs:{<ctx>:sched}:revs    hash: schedule id -> revision
-- KEYS[4] rs:{<ctx>:sched}:due     zset: schedule id -> when to look at it next (ms)
--
-- ARGV[1] schedule id
-- ARGV[2] expected revision ('' : the schedule must not exist; '*' : any)
-- ARGV[3] spec JSON ('' keeps the stored one)
-- ARGV[4] state JSON ('' deletes the schedule)
-- ARGV[5] due time in ms ('' : not due until someone changes it)
--
-- Two schedulers that planned the same occurrence race here: one commits, the other gets
-- 'conflict' and does nothing, so an occurrence is claimed once. Returns {'ok', revision},
-- {'conflict', revision} or {'exists', revision}.
local id = ARGV[1]
local current = redis.call('HGET', KEYS[3], id)
if ARGV[2] == '' then
  if current then return {'exists', current} end
elseif ARGV[2] ~= '*' and current ~= ARGV[2] then
  return {'conflict', current or ''}
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  return {'ok', '0'}
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], id, ARGV[3])
end
redis.call('HSET', KEYS[2], id, ARGV[4])
local revision = redis.call('HINCRBY', KEYS[3], id, 1)
if ARGV[5] == '' then
  redis.call('ZREM', KEYS[4], id)
else
  redis.call('ZADD', KEYS[4], tonumber(ARGV[5]), id)
end
return {'ok', tostring(revision)}
