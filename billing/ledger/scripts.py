"""The budget ledger's Lua scripts: a reservation, a settlement, a renewal.

State per tenant and month (``<prefix>:b:<account>``): a hash with
``spent`` (settled spend, nano-units), ``held`` (the sum of the holds of
responses in flight), one ``h:<hold id>`` field per hold with its amount,
and ``p:<model>`` (the last price used for the model, for admissions while
PostgreSQL is down); and a sorted set ``...:holds`` of hold ids scored by
lease expiry. Amounts go to Redis as strings (``ARGV``, ``HGET`` replies):
Lua numbers would be printed in exponent form past 14 digits.
"""

# KEYS: 1 account hash, 2 holds set
# ARGV: 1 budget, 2 amount, 3 hold id, 4 lease ms, 5 spend seed ("" when
#       unknown), 6 ttl s, 7 price field ("" for none), 8 price
# Returns {outcome, spent, held}: "ok" (held includes this hold),
# "exhausted" (nothing taken), "seed" (no spend known yet: call again
# with the month's spend from PostgreSQL).
RESERVE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- Holds whose lease ran out: their owner died before settling them.
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(expired) do
  local amount = redis.call('HGET', KEYS[1], 'h:' .. id)
  if amount then
    redis.call('HDEL', KEYS[1], 'h:' .. id)
    redis.call('HINCRBY', KEYS[1], 'held', '-' .. amount)
  end
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end

if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], ARGV[7], ARGV[8]) end
local spent = redis.call('HGET', KEYS[1], 'spent')
if not spent then
  if ARGV[5] == '' then return {'seed', 0, 0} end
  spent = ARGV[5]
  redis.call('HSET', KEYS[1], 'spent', spent)
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
spent = tonumber(spent)
local held = math.max(0, tonumber(redis.call('HGET', KEYS[1], 'held')) or 0)
local budget, amount = tonumber(ARGV[1]), tonumber(ARGV[2])
-- Spent (or promised) in full: even a free request waits for next month.
if spent + held >= budget or spent + held + amount > budget then
  return {'exhausted', spent, held}
end
redis.call('HSET', KEYS[1], 'h:' .. ARGV[3], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'held', ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
return {'ok', spent, held + amount}
"""

# KEYS: 1 account hash, 2 holds set
# ARGV: 1 hold id, 2 cost (what the response is billed)
# Returns 1 when this call settled the hold, 0 when there was none (settled
# before, or expired).
SETTLE = """
redis.call('ZREM', KEYS[2], ARGV[1])
local amount = redis.call('HGET', KEYS[1], 'h:' .. ARGV[1])
if not amount then return 0 end
redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1])
redis.call('HINCRBY', KEYS[1], 'held', '-' .. amount)
-- The same step moves the amount from held to spent: no moment when a
-- response counts nowhere (or twice).
if redis.call('HEXISTS', KEYS[1], 'spent') == 1 then
  redis.call('HINCRBY', KEYS[1], 'spent', ARGV[2])
end
return 1
"""

# KEYS: 1 holds set
# ARGV: 1 hold id, 2 lease ms
# Returns 1 when the lease was extended, 0 when the hold is gone.
RENEW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# KEYS: 1 account hash
# ARGV: 1 spend from the records, 2 ttl s
# Raises ``spent`` to the records' spend, never lowers it: settlements of
# responses whose records wait in the usage stream are counted already.
CATCH_UP = """
local spent = redis.call('HGET', KEYS[1], 'spent')
if not spent or tonumber(spent) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'spent', ARGV[1])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
return 0
"""
