-- One campaign lookup, atomically, in one EVALSHA (standalone Redis 5.0 or later): find or
-- register the request's campaign by its LSH bands, then count the request and its source over
-- the sliding windows for the campaign and for each entity the request names.
--
-- No KEYS: the campaign's keys depend on the id the band lookup finds, so the script builds
-- them from the prefix (why this needs a standalone Redis, not a cluster).
-- ARGV: prefix, source (keyed hash), candidate id, band count B, B band hashes (hex),
--       entity count E, E entity keys ("KIND:HASH", keyed hashes).
-- Reply: { campaign id, {7 integers for the campaign, then 7 per entity} }, each 7 being
--        count_1m, count_1h, count_24h, sources_1m, sources_1h, sources_24h, first_seen_s.
--
-- Time is Redis's (TIME), so that replicas whose clocks differ still share buckets; writing
-- after TIME needs effects replication, the default from Redis 5 (asked for where older).
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = tonumber(redis.call('TIME')[1])
local p = ARGV[1]
local source = ARGV[2]
local nb = tonumber(ARGV[4])

-- Sliding windows of 1 min, 1 h, 24 h, each from two fixed buckets of its length (the current
-- and the previous one), the previous weighted by the share of it still inside the window: the
-- sliding-window counter of Cloudflare ("How we built rate limiting capable of scaling to
-- millions of domains", 2017), applied to the HyperLogLog union for distinct sources. Two keys
-- per window keep a PFCOUNT to one merge of two sketches however long the window (24 hourly
-- buckets would merge 24 dense sketches, about 1 ms, per lookup).
local W = { 60, 3600, 86400 }
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
    local len = W[w]
    local b = math.floor(t / len)
    local inside = 1 - (t - b * len) / len -- the share of the previous bucket still in the window
    local ttl = 2 * len + 60
    local ck, cp = base .. ':n' .. len .. ':' .. b, base .. ':n' .. len .. ':' .. (b - 1)
    local hk, hp = base .. ':s' .. len .. ':' .. b, base .. ':s' .. len .. ':' .. (b - 1)
    local now_count = redis.call('INCR', ck)
    redis.call('EXPIRE', ck, ttl)
    redis.call('PFADD', hk, source)
    redis.call('EXPIRE', hk, ttl)
    local before = tonumber(redis.call('GET', cp) or 0)
    local now_sources = redis.call('PFCOUNT', hk)
    local both = now_sources
    if redis.call('EXISTS', hp) == 1 then both = redis.call('PFCOUNT', hk, hp) end
    counts[w] = math.floor(now_count + before * inside + 0.5)
    sources[w] = math.floor(now_sources + (both - now_sources) * inside + 0.5)
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
