-- Register one event wait in its context's index and look for an event that came first.
--
-- KEYS[1] rs:{<ctx>:w:<stream>}:wait:<key>    hash: '<type> <saga>|<step>|<n>' -> waiter JSON
-- KEYS[2] rs:{<ctx>:w:<stream>}:early:<key>   list: '<type> <event JSON>', events nobody
--                                             waited for yet (capped, expiring)
-- ARGV[1] the waiter's field   ARGV[2] the waiter (JSON)   ARGV[3] the awaited message type
--
-- Registration and routing (route_event.lua) run in the same slot, one script each, so an
-- event either finds the registration or is buffered where the registration finds it:
-- "event before wait" cannot slip between them. Safe to repeat (HSET of the same value).
-- Returns the first buffered event of the awaited type, or false.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local prefix = ARGV[3] .. ' '
for _, entry in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if string.sub(entry, 1, #prefix) == prefix then
    return entry
  end
end
return false
