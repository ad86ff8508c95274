"""The Lua scripts that make fleet state changes atomic in Redis (EVALSHA; redis-py loads
them again after a Redis restart). Times come from the Redis server (TIME), never from a
replica's clock, so replicas with skewed clocks still agree on who is alive.

Keys (one hash tag, so a Redis Cluster keeps them in one slot):
    KEYS[1] <prefix>:members    sorted set: member id -> last heartbeat (ms, Redis time)
    KEYS[2] <prefix>:epochs     hash: member id -> epoch (µs, Redis time at its join)
    KEYS[3] <prefix>:verdicts   hash: endpoint key -> "<seq>|<published_ms>|<json>"
    KEYS[4] <prefix>:epoch      the last epoch handed out (epochs only grow)
    KEYS[5] <prefix>:overrides  hash: endpoint key -> action json (active "force")
ARGV[1] member id, ARGV[2] its epoch, ARGV[3] member_ttl in ms, ARGV[4] events channel.

Fencing (docs/design.md §12.4): every write but JOIN first checks that the writer is a
live member with that epoch (its heartbeat not older than member_ttl); a process that was
paused past its TTL is refused and must JOIN again, with a new epoch. PUBLISH also checks
that the writer owns the endpoint among the live members (the same rendezvous hash as
``ownership.owner_of``), so two replicas can never both write an endpoint's verdict.
"""

from __future__ import annotations

_PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(n) return string.format('%.0f', n) end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[3])
local function is_live(id, epoch)
  local e = redis.call('HGET', KEYS[2], id)
  local s = redis.call('ZSCORE', KEYS[1], id)
  return e and e == epoch and s and tonumber(s) >= now_ms - ttl
end
"""

JOIN = (
    _PRELUDE
    + """
local last = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
local epoch = now_us
if epoch <= last then epoch = last + 1 end
redis.call('SET', KEYS[4], fmt(epoch))
redis.call('ZADD', KEYS[1], fmt(now_ms), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], fmt(epoch))
redis.call('PUBLISH', ARGV[4], 'm\\n' .. ARGV[1])
return {fmt(epoch), fmt(now_ms)}
"""
)

HEARTBEAT = (
    _PRELUDE
    + """
if not is_live(ARGV[1], ARGV[2]) then return {'gone'} end
redis.call('ZADD', KEYS[1], fmt(now_ms), ARGV[1])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now_ms - ttl))
for _, m in ipairs(dead) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
end
if #dead > 0 then redis.call('PUBLISH', ARGV[4], 'm\\n*') end
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {'ok', fmt(now_ms)}
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = redis.call('HGET', KEYS[2], live[i]) or '0'
  out[#out + 1] = fmt(tonumber(live[i + 1]))
end
return out
"""
)

PUBLISH = (
    _PRELUDE
    + """
if not is_live(ARGV[1], ARGV[2]) then return {'fenced'} end
local key = ARGV[5]
local live = redis.call('ZRANGEBYSCORE', KEYS[1], fmt(now_ms - ttl), '+inf')
local best, owner = nil, nil
for _, m in ipairs(live) do
  local h = redis.sha1hex(m .. '\\n' .. key)
  if best == nil or h > best or (h == best and m > owner) then best, owner = h, m end
end
if owner ~= ARGV[1] then return {'not_owner', owner or ''} end
local seq = now_us
local prev = redis.call('HGET', KEYS[3], key)
if prev then
  local p = tonumber(string.match(prev, '^(%d+)|'))
  if p and seq <= p then seq = p + 1 end
end
local stored = fmt(seq) .. '|' .. fmt(now_ms) .. '|' .. ARGV[6]
redis.call('HSET', KEYS[3], key, stored)
redis.call('PUBLISH', ARGV[4], 'v\\n' .. key .. '\\n' .. stored)
return {'ok', fmt(seq)}
"""
)

ACT = (
    _PRELUDE
    + """
if not is_live(ARGV[1], ARGV[2]) then return {'fenced'} end
if ARGV[7] == 'force' then redis.call('HSET', KEYS[5], ARGV[5], ARGV[6])
elseif ARGV[7] == 'clear' then redis.call('HDEL', KEYS[5], ARGV[5]) end
redis.call('PUBLISH', ARGV[4], 'a\\n' .. ARGV[6])
return {'ok'}
"""
)

LEAVE = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return {'gone'} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[4], 'm\\n' .. ARGV[1])
return {'ok'}
"""
)
