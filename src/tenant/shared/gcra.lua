-- GCRA (generic cell rate algorithm, ITU-T I.371; the "virtual scheduling" form that
-- redis-cell and Brandur Leach's throttled use) for one key, in one round trip.
--
-- KEYS[1]  the key's theoretical arrival time (TAT), microseconds since the epoch
-- ARGV[1]  emission interval T, microseconds (1e6 / rate, at least 1)
-- ARGV[2]  burst, requests at once (at least 1): the tolerance is T * (burst - 1)
--
-- Returns 0 when the request conforms (and the TAT moves on by T), otherwise the
-- microseconds until it would conform (nothing is stored).
--
-- The clock is the server's (TIME), so replicas with skewed clocks share one timeline.
-- Scripts are replicated by effects (Redis >= 5 default; 7 has no other mode), so TIME is
-- allowed here. Microseconds since the epoch (~1.8e15) are exact in Lua's doubles (< 2^53);
-- they are written with %.0f because tostring would round them to 14 digits.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * (tonumber(ARGV[2]) - 1)

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end

local wait = tat - tolerance - now
if wait > 0 then
  return math.ceil(wait)
end

local new_tat = tat + interval
-- The key lives as long as it holds anything: once now passes the TAT it would read as
-- "no debt" anyway. Rounded up to the next millisecond, plus one, so it never expires early.
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return 0
