"""The Lua scripts: each check or settlement is one atomic round trip.

Redis runs a script to completion before any other command, so 200
concurrent admissions against a limit of L see the counters one after the
other and exactly L pass, whichever web process sent them. Time comes from
the Redis server (TIME), so the web processes' clocks cannot disagree
about where a window ends.

State per scope (``KEYS`` of the form ``<prefix>:k:<id>`` / ``:t:<id>``): a
hash {w: window start ms, r: requests, t: tokens} that expires with its
window. Concurrency: a sorted set of response ids scored by lease expiry,
so a slot whose web process died frees itself. Monthly quota: an integer
counter per tenant and month. Reservation: a hash per response id holding
what was reserved and in which windows, deleted by the settlement (which
makes settling idempotent).
"""

# KEYS: 1 key scope, 2 tenant scope, 3 concurrency set, 4 quota counter,
#       5 reservation
# ARGV: 1 window ms, 2 key rpm, 3 key tpm, 4 tenant rpm, 5 tenant tpm,
#       6 concurrency cap, 7 lease ms, 8 monthly quota, 9 tokens needed,
#       10 response id, 11 quota seed ("" when unknown), 12 quota ttl s,
#       13 reservation ttl ms
# Returns {outcome, now, key w, r, t, tenant w, r, t}.
ADMIT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local window = tonumber(ARGV[1])
local need = tonumber(ARGV[9])

local function load(key)
  local v = redis.call('HMGET', key, 'w', 'r', 't')
  local w = tonumber(v[1])
  if not w or now >= w + window then
    return now, 0, 0
  end
  return w, tonumber(v[2]) or 0, tonumber(v[3]) or 0
end

local kw, kr, kt = load(KEYS[1])
local tw, tr, tt = load(KEYS[2])
local function reply(outcome)
  return {outcome, now, kw, kr, kt, tw, tr, tt}
end

local used = redis.call('GET', KEYS[4])
if not used then
  if ARGV[11] == '' then return reply('seed') end
  used = ARGV[11]
  redis.call('SET', KEYS[4], used, 'EX', tonumber(ARGV[12]))
end
if tonumber(used) + need > tonumber(ARGV[8]) then return reply('quota') end
if kr + 1 > tonumber(ARGV[2]) or tr + 1 > tonumber(ARGV[4]) then
  return reply('requests')
end
if kt + need > tonumber(ARGV[3]) or tt + need > tonumber(ARGV[5]) then
  return reply('tokens')
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[6]) then
  return reply('concurrency')
end

kr, kt, tr, tt = kr + 1, kt + need, tr + 1, tt + need
local function store(key, w, r, t)
  redis.call('HSET', key, 'w', string.format('%d', w), 'r', r, 't', t)
  redis.call('PEXPIRE', key, w + window - now)
end
store(KEYS[1], kw, kr, kt)
store(KEYS[2], tw, tr, tt)
local lease = tonumber(ARGV[7])
redis.call('ZADD', KEYS[3], now + lease, ARGV[10])
redis.call('PEXPIRE', KEYS[3], lease)
redis.call('INCRBY', KEYS[4], need)
redis.call('HSET', KEYS[5], 'n', need, 'kw', string.format('%d', kw),
  'tw', string.format('%d', tw))
redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[13]))
return reply('ok')
"""

# KEYS: 1 reservation, 2 key scope, 3 tenant scope, 4 concurrency set,
#       5 quota counter
# ARGV: 1 actual window tokens, 2 actual quota tokens, 3 response id
# Returns 1 when this call settled the reservation, 0 when already settled.
SETTLE = """
redis.call('ZREM', KEYS[4], ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'n', 'kw', 'tw')
if not v[1] then return 0 end
redis.call('DEL', KEYS[1])
local need = tonumber(v[1])

-- Only the window the tokens were reserved in is corrected: once it has
-- rolled over, the reservation no longer counts anywhere.
local function adjust(key, w, delta)
  if redis.call('HGET', key, 'w') == w then
    if redis.call('HINCRBY', key, 't', delta) < 0 then
      redis.call('HSET', key, 't', 0)
    end
  end
end
local delta = tonumber(ARGV[1]) - need
adjust(KEYS[2], v[2], delta)
adjust(KEYS[3], v[3], delta)
if redis.call('EXISTS', KEYS[5]) == 1 then
  if redis.call('INCRBY', KEYS[5], tonumber(ARGV[2]) - need) < 0 then
    redis.call('SET', KEYS[5], 0, 'KEEPTTL')
  end
end
return 1
"""
