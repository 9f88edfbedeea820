-- Put a dead letter's entry back on the stream it came from, and remove the letter, atomically.
--
-- KEYS[1]  rs:{tag}:dlq     the dead-letter stream
-- KEYS[2]  rs:{tag}:<name>  the stream the letter says the entry came from (same tag)
-- ARGV[1]  the letter's entry id in the dead-letter stream
--
-- The entry is re-added with the raw fields the letter copied (raw.<field>), as a new entry
-- that the stream's groups read like any other. A letter whose raw copy is missing or was
-- cut to the size cap is refused: re-adding part of an entry would be a different message.
-- Keyed by the letter's id, so a repeated call finds no letter and changes nothing.
-- Returns {'requeued', new entry id}, {'gone'} or {'refused', why}.
local letter = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if not letter[1] then
  return {'gone'}
end
local fields = letter[1][2]
local raw, stream, missing, truncated = {}, nil, false, false
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if string.sub(name, 1, 4) == 'raw.' then
    raw[#raw + 1] = string.sub(name, 5)
    raw[#raw + 1] = value
  elseif name == 'stream' then
    stream = value
  elseif name == 'raw_missing' and value == '1' then
    missing = true
  elseif name == 'raw_truncated' and value == '1' then
    truncated = true
  end
end
if stream ~= KEYS[2] then
  return {'refused', 'the letter came from ' .. tostring(stream) .. ', not ' .. KEYS[2]}
end
if missing or #raw == 0 then
  return {'refused', 'the letter holds no copy of the entry'}
end
if truncated then
  return {'refused', 'the copy of the entry was cut to the size cap'}
end
local id = redis.call('XADD', KEYS[2], '*', unpack(raw))
redis.call('XDEL', KEYS[1], ARGV[1])
return {'requeued', id}
