-- One campaign lookup, atomically, in one EVALSHA (standalone Redis 5.0 or later): find or
-- register the request's campaign by its LSH bands, then count the request and its source over
-- the sliding windows for the campaign and for each entity the request names.
--
-- No KEYS: the campaign's keys depend on the id the band lookup finds, so the script builds
-- them from the prefix (why this needs a standalone Redis, not a cluster).
-- ARGV: prefix, source (keyed hash), candidate id, band count B, B band hashes (hex),
--       entity count E, E entity keys ("KIND:HASH", keyed hashes).
-- Reply: { campaign id, {7 numbers for the campaign, then 7 per entity} }, each 7 being
--        count_1m, count_1h, count_24h, sources_1m, sources_1h, sources_24h, first_seen_s.
--
-- Time is Redis's (TIME), so that replicas whose clocks differ still share buckets; writing
-- after TIME needs effects replication, the default from Redis 5 (asked for where older).
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = tonumber(redis.call('TIME')[1])
local p = ARGV[1]
local source = ARGV[2]
local nb = tonumber(ARGV[4])

-- Bucketed sliding windows {bucket width s, buckets}: 1 min = 6 x 10 s, 1 h = 12 x 5 min,
-- 24 h = 24 x 1 h; the current bucket is partial, so a window spans (n-1)/n to 1 of its length.
local W = { { 10, 6 }, { 300, 12 }, { 3600, 24 } }
local KEEP = 90000 -- 25 h: a band and a first-seen time outlive the longest window

local id = false
local seen = {}
for i = 1, nb do
  local key = p .. 'band:' .. ARGV[4 + i]
  seen[i] = redis.call('GET', key)
  if seen[i] and not id then id = seen[i] end
end
if not id then id = ARGV[3] end
for i = 1, nb do
  local key = p .. 'band:' .. ARGV[4 + i]
  if not seen[i] then
    redis.call('SET', key, id, 'EX', KEEP)
  elseif seen[i] == id then
    redis.call('EXPIRE', key, KEEP)
  end
end

local out = {}
local function track(base)
  local counts, sources = {}, {}
  for w = 1, 3 do
    local width, n = W[w][1], W[w][2]
    local b = math.floor(t / width)
    local ttl = width * n + 60
    local ck = base .. ':n' .. width .. ':' .. b
    local hk = base .. ':s' .. width .. ':' .. b
    redis.call('INCR', ck)
    redis.call('EXPIRE', ck, ttl)
    redis.call('PFADD', hk, source)
    redis.call('EXPIRE', hk, ttl)
    local ckeys, hkeys = {}, {}
    for i = 0, n - 1 do
      ckeys[i + 1] = base .. ':n' .. width .. ':' .. (b - i)
      hkeys[i + 1] = base .. ':s' .. width .. ':' .. (b - i)
    end
    local total = 0
    for _, v in ipairs(redis.call('MGET', unpack(ckeys))) do
      if v then total = total + tonumber(v) end
    end
    counts[w] = total
    sources[w] = redis.call('PFCOUNT', unpack(hkeys))
  end
  local fk = base .. ':first'
  redis.call('SET', fk, t, 'NX')
  redis.call('EXPIRE', fk, KEEP)
  local first = tonumber(redis.call('GET', fk))
  for _, v in ipairs({ counts[1], counts[2], counts[3], sources[1], sources[2], sources[3], t - first }) do
    out[#out + 1] = v
  end
end

track(p .. 'campaign:' .. id)
local ne = tonumber(ARGV[5 + nb])
for i = 1, ne do
  track(p .. 'entity:' .. ARGV[5 + nb + i])
end
return { id, out }
