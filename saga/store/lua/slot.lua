-- A concurrency key's slots and line: take a slot or wait for one, give one back.
--
-- KEYS[1] rs:{slot:<ctx>:<name>:<value>}:holders  zset: saga ref -> when it took its slot (ms)
-- KEYS[2] ...:waiting  hash: ref -> '<priority> <tenant or -> <seq> <timer id>...' (in line)
-- KEYS[3] ...:seq      string: arrivals so far (the order within a tenant's line)
-- KEYS[4] ...:prios    zset: priority -> itself, for each priority with sagas in line
-- KEYS[5] ...:weights  hash: tenant -> weight (as the last arrival of the tenant declared it)
-- KEYS[6] ...:pending  string: the saga whose debounce window is open (debounce only)
-- Derived from KEYS[1]'s prefix (same tag): ...:tenants:<p> zset tenant -> pass (the
-- tenant's virtual time), ...:line:<p>:<tenant> zset ref -> seq, ...:vt:<p> string (the
-- pass of the last tenant served at priority p).
--
-- A ref is '<partition>:<saga id>'.
-- ARGV[1] 'acquire', 'release', 'debounce' or 'look'   ARGV[2] ref   ARGV[3] limit
-- ARGV[4] now (ms) or -1 for the Redis clock
-- acquire: ARGV[5] priority (0-9)  ARGV[6] tenant ('-': none)  ARGV[7] the tenant's weight
--          ARGV[8] the timer ids waking the saga (space separated)
--          ARGV[9] 'wait', 'skip' (refuse when no slot is free at once) or 'debounced'
--          (the saga's debounce window ended: it goes in line only if still the pending one)
--
-- Order: a free slot goes to the line before any newcomer; the line serves the highest
-- priority first and, within one, the tenant with the lowest pass, whose pass then grows by
-- 1/weight (stride scheduling: tenants share the slots by weight); a tenant's own sagas go
-- in arrival order. A tenant that joins a line starts at the pass last served, so it neither
-- waits behind nor jumps ahead of the others for the time it was away.
--
-- Every op is safe to repeat: a holder asking again is granted, one in line keeps its place,
-- a release of a saga holding nothing changes nothing.
--
-- Returns {verdict, place in line (1 = next; 0 if none), sagas in line, {holders: ref, ms,
-- ...}, {woken: ref, timer ids, ...}, now}: verdict 1 holds a slot, 0 waits, -1 refused (skip),
-- -2 replaced by a later start (debounce); woken are the sagas this call gave a slot to
-- (their timers are due now: the caller moves them).
local holders, waiting, seq, prios, weights, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local prefix = string.sub(holders, 1, #holders - #'holders')
local op, ref, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = clock_ms(ARGV[4])

local function fields(entry)
  local out = {}
  for word in string.gmatch(entry, '%S+') do
    out[#out + 1] = word
  end
  return out
end

local function leave(p, tenant)
  -- a tenant's line emptied: it leaves its priority, the priority leaves when it is empty
  local tenants = prefix .. 'tenants:' .. p
  redis.call('ZREM', tenants, tenant)
  if redis.call('ZCARD', tenants) == 0 then
    redis.call('ZREM', prios, p)
    redis.call('DEL', prefix .. 'vt:' .. p)
  end
end

local function remove(r)
  local entry = redis.call('HGET', waiting, r)
  if not entry then
    return nil
  end
  local f = fields(entry)
  local line = prefix .. 'line:' .. f[1] .. ':' .. f[2]
  redis.call('ZREM', line, r)
  redis.call('HDEL', waiting, r)
  if redis.call('ZCARD', line) == 0 then
    leave(f[1], f[2])
  end
  return f
end

local function fill()
  local woken = {}
  while redis.call('ZCARD', holders) < limit do
    local top = redis.call('ZREVRANGE', prios, 0, 0)
    if #top == 0 then
      break
    end
    local p = top[1]
    local tenants = prefix .. 'tenants:' .. p
    local first = redis.call('ZRANGE', tenants, 0, 0, 'WITHSCORES')
    local tenant, pass = first[1], tonumber(first[2])
    local line = prefix .. 'line:' .. p .. ':' .. tenant
    local next_ref = redis.call('ZRANGE', line, 0, 0)[1]
    local f = fields(redis.call('HGET', waiting, next_ref))
    redis.call('ZREM', line, next_ref)
    redis.call('HDEL', waiting, next_ref)
    redis.call('ZADD', holders, now, next_ref)
    redis.call('SET', prefix .. 'vt:' .. p, tostring(pass))
    if redis.call('ZCARD', line) == 0 then
      leave(p, tenant)
    else
      local weight = tonumber(redis.call('HGET', weights, tenant) or '1')
      redis.call('ZADD', tenants, tostring(pass + 1 / weight), tenant)
    end
    woken[#woken + 1] = next_ref
    woken[#woken + 1] = table.concat(f, ' ', 4)
  end
  return woken
end

local function place(r)
  local entry = redis.call('HGET', waiting, r)
  if not entry then
    return 0
  end
  local f = fields(entry)
  local ahead = 0
  for _, p in ipairs(redis.call('ZRANGEBYSCORE', prios, '(' .. f[1], '+inf')) do
    for _, t in ipairs(redis.call('ZRANGE', prefix .. 'tenants:' .. p, 0, -1)) do
      ahead = ahead + redis.call('ZCARD', prefix .. 'line:' .. p .. ':' .. t)
    end
  end
  return ahead + redis.call('ZRANK', prefix .. 'line:' .. f[1] .. ':' .. f[2], r) + 1
end

local function reply(verdict, woken)
  local held = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
  return {verdict, place(ref), redis.call('HLEN', waiting), held, woken, now}
end

if op == 'look' then
  return reply(redis.call('ZSCORE', holders, ref) and 1 or 0, {})
end
if op == 'release' then
  redis.call('ZREM', holders, ref)
  remove(ref)
  if redis.call('GET', pending) == ref then
    redis.call('DEL', pending)
  end
  return reply(0, fill())
end
if op == 'debounce' then
  redis.call('SET', pending, ref)
  return reply(0, {})
end

-- acquire
if redis.call('ZSCORE', holders, ref) then
  return reply(1, fill())
end
local mode = ARGV[9]
if mode == 'debounced' and redis.call('HEXISTS', waiting, ref) == 0 then
  if redis.call('GET', pending) ~= ref then
    return reply(-2, {})
  end
  redis.call('DEL', pending)
end
if mode == 'skip' and (redis.call('ZCARD', holders) >= limit or redis.call('HLEN', waiting) > 0) then
  return reply(-1, {})
end
if redis.call('HLEN', waiting) == 0 and redis.call('ZCARD', holders) < limit then
  -- a free slot and nobody in line: the common case, without going through the line
  redis.call('ZADD', holders, now, ref)
  return reply(1, {})
end
local entry = redis.call('HGET', waiting, ref)
if entry then
  -- in line already: the timers that wake it may have changed (a new look)
  local f = fields(entry)
  redis.call('HSET', waiting, ref, f[1] .. ' ' .. f[2] .. ' ' .. f[3] .. ' ' .. ARGV[8])
else
  local p, tenant = ARGV[5], ARGV[6]
  local n = redis.call('INCR', seq)
  redis.call('HSET', waiting, ref, p .. ' ' .. tenant .. ' ' .. n .. ' ' .. ARGV[8])
  redis.call('HSET', weights, tenant, ARGV[7])
  local tenants = prefix .. 'tenants:' .. p
  if not redis.call('ZSCORE', tenants, tenant) then
    local vt = redis.call('GET', prefix .. 'vt:' .. p) or '0'
    redis.call('ZADD', tenants, vt, tenant)
  end
  redis.call('ZADD', prefix .. 'line:' .. p .. ':' .. tenant, n, ref)
  redis.call('ZADD', prios, p, p)
end
local woken = fill()
if redis.call('ZSCORE', holders, ref) then
  -- it was served at once: the caller sends its command itself, nothing to wake
  for i = #woken - 1, 1, -2 do
    if woken[i] == ref then
      table.remove(woken, i + 1)
      table.remove(woken, i)
    end
  end
  return reply(1, woken)
end
return reply(0, woken)
