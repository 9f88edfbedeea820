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
-- dedupe_release(records, expiry, key, id)
--                      forget `key`'s record if it is the in-flight marker of the entry `id`
--                      (a marker of another delivery of the key is that one's to clear).
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

local function dedupe_release(records, expiry, key, id)
  local value = redis.call('HGET', records, key)
  local ours = 'I' .. id .. '|'
  if value and string.sub(value, 1, #ours) == ours then
    dedupe_drop(records, expiry, key)
  end
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

-- dedupe_claim_all(records, expiry, lease, consumer, quota, ids, keys)
--                      claim keys[i] for the entry ids[i], each as lua/dedupe_claim.lua says
--                      (its header gives the verdicts), after pruning at most 2 * #ids + 2
--                      expired records: one verdict per entry.
local function dedupe_claim_all(records, expiry, lease, consumer, quota, ids, keys)
  local now = clock_ms()
  dedupe_prune(records, expiry, now, 2 * #ids + 2)
  local size = redis.call('HLEN', records)
  local out = {}
  for i = 1, #ids do
    local key, prefix = keys[i], 'I' .. ids[i] .. '|'
    local value, held = dedupe_get(records, expiry, key, now)
    if value and string.sub(value, 1, #prefix) ~= prefix then
      out[i] = value
    elseif not held and size >= quota then
      out[i] = 'Q'
    else
      dedupe_put(records, expiry, key, prefix .. consumer, now + lease)
      size = size + (held and 0 or 1)
      out[i] = false
    end
  end
  dedupe_keep(records, expiry, lease)
  return out
end

-- packed_uint(e, at, n)
--                      the big-endian unsigned integer of the n bytes of `e` from `at`, or
--                      nil when `e` ends before them.
-- envelope_key(e)      the key a packed envelope (an entry's field 'e', bus/_envelope.py) is
--                      deduped on: its item 'idem', or its item 'id' when 'idem' is ''. nil
--                      unless `e` is a MessagePack array (fixarray, array 16/32) of at least
--                      eight items whose first eight are ints (fixint, int and uint 8-64) or
--                      strs (fixstr, str 8/16/32), 'id' and 'idem' strs. Read byte by byte:
--                      fakeredis's Lua has no cmsgpack.
local function packed_uint(e, at, n)
  if at + n - 1 > #e then
    return nil
  end
  local value = 0
  for i = at, at + n - 1 do
    value = value * 256 + string.byte(e, i)
  end
  return value
end

local function envelope_key(e)
  local b = string.byte(e, 1)
  local items, at
  if b and b >= 0x90 and b <= 0x9f then
    items, at = b - 0x90, 2
  elseif b == 0xdc or b == 0xdd then
    local n = b == 0xdc and 2 or 4
    items, at = packed_uint(e, 2, n), 2 + n
  end
  if not items or items < 8 then
    return nil
  end
  local id
  for item = 1, 8 do
    b = string.byte(e, at)
    local size
    if not b then
      return nil
    elseif b <= 0x7f or b >= 0xe0 then  -- positive and negative fixint
      at = at + 1
    elseif b >= 0xcc and b <= 0xd3 then  -- uint 8/16/32/64, then int 8/16/32/64
      at = at + 1 + 2 ^ ((b - 0xcc) % 4)
    elseif b >= 0xa0 and b <= 0xbf then  -- fixstr
      size, at = b - 0xa0, at + 1
    elseif b >= 0xd9 and b <= 0xdb then  -- str 8/16/32
      local n = 2 ^ (b - 0xd9)
      size, at = packed_uint(e, at + 1, n), at + 1 + n
      if not size then
        return nil
      end
    else
      return nil
    end
    if size then
      if at + size - 1 > #e then
        return nil
      end
      local value = string.sub(e, at, at + size - 1)
      at = at + size
      if item == 2 then
        id = value
      elseif item == 8 then
        return value ~= '' and value or id
      end
    elseif item == 2 or item == 8 then
      return nil
    end
  end
end
