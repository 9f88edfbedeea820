-- Helpers shared by every redsaga function library: bus/_scripts.py puts this file first in
-- each package's library, so a script calls them as it calls its own local functions.
--
-- clock_ms(given)      the time in ms: `given` when it is a number >= 0 (an injected clock),
--                      else Redis's clock (TIME). clock_ms() is Redis's clock.
-- leased(stream, group, id, consumer)
--                      the entry's pending record {id, consumer, idle ms, deliveries} when
--                      `consumer` holds its lease, else nil. XACK and XCLAIM check no owner:
--                      every fenced write asks this first.
local function clock_ms(given)
  local now = tonumber(given or -1)
  if now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

local function leased(stream, group, id, consumer)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if p[1] and p[1][2] == consumer then
    return p[1]
  end
  return nil
end

-- An idempotent handler's records (redsaga/streams.py): one hash per tag and group, field
-- idempotency key -> in-flight marker 'I<entry id>|<consumer>' or first result 'R…', and
-- beside it a sorted set of when each field expires (Redis 7.0 has no per-field expiry).
-- One key each, so their size is one HLEN and an ACL pattern names them whole.
--
-- dedupe_get(records, expiry, key, now)
--                      `key`'s record: the hash's field while its score is ahead of `now` (a
--                      field without a score is no record), else what an earlier release kept
--                      at '<records>:<key>' (a string with a TTL; read only, as a fallback
--                      while such records live), else false. Second value: whether the hash
--                      holds the field at all (writing it then adds nothing).
-- dedupe_put(records, expiry, key, value, due)
--                      keep `value` as `key`'s record until `due` (ms).
-- dedupe_drop(records, expiry, key)
--                      forget `key`'s record.
-- dedupe_prune(records, expiry, now, most)
--                      forget at most `most` records expired by `now`.
-- dedupe_keep(records, expiry, ms)
--                      let both keys live at least `ms` more (as long as the record just
--                      written): a group that stops writing leaves nothing once its records
--                      have expired, as the records' own TTLs did when each was a key.
local function dedupe_get(records, expiry, key, now)
  local value = redis.call('HGET', records, key)
  if value then
    local due = redis.call('ZSCORE', expiry, key)
    if due and tonumber(due) > now then
      return value, true
    end
  end
  return redis.call('GET', records .. ':' .. key), value ~= false
end

local function dedupe_put(records, expiry, key, value, due)
  redis.call('HSET', records, key, value)
  redis.call('ZADD', expiry, due, key)
end

local function dedupe_drop(records, expiry, key)
  redis.call('HDEL', records, key)
  redis.call('ZREM', expiry, key)
end

local function dedupe_prune(records, expiry, now, most)
  local gone = redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, most)
  if #gone > 0 then
    redis.call('HDEL', records, unpack(gone))
    redis.call('ZREM', expiry, unpack(gone))
  end
end

local function dedupe_keep(records, expiry, ms)
  for _, key in ipairs({records, expiry}) do
    if redis.call('PTTL', key) < ms then
      redis.call('PEXPIRE', key, ms)
    end
  end
end
