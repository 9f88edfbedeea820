-- Read new entries of a group and claim each one's idempotency key in the same call: an
-- idempotent consumer's read (bus/_intake.py), so that the claim costs no round trip.
--
-- KEYS[1]  the stream      KEYS[2]  rs:{tag}:dedupe:<group>   KEYS[3]  rs:{tag}:dedupe-expiry:<group>
-- ARGV[1]  group           ARGV[2]  consumer                  ARGV[3]  most entries to read
-- ARGV[4]  lease, ms       ARGV[5]  most records the group may hold
--
-- XREADGROUP … > without BLOCK (a reader that waits sends 'XREAD BLOCK … STREAMS <stream>
-- <after>' in the same write, just before this call: it consumes nothing, and this call runs
-- as soon as it returns). Each entry's key is read from its packed envelope (field 'e',
-- envelope_key in bus/lua/_shared.lua) and claimed as lua/dedupe_claim.lua claims it.
--
-- Returns {after, entries}: `after`, the id the next wake-up waits after: the last entry
-- read, or when none was, the group's last-delivered-id (entries other consumers of the
-- group took wake nobody twice); `entries`, one {id, fields, verdict, key} per entry read,
-- with dedupe_claim.lua's verdicts (false, 'R…', 'I…', 'Q'), or 'N' and key '' when its
-- envelope does not parse: nothing claimed (the reader refuses it).
local stream, records, expiry, group = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local read = redis.call('XREADGROUP', 'GROUP', group, ARGV[2], 'COUNT', ARGV[3], 'STREAMS', stream, '>')
local entries = read and read[1][2] or {}
local out, ids, keys, at = {}, {}, {}, {}
for i, entry in ipairs(entries) do
  local fields, key = entry[2], nil
  for j = 1, #fields, 2 do
    if fields[j] == 'e' then
      key = envelope_key(fields[j + 1])
      break
    end
  end
  out[i] = {entry[1], fields, 'N', key or ''}
  if key then
    ids[#ids + 1], keys[#keys + 1], at[#at + 1] = entry[1], key, i
  end
end
if #ids > 0 then
  local verdicts = dedupe_claim_all(records, expiry, tonumber(ARGV[4]), ARGV[2], tonumber(ARGV[5]), ids, keys)
  for n, i in ipairs(at) do
    out[i][3] = verdicts[n]
  end
end
if #entries > 0 then
  return {entries[#entries][1], out}
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local info = {}
  for i = 1, #g, 2 do
    info[g[i]] = g[i + 1]
  end
  if info['name'] == group then
    return {info['last-delivered-id'], out}
  end
end
return {'0-0', out}
