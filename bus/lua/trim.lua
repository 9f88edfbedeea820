-- Trim a stream's acknowledged past, never an entry that some group has not acknowledged.
--
-- KEYS[1]  the stream
-- ARGV[1]  retention, ms: entries older than this may go
--
-- MAXLEN ~ or a plain MINID on XADD would drop entries that are still pending (a later claim
-- returns them as deleted). The safe bound is the oldest of: every group's oldest pending
-- entry and every group's next undelivered entry. Returns the number of entries removed.
--
-- flags: allow-oom (it only removes: trimming frees memory at maxmemory too)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return {tonumber(ms), tonumber(seq)}
end
local function older(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
end
local now = clock_ms()
local bound = {now - tonumber(ARGV[1]), 0}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do
    info[g[i]] = g[i + 1]
  end
  local summary = redis.call('XPENDING', KEYS[1], info['name'])
  if tonumber(summary[1]) > 0 and older(parse(summary[2]), bound) then
    bound = parse(summary[2])
  end
  -- entries after last-delivered-id have not been read by this group yet
  local undelivered = redis.call('XRANGE', KEYS[1], '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
  if undelivered[1] and older(parse(undelivered[1][1]), bound) then
    bound = parse(undelivered[1][1])
  end
end
return redis.call('XTRIM', KEYS[1], 'MINID', bound[1] .. '-' .. bound[2])
