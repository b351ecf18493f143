"""The Lua scripts: each check, settlement or renewal is one atomic round trip.

Redis runs a script to completion before any other command, so 200
concurrent admissions against a limit of L see the counters one after the
other and exactly L pass, whichever web process sent them. Time comes from
the Redis server (TIME), so the web processes' clocks cannot disagree
about where a window ends.

State per scope (``<prefix>:k:<id>`` / ``:t:<id>``): a sliding-window log,
a sorted set ``:log`` of the response ids admitted in the last window,
scored by admission time, and a hash ``:tok`` of the tokens each holds,
with their sum under ``#``. An entry leaves the log exactly one window
after its admission, so no window of that length holds more than the limit
(fixed windows let a burst at the end of one and the start of the next
through: twice the limit in a few milliseconds). Concurrency: a sorted set
of response ids scored by lease expiry, renewed while the response lives.
Monthly quota: an integer counter per tenant and month. Reservations: one
hash per tenant, response id -> "<tokens reserved>:<YYYYMM>", deleted by
the settlement (which makes settling idempotent) or, once the lease ran out
because its owner died, by the next admission, which refunds the quota.
"""

# Shared by ADMIT: the clock, and each scope's log purged of expired entries.
_PRELUDE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local window = tonumber(ARGV[1])
local need = tonumber(ARGV[9])

local function purge(log, tok)
  local old = redis.call('ZRANGEBYSCORE', log, '-inf', now - window)
  if #old > 0 then
    local freed = 0
    for _, id in ipairs(old) do
      freed = freed + (tonumber(redis.call('HGET', tok, id)) or 0)
      redis.call('HDEL', tok, id)
    end
    redis.call('ZREMRANGEBYSCORE', log, '-inf', now - window)
    redis.call('HINCRBY', tok, '#', -freed)
  end
  local count = redis.call('ZCARD', log)
  if count == 0 then
    redis.call('DEL', tok)
    return 0, 0, 0
  end
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  local tokens = math.max(0, tonumber(redis.call('HGET', tok, '#')) or 0)
  return count, tokens, tonumber(newest[2]) + window - now
end

-- Until the oldest entries that must leave for one more request have left.
local function wait_requests(log, count, limit)
  if count + 1 <= limit then return 0 end
  local entry = redis.call('ZRANGE', log, count - limit, count - limit, 'WITHSCORES')
  if not entry[2] then return window end
  return tonumber(entry[2]) + window - now
end

-- Until enough tokens have left the window for ``need`` more.
local function wait_tokens(log, tok, tokens, limit)
  local excess = tokens + need - limit
  if excess <= 0 then return 0 end
  if need > limit then return window end
  local entries = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
  local freed = 0
  for i = 1, #entries, 2 do
    freed = freed + (tonumber(redis.call('HGET', tok, entries[i])) or 0)
    if freed >= excess then return tonumber(entries[i + 1]) + window - now end
  end
  return window
end
"""

# KEYS: 1 key log, 2 key tokens, 3 tenant log, 4 tenant tokens
# ARGV: as ADMIT's (1 window ms, 2 key rpm, 4 tenant rpm, 10 response id;
#       9 is 0: a request counted ahead holds no tokens)
# Returns ADMIT's reply, outcome 'ok' or 'requests'. Counts the request in
# both scopes' logs, with no tokens; ADMIT later finds it there and adds
# its tokens without counting it again. So work done before admission
# (screening, tokenizing) is paid for with a request, even when the
# request is then refused. Idempotent per response id.
COUNT = (
    _PRELUDE
    + """
local rid = ARGV[10]
local kr, kt, kreset = purge(KEYS[1], KEYS[2])
local tr, tt, treset = purge(KEYS[3], KEYS[4])
local function reply(outcome, retry)
  return {outcome, now, kr, kt, kreset, tr, tt, treset, retry}
end
if redis.call('ZSCORE', KEYS[1], rid) then return reply('ok', 0) end
local wait = math.max(wait_requests(KEYS[1], kr, tonumber(ARGV[2])),
                      wait_requests(KEYS[3], tr, tonumber(ARGV[4])))
if wait > 0 then return reply('requests', wait) end
for _, scope in ipairs({{KEYS[1], KEYS[2]}, {KEYS[3], KEYS[4]}}) do
  redis.call('ZADD', scope[1], now, rid)
  redis.call('HSET', scope[2], rid, 0)
  redis.call('PEXPIRE', scope[1], window)
  redis.call('PEXPIRE', scope[2], window)
end
kr, kreset, tr, treset = kr + 1, window, tr + 1, window
return reply('ok', 0)
"""
)

# KEYS: 1 key log, 2 key tokens, 3 tenant log, 4 tenant tokens,
#       5 concurrency set, 6 quota counter, 7 reservations
# ARGV: 1 window ms, 2 key rpm, 3 key tpm, 4 tenant rpm, 5 tenant tpm,
#       6 concurrency cap, 7 lease ms, 8 monthly quota, 9 tokens needed,
#       10 response id, 11 quota seed ("" when unknown), 12 quota ttl s,
#       13 reservations ttl ms, 14 period (YYYYMM)
# Returns {outcome, now, key requests, tokens, reset, tenant requests,
#          tokens, reset, retry ms}.
ADMIT = (
    _PRELUDE
    + """
local rid, period = ARGV[10], ARGV[14]

-- Leases that ran out: their owner stopped renewing (it died). Free the
-- slot and refund what the reservation took from this month's quota.
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
for _, id in ipairs(expired) do
  local v = redis.call('HGET', KEYS[7], id)
  if v then
    redis.call('HDEL', KEYS[7], id)
    local n, p = string.match(v, '^(%d+):(%d+)$')
    if p == period and redis.call('EXISTS', KEYS[6]) == 1 then
      if redis.call('DECRBY', KEYS[6], tonumber(n)) < 0 then
        redis.call('SET', KEYS[6], 0, 'KEEPTTL')
      end
    end
  end
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now) end

local kr, kt, kreset = purge(KEYS[1], KEYS[2])
local tr, tt, treset = purge(KEYS[3], KEYS[4])
local function reply(outcome, retry)
  return {outcome, now, kr, kt, kreset, tr, tt, treset, retry}
end

local used = redis.call('GET', KEYS[6])
if not used then
  if ARGV[11] == '' then return reply('seed', 0) end
  used = ARGV[11]
  redis.call('SET', KEYS[6], used, 'EX', tonumber(ARGV[12]))
end
if tonumber(used) + need > tonumber(ARGV[8]) then return reply('quota', 0) end
-- Counted ahead by COUNT: the request is in the log already.
local kcounted = redis.call('ZSCORE', KEYS[1], rid) ~= false
local tcounted = redis.call('ZSCORE', KEYS[3], rid) ~= false
local wait = math.max(kcounted and 0 or wait_requests(KEYS[1], kr, tonumber(ARGV[2])),
                      tcounted and 0 or wait_requests(KEYS[3], tr, tonumber(ARGV[4])))
if wait > 0 then return reply('requests', wait) end
wait = math.max(wait_tokens(KEYS[1], KEYS[2], kt, tonumber(ARGV[3])),
                wait_tokens(KEYS[3], KEYS[4], tt, tonumber(ARGV[5])))
if wait > 0 then return reply('tokens', wait) end
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[6]) then
  return reply('concurrency', 0)
end

local function take(log, tok, counted)
  if not counted then redis.call('ZADD', log, now, rid) end
  redis.call('HINCRBY', tok, rid, ARGV[9])
  redis.call('HINCRBY', tok, '#', ARGV[9])
  -- Every entry leaves within one window of the newest.
  redis.call('PEXPIRE', log, window)
  redis.call('PEXPIRE', tok, window)
end
take(KEYS[1], KEYS[2], kcounted)
take(KEYS[3], KEYS[4], tcounted)
kr, kt, kreset = kr + (kcounted and 0 or 1), kt + need, window
tr, tt, treset = tr + (tcounted and 0 or 1), tt + need, window
local lease = tonumber(ARGV[7])
redis.call('ZADD', KEYS[5], now + lease, rid)
redis.call('INCRBY', KEYS[6], need)
redis.call('HSET', KEYS[7], rid, string.format('%d:%s', need, period))
-- The slots outlive their leases (not the reservations): an expired lease
-- must still be found, to refund its reservation.
redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[13]))
redis.call('PEXPIRE', KEYS[7], tonumber(ARGV[13]))
return reply('ok', 0)
"""
)

# KEYS: 1 reservations, 2 key tokens, 3 tenant tokens, 4 concurrency set,
#       5 quota counter
# ARGV: 1 response id, 2 actual window tokens, 3 actual quota tokens
# Returns 1 when this call settled the reservation, 0 when already settled.
SETTLE = """
redis.call('ZREM', KEYS[4], ARGV[1])
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local need = tonumber(string.match(v, '^(%d+)'))

-- Only while the entry is still in its window: once it has left, the
-- reservation no longer counts anywhere.
local delta = tonumber(ARGV[2]) - need
local function adjust(tok)
  if redis.call('HEXISTS', tok, ARGV[1]) == 1 then
    redis.call('HINCRBY', tok, ARGV[1], delta)
    if redis.call('HINCRBY', tok, '#', delta) < 0 then
      redis.call('HSET', tok, '#', 0)
    end
  end
end
adjust(KEYS[2])
adjust(KEYS[3])
if redis.call('EXISTS', KEYS[5]) == 1 then
  if redis.call('INCRBY', KEYS[5], tonumber(ARGV[3]) - need) < 0 then
    redis.call('SET', KEYS[5], 0, 'KEEPTTL')
  end
end
return 1
"""

# KEYS: 1 concurrency set, 2 reservations
# ARGV: 1 response id, 2 lease ms, 3 reservations ttl ms
# Returns 1 when the lease was extended, 0 when the slot is gone.
RENEW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
-- An expired lease is not revived: the next admission may already have
-- given its slot and its quota away.
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1
"""
