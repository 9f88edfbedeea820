-- Claim the right to run an idempotent handler, once per idempotency key.
--
-- KEYS[1]  rs:{tag}:dedupe:<group>          KEYS[2]  rs:{tag}:dedupe-expiry:<group>
-- ARGV[1]  lease, ms     ARGV[2]  consumer   ARGV[3]  most records the group may hold
-- ARGV[2i + 2], ARGV[2i + 3]  entry id and idempotency key of entry i
--
-- A key holds 'I<entry id>|<consumer>' while a handler runs (expiring with the lease) and
-- 'R<result>' once it finished (helpers dedupe_*, bus/lua/_shared.lua). Returns per entry:
--   false          claimed: run the handler
--   'R…'           the first result: do not run again, reply with it
--   'I…'           another delivery with the same key is in flight elsewhere: retry later
--   'Q'            the group holds its quota of records (ARGV[3]) and this key is not
--                  among them: nothing written, retry later (records expire meanwhile)
-- A marker left by an earlier holder of this very entry (its lease was taken over) is
-- claimed again, since that holder can no longer complete.
--
-- Expired records are pruned here first, at most two per entry claimed: each claim adds at
-- most one, so the hash never holds more than the quota through these scripts. The claims
-- are dedupe_claim_all's (bus/lua/_shared.lua), which lua/read_claim.lua makes too.
local ids, keys = {}, {}
for i = 1, (#ARGV - 3) / 2 do
  ids[i], keys[i] = ARGV[2 * i + 2], ARGV[2 * i + 3]
end
return dedupe_claim_all(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ids, keys)
