-- Forget ended sagas whose hash has expired: remove them from their status index and take
-- them off the per-version counters, so neither grows forever after the retention period;
-- and delete their human tasks (each task hash, its index entries and timers, found through
-- the saga's task log) and the task log itself.
--
-- KEYS[1] ending zset (member 'name@version|status|id', score: when the hash expires)
-- KEYS[2] counts hash    KEYS[3] the partition's task timers zset
-- KEYS[4] the partition's hash of task resume tokens (saga/store/keys/: 'rs:private:{…}:tokens')
-- ARGV[1] now in ms, or -1 for the Redis clock    ARGV[2] most members to look at
-- ARGV[3] the prefix of the partition's saga hashes ('rs:{<context>:<index>}:saga:')
-- ARGV[4] the prefix of the partition's status indexes ('rs:{<context>:<index>}:idx:')
-- ARGV[5], ARGV[6], ARGV[7] the prefixes of its task hashes ('...:task:'), assignee indexes
--         ('...:tasks:') and task logs ('...:tasklog:')
-- ARGV[8...] the task timers' stages (a timer's member is '<task id>|<stage>')
--
-- The saga, index and task keys are the prefixes (saga/store/keys/ builds them) followed by
-- the id or status read from a member or a log entry: they share the partition's hash tag, so
-- the script stays single-slot. A saga whose hash still exists is not forgotten:
-- with a TTL its member moves to the new expiry (a clock that ran ahead of Redis's), without
-- one (redriven out of its end state, or a new saga under the same id) the member goes,
-- and so does the index entry if the saga is no longer in that status.
--
-- Returns {forgotten, members looked at} (as many as ARGV[2]: call again).
local now = clock_ms(ARGV[1])
local saga_prefix, status_prefix = ARGV[3], ARGV[4]
local task_prefix, index_prefix, log_prefix = ARGV[5], ARGV[6], ARGV[7]
local forgotten = 0

local function forget_tasks(id)
  local seen = {}
  for _, entry in ipairs(redis.call('LRANGE', log_prefix .. id, 0, -1)) do
    local task_id = cjson.decode(entry).task
    if task_id and not seen[task_id] then
      seen[task_id] = true
      local stored = redis.call('HGET', task_prefix .. task_id, 'task')
      if stored then
        local task = cjson.decode(stored)
        redis.call('ZREM', index_prefix .. task.assignee, task_id)
        for _, voter in ipairs(task.voters or {}) do
          redis.call('ZREM', index_prefix .. voter, task_id)
        end
      end
      for i = 8, #ARGV do
        redis.call('ZREM', KEYS[3], task_id .. '|' .. ARGV[i])
      end
      redis.call('DEL', task_prefix .. task_id)
      redis.call('HDEL', KEYS[4], task_id)
    end
  end
  redis.call('DEL', log_prefix .. id)
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local definition, status, id = string.match(member, '^([^|]*)|([^|]*)|(.*)$')
  local ttl = redis.call('PTTL', saga_prefix .. id)
  if ttl > 0 then
    redis.call('ZADD', KEYS[1], now + ttl, member)
  else
    redis.call('ZREM', KEYS[1], member)
    if ttl == -2 then
      forget_tasks(id)
    end
    local now_in = ttl == -1 and redis.call('HGET', saga_prefix .. id, 'status')
    if now_in ~= status and redis.call('ZREM', status_prefix .. status, id) == 1 then
      redis.call('HINCRBY', KEYS[2], definition .. '|' .. status, -1)
      forgotten = forgotten + 1
    end
  end
end
return {forgotten, #due}
