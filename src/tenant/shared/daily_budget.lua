-- A daily budget of calls for one key, per UTC day, in one round trip.
--
-- KEYS[1]  the key's counter of calls taken today (a string holding an integer)
-- ARGV[1]  calls allowed per UTC day (at least 1)
--
-- Returns 0 when a call was taken (INCR), otherwise the seconds until the next UTC midnight,
-- when the budget renews (a refused call takes nothing).
--
-- The counter expires at the next UTC midnight of the server's clock (EXPIREAT on the first
-- call of the day), so a new day starts at 0 for every replica at once.
local now = tonumber(redis.call('TIME')[1])
local day_end = (math.floor(now / 86400) + 1) * 86400
local per_day = tonumber(ARGV[1])

local used = tonumber(redis.call('GET', KEYS[1])) or 0
if used >= per_day then
  return day_end - now
end
if redis.call('INCR', KEYS[1]) == 1 then
  redis.call('EXPIREAT', KEYS[1], day_end)
end
return 0
