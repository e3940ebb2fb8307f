-- GCRA (generic cell rate algorithm, ITU-T I.371; the "virtual scheduling" form that
-- redis-cell and Brandur Leach's throttled use) for one key, in one round trip.
--
-- KEYS[1]  the key's theoretical arrival time (TAT), microseconds since the epoch
-- ARGV[1]  emission interval T, microseconds (1e6 / rate, at least 1)
-- ARGV[2]  burst, requests at once (at least 1): the tolerance is T * (burst - 1)
-- ARGV[3]  floor, microseconds after now (0: none): the replica admitted requests on its
--          own while Redis did not answer (src/tenant/shared/mirror.rs); the TAT is raised
--          to now + floor first, and stored even when this request is refused, so the shared
--          cell does not refill for time it spent unconsulted
--
-- Returns {wait, tat}: wait is 0 when the request conforms (and the TAT moves on by T),
-- otherwise the microseconds until it would conform; tat is the TAT after the call,
-- microseconds after now, which the replica mirrors for its next outage.
--
-- The clock is the server's (TIME), so replicas with skewed clocks share one timeline.
-- Scripts are replicated by effects (Redis >= 5 default; 7 has no other mode), so TIME is
-- allowed here. Microseconds since the epoch (~1.8e15) are exact in Lua's doubles (< 2^53);
-- they are written with %.0f because tostring would round them to 14 digits.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * (tonumber(ARGV[2]) - 1)
local floor = tonumber(ARGV[3]) or 0

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local raised = floor > 0 and now + floor > tat
if raised then
  tat = now + floor
end

-- The key lives as long as it holds anything: once now passes the TAT it would read as
-- "no debt" anyway. Rounded up to the next millisecond, plus one, so it never expires early.
local function store(value)
  redis.call('SET', KEYS[1], string.format('%.0f', value), 'PX', math.ceil((value - now) / 1000) + 1)
end

local wait = tat - tolerance - now
if wait > 0 then
  if raised then
    store(tat)
  end
  return {math.ceil(wait), tat - now}
end

local new_tat = tat + interval
store(new_tat)
return {0, new_tat - now}
