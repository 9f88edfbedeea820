-- Claim the right to run an idempotent handler, once per idempotency key.
--
-- KEYS[i]  rs:{tag}:dedupe:<group>:<key>   per entry
-- ARGV[1]  lease, ms                        ARGV[2]  consumer
-- ARGV[i + 2]  entry id of KEYS[i]
--
-- A key holds 'I<entry id>|<consumer>' while a handler runs (expires with the lease) and
-- 'R<result>' once it finished. Returns per entry:
--   false          claimed: run the handler
--   'R…'           the first result: do not run again, reply with it
--   'I…'           another delivery with the same key is in flight elsewhere: retry later
-- A marker left by an earlier holder of this very entry (its lease was taken over) is
-- claimed again, since that holder can no longer complete.
local out = {}
for i = 1, #KEYS do
  local marker = 'I' .. ARGV[i + 2] .. '|' .. ARGV[2]
  local value = redis.call('GET', KEYS[i])
  local prefix = 'I' .. ARGV[i + 2] .. '|'
  if not value or string.sub(value, 1, #prefix) == prefix then
    redis.call('SET', KEYS[i], marker, 'PX', ARGV[1])
    out[i] = false
  else
    out[i] = value
  end
end
return out
