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
