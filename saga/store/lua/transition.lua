-- Apply one decision to one saga, atomically: check the revision, write the state, append
-- the history, update the indexes, schedule and cancel timers, send the commands, and
-- acknowledge the inbox entry that carried the event. Nothing is written unless every
-- check passes (Lua does not roll back), so a repeat of this call changes nothing.
--
-- KEYS[1] saga hash         KEYS[2] history list
-- then the keys this call touches, in this order, and only those: the script tells which
-- from its arguments by the rules below, as commit.py's _touched_keys does, and refuses a
-- call with any other number of keys before it writes (checking each key's name as well
-- cost more Redis time than leaving the keys out saved):
--   inbox stream             when the event came from the inbox (ARGV[3] set): lease, ack
--   timers zset, timer data  when a timer is started or cancelled
--   counts hash              when the status changes
--   old status idx           when the status changes from one (not for a new saga)
--   new status idx           when the status changes, or an unfinished saga's fields do
--                            (each index scored by when its sagas last moved; an ended
--                            saga's score: when it ended)
--   drained set              for a new saga ('name@version' new sagas may not start on)
--   ending zset              when the saga ends and expires (ended sagas' index entries, by
--                            when their hash expires)
--   ends stream              when the saga has just ended or been dead-lettered (ARGV[7] + 4):
--                            one entry ('saga' id, 'status') for SagaClient.wait, trimmed to
--                            about the last 1,000 (saga/runtime/results.py reads 100 at a time)
-- then one command stream per command, in ARGV order; then the branch hash (see below)
-- Every key touched is declared, though all share the saga's slot: during a reshard Redis
-- checks the declared keys before the script runs (ASK, or TRYAGAIN when they are split),
-- while a key found moved in the middle of the script fails that call after the writes
-- before it. A key left out costs nothing on the wire.
--
-- ARGV[1] expected '<revision>:<tag>' ('0:' when the saga must not exist); the tag is
--         the random 'tag' field the commit that made the revision wrote, so a revision
--         lost with an AOF tail or a failover and made again by another commit is told apart
-- ARGV[2] now in ms, or -1 for the Redis clock (timers are due at now + delay)
-- ARGV[3] inbox group ('' when the event did not come from the inbox)
-- ARGV[4] consumer (the lease holder)      ARGV[5] inbox entry id
-- ARGV[6] seconds to keep an ended saga (0: forever)
-- ARGV[7] 1 if the new status is terminal, + 2 if the last key is the saga's branch hash,
--         + 4 if the status just became an end or dead_lettered (announce it on 'ends')
-- ARGV[8] history entry (saga/store/history.py)
-- then: n, n × (field, value)              the saga hash fields that changed, a new 'tag'
--                                          among them (n > 0 whenever anything changed), in
--       the hash's order: a changed status first and, for a new saga, its name and version
--       next (the script reads the status and name@version there, or in the hash)
-- then: n, n × (timer id, due, stored event)   timers to start; due is a delay in ms from
--       now, or '@' followed by an absolute time in ms (both judged by one clock); the
--       stored event is '<len>:<saga id><event JSON>' (see TimerTemplate.stored)
-- then: n, n × timer id                    timers to cancel
-- then: n, n × (k, k × field/value)        commands: envelope fields per command stream
-- then, with the branch hash (sagas with group steps; saga/store/branches.py):
--       n, n × (field, value)              the branch records that changed; a branch
--       change bumps the revision too, and the hash expires with the saga
--
-- Returns {'ok', revision}, {'conflict', current revision}, {'lost'} when the inbox
-- entry is no longer held by this consumer (its lease moved on: the decision is dropped),
-- or {'drained'} when a new saga's definition version is drained (nothing is written).
local saga, history = KEYS[1], KEYS[2]
local expected, expected_tag = string.match(ARGV[1], '^(%d+):(.*)$')
expected = tonumber(expected)
local seen = redis.call('HMGET', saga, 'rev', 'tag', 'status', 'name', 'version')
local current = tonumber(seen[1] or '0')
if current ~= expected or (seen[2] or '') ~= expected_tag then
  return {'conflict', current}
end
local ttl, flags = tonumber(ARGV[6]), tonumber(ARGV[7])
local terminal, branched, announced = flags % 2 == 1, flags % 4 >= 2, flags >= 4
local group, consumer, entry = ARGV[3], ARGV[4], ARGV[5]
local nfields = tonumber(ARGV[9])
-- a changed status is the first changed field (with none, ARGV[10] counts the timers)
local old_status, moved = seen[3] or '', ARGV[10] == 'status'
local new_status = moved and ARGV[11] or old_status
local nstart = tonumber(ARGV[10 + nfields * 2])
local ncancel = tonumber(ARGV[11 + nfields * 2 + nstart * 3])
local ncommands = tonumber(ARGV[12 + nfields * 2 + nstart * 3 + ncancel])
-- the keys this call touches, by the rules commit.py declares them with
local n = 2
local inbox, timers, timer_data, counts, old_index, new_index, drained, ending, ends
if group ~= '' then
  n = n + 1
  inbox = KEYS[n]
end
if nstart + ncancel > 0 then
  timers, timer_data = KEYS[n + 1], KEYS[n + 2]
  n = n + 2
end
if moved then
  n = n + 1
  counts = KEYS[n]
  if old_status ~= '' then
    n = n + 1
    old_index = KEYS[n]
  end
end
if moved or (nfields > 0 and not terminal) then
  n = n + 1
  new_index = KEYS[n]
end
if expected == 0 then
  n = n + 1
  drained = KEYS[n]
end
if terminal and ttl > 0 then
  n = n + 1
  ending = KEYS[n]
end
if announced then
  n = n + 1
  ends = KEYS[n]
end
if #KEYS ~= n + ncommands + (branched and 1 or 0) then
  return redis.error_reply('ERR transition: the keys do not match the call (' .. #KEYS .. ' keys)')
end
-- name@version, for the counts, the ending set and the drained check: a new saga's name
-- and version are the changed fields after its status
local definition = (moved or terminal) and (seen[4] or ARGV[13]) .. '@' .. (seen[5] or ARGV[15])
if expected == 0 and redis.call('SISMEMBER', drained, definition) == 1 then
  return {'drained'}
end
if group ~= '' then
  if not leased(inbox, group, entry, consumer) then
    return {'lost'}
  end
end

local now = clock_ms(ARGV[2])

local i = 9
local revision = current
if nfields > 0 then
  revision = current + 1
  local fields = {'rev', revision}
  for f = 1, nfields * 2 do
    fields[#fields + 1] = ARGV[i + f]
  end
  redis.call('HSET', saga, unpack(fields))
end
i = i + nfields * 2 + 1
redis.call('RPUSH', history, ARGV[8])

local id = string.match(saga, ':saga:(.*)$')
if moved then
  if old_status ~= '' then
    redis.call('ZREM', old_index, id)
    redis.call('HINCRBY', counts, definition .. '|' .. old_status, -1)
  end
  redis.call('HINCRBY', counts, definition .. '|' .. new_status, 1)
end
-- an unfinished saga's score is when it last moved; an ended one's, when it ended
if moved or (nfields > 0 and not terminal) then
  redis.call('ZADD', new_index, now, id)
end
if terminal and ttl > 0 then
  redis.call('EXPIRE', saga, ttl)
  redis.call('EXPIRE', history, ttl)
  -- the indexes and counters outlive the hash unless saga/store/lua/prune_ended.lua removes them
  redis.call('ZADD', ending, now + ttl * 1000, definition .. '|' .. new_status .. '|' .. id)
end
if announced then
  redis.call('XADD', ends, 'MAXLEN', '~', 1000, '*', 'saga', id, 'status', new_status)
end

for t = 1, nstart do
  local base = i + (t - 1) * 3
  local timer_id = ARGV[base + 1]
  local due = ARGV[base + 2]
  if string.sub(due, 1, 1) == '@' then
    due = tonumber(string.sub(due, 2))
  else
    due = now + tonumber(due)
  end
  redis.call('ZADD', timers, due, timer_id)
  redis.call('HSET', timer_data, timer_id, ARGV[base + 3])
end
i = i + nstart * 3 + 1
for t = 1, ncancel do
  redis.call('ZREM', timers, ARGV[i + t])
  redis.call('HDEL', timer_data, ARGV[i + t], ARGV[i + t] .. ':c')
end
i = i + ncancel + 2 -- past the cancels and the number of commands
for c = 1, ncommands do
  local k = tonumber(ARGV[i])
  redis.call('XADD', KEYS[n + c], '*', unpack(ARGV, i + 1, i + k * 2))
  i = i + k * 2 + 1
end

if branched then
  local branches = KEYS[#KEYS]
  local nbranches = tonumber(ARGV[i])
  local b = i + 1
  while nbranches > 0 do
    local batch = math.min(nbranches, 500)
    redis.call('HSET', branches, unpack(ARGV, b, b + batch * 2 - 1))
    b = b + batch * 2
    nbranches = nbranches - batch
  end
  if terminal and ttl > 0 then
    redis.call('EXPIRE', branches, ttl)
  end
end

if group ~= '' then
  redis.call('XACK', inbox, group, entry)
end
return {'ok', revision}
