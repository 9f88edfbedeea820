-- Route one event to the waits registered for its correlation key, or buffer it.
--
-- KEYS[1] rs:{<ctx>:w:<stream>}:wait:<key>    hash: '<type> <saga>|<step>|<n>' -> waiter JSON
-- KEYS[2] rs:{<ctx>:w:<stream>}:early:<key>   list: '<type> <event JSON>'
-- ARGV[1] the event's message type   ARGV[2] '<type> <event JSON>'
-- ARGV[3] buffer TTL in ms           ARGV[4] most events buffered per key
--
-- Returns the waiters (JSON) of this type. With none, the event is buffered (once: a
-- redelivered event is not buffered twice) for a wait that registers later (watch_event.lua).
local prefix = ARGV[1] .. ' '
local fields = redis.call('HGETALL', KEYS[1])
local found = {}
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, #prefix) == prefix then
    found[#found + 1] = fields[i + 1]
  end
end
if #found == 0 then
  if not redis.call('LPOS', KEYS[2], ARGV[2]) then
    redis.call('RPUSH', KEYS[2], ARGV[2])
    redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
  end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
end
return found
