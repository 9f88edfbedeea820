-- Apply one change to one human task, atomically (saga/core/task_rules.py decides it):
-- check the task's revision, write the task, move it between the assignee indexes, start
-- and remove its timers, append the saga's task log, and add the messages it sends (the
-- signal that resumes the saga, notifications). Nothing is written unless the revision
-- matches, so a repeat, or a second writer that read the same revision, changes nothing.
--
-- KEYS[1] task hash ('rev', 'task' JSON)     KEYS[2] the partition's task timers zset
-- KEYS[3] the saga's task log list    KEYS[4] the partition's hash of task resume tokens
--         (outside the operator's key patterns: saga/store/keys/)
-- then: the index zsets to remove the task from, those to add it to (score: due), in the
--       counts ARGV gives
--
-- ARGV[1] expected revision (0: the task must not exist)   ARGV[2] new revision
-- ARGV[3] task JSON   ARGV[4] task id   ARGV[5] due (ms, the index score)
-- ARGV[6] n removed indexes   ARGV[7] n added indexes   ARGV[8] n messages
-- ARGV[9] the task's resume token to keep ('': leave it as it is; '-': forget it, the task
--         closed: the field is emptied, not deleted, so the task client needs no HDEL)
-- then: n, n × (member, when)      timers to start
-- then: n, n × member              timers to remove
-- then: n, n × entry (JSON)        task log entries
-- then: per message: stream, k, k × (field, value)   the stream (an argument, so that the
--       task client's ACL user may hold the inbox write-only: %W~) and the entry's fields
--
-- Returns {'ok', revision} or {'conflict', current revision}.
local task, timers, log, token = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, due = ARGV[4], ARGV[5]
local current = tonumber(redis.call('HGET', task, 'rev') or '0')
if current ~= tonumber(ARGV[1]) then
  return {'conflict', current}
end
redis.call('HSET', task, 'rev', ARGV[2], 'task', ARGV[3])
local nremove, nadd, nmessages = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if ARGV[9] == '-' then
  redis.call('HSET', token, id, '')
elseif ARGV[9] ~= '' then
  redis.call('HSET', token, id, ARGV[9])
end
local k = 5
for _ = 1, nremove do
  redis.call('ZREM', KEYS[k], id)
  k = k + 1
end
for _ = 1, nadd do
  redis.call('ZADD', KEYS[k], due, id)
  k = k + 1
end
local i = 10
local n = tonumber(ARGV[i])
for j = 1, n do
  redis.call('ZADD', timers, ARGV[i + 2 * j], ARGV[i + 2 * j - 1])
end
i = i + 2 * n + 1
n = tonumber(ARGV[i])
for j = 1, n do
  redis.call('ZREM', timers, ARGV[i + j])
end
i = i + n + 1
n = tonumber(ARGV[i])
for j = 1, n do
  redis.call('RPUSH', log, ARGV[i + j])
end
i = i + n + 1
for _ = 1, nmessages do
  local stream, nfields = ARGV[i], tonumber(ARGV[i + 1])
  local fields = {}
  for j = 1, 2 * nfields do
    fields[j] = ARGV[i + 1 + j]
  end
  redis.call('XADD', stream, '*', unpack(fields))
  i = i + 2 * nfields + 2
end
return {'ok', tonumber(ARGV[2])}
