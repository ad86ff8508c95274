"""The Lua scripts that make fleet state changes atomic in Redis (EVALSHA; redis-py loads
them again after a Redis restart). Times come from the Redis server (TIME), never from a
replica's clock, so replicas with skewed clocks still agree on who is alive.

Keys (one hash tag, so a Redis Cluster keeps them in one slot):
    KEYS[1] <prefix>:members    sorted set: member id -> last heartbeat (ms, Redis time)
    KEYS[2] <prefix>:epochs     hash: member id -> epoch (µs, Redis time at its join)
    KEYS[3] <prefix>:verdicts   hash: endpoint key -> "<seq>|<published_ms>|<json>"
    KEYS[4] <prefix>:epoch      the last epoch handed out (epochs only grow)
    KEYS[5] <prefix>:overrides  hash: endpoint key -> action json (active "force")
    KEYS[6] <prefix>:vouched    hash: member id -> its last heartbeat that vouched for
                                its verdicts (ms, Redis time; set at its join too)
ARGV[1] member id, ARGV[2] its epoch, ARGV[3] member_ttl in ms, ARGV[4] events channel,
ARGV[5] ``fresh`` in ms (``FleetConfig.fresh``).

Live member (docs/design.md §12.2): its heartbeat at most member_ttl old and at most
member_ttl ahead of Redis's clock (further ahead is no heartbeat these scripts wrote: a
key written from outside, or a Redis clock set far back), an epoch, and a vouch at most
``fresh`` old (a member of an older version, which never vouches, vouches with its
heartbeat). HEARTBEAT evicts every member that is not live; PUBLISH computes owners
among live members only. So a member no script wrote owns nothing past the next
heartbeat of a replica, and one that beats without vouching nothing past ``fresh``.

Fencing (docs/design.md §12.4): every write but JOIN first checks that the writer is a
live member with that epoch; a process that was paused past its TTL is refused and must
JOIN again, with a new epoch. PUBLISH also checks that the writer owns the endpoint among
the live members (the same rendezvous hash as ``ownership.owner_of``), so two replicas
can never both write an endpoint's verdict.
"""

from __future__ import annotations

_PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(n) return string.format('%.0f', n) end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[3])
local fresh = tonumber(ARGV[5])
local function within(ms, age)
  return ms ~= nil and ms >= now_ms - age and ms <= now_ms + ttl
end
local function live_epoch(id, beat)
  if not within(beat, ttl) then return nil end
  local e = redis.call('HGET', KEYS[2], id)
  if not e then return nil end
  local v = tonumber(redis.call('HGET', KEYS[6], id) or '') or beat
  if not within(v, fresh) then return nil end
  return e, v
end
local function is_live(id, epoch)
  local e = live_epoch(id, tonumber(redis.call('ZSCORE', KEYS[1], id) or ''))
  return e ~= nil and e == epoch
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
redis.call('HSET', KEYS[6], ARGV[1], fmt(now_ms))
redis.call('PUBLISH', ARGV[4], 'm\\n' .. ARGV[1])
return {fmt(epoch), fmt(now_ms)}
"""
)

HEARTBEAT = (
    _PRELUDE
    + """
if not is_live(ARGV[1], ARGV[2]) then return {'gone'} end
redis.call('ZADD', KEYS[1], fmt(now_ms), ARGV[1])
if ARGV[6] == '1' then redis.call('HSET', KEYS[6], ARGV[1], fmt(now_ms)) end
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {'ok', fmt(now_ms)}
local dead = 0
for i = 1, #all, 2 do
  local m = all[i]
  local e, v = live_epoch(m, tonumber(all[i + 1]))
  if e then
    out[#out + 1] = m
    out[#out + 1] = e
    out[#out + 1] = fmt(v)
  else
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
    redis.call('HDEL', KEYS[6], m)
    dead = dead + 1
  end
end
if dead > 0 then redis.call('PUBLISH', ARGV[4], 'm\\n*') end
return out
"""
)

PUBLISH = (
    _PRELUDE
    + """
if not is_live(ARGV[1], ARGV[2]) then return {'fenced'} end
local key = ARGV[6]
local beats = redis.call(
  'ZRANGEBYSCORE', KEYS[1], fmt(now_ms - ttl), fmt(now_ms + ttl), 'WITHSCORES')
local best, owner = nil, nil
for i = 1, #beats, 2 do
  local m = beats[i]
  if live_epoch(m, tonumber(beats[i + 1])) then
    local h = redis.sha1hex(m .. '\\n' .. key)
    if best == nil or h > best or (h == best and m > owner) then best, owner = h, m end
  end
end
if owner ~= ARGV[1] then return {'not_owner', owner or ''} end
local seq = now_us
local prev = redis.call('HGET', KEYS[3], key)
if prev then
  local p = tonumber(string.match(prev, '^(%d+)|'))
  if p and seq <= p then seq = p + 1 end
end
local stored = fmt(seq) .. '|' .. fmt(now_ms) .. '|' .. ARGV[7]
redis.call('HSET', KEYS[3], key, stored)
redis.call('PUBLISH', ARGV[4], 'v\\n' .. key .. '\\n' .. stored)
return {'ok', fmt(seq)}
"""
)

ACT = (
    _PRELUDE
    + """
if not is_live(ARGV[1], ARGV[2]) then return {'fenced'} end
if ARGV[8] == 'force' then redis.call('HSET', KEYS[5], ARGV[6], ARGV[7])
elseif ARGV[8] == 'clear' then redis.call('HDEL', KEYS[5], ARGV[6]) end
redis.call('PUBLISH', ARGV[4], 'a\\n' .. ARGV[7])
return {'ok'}
"""
)

LEAVE = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return {'gone'} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('PUBLISH', ARGV[4], 'm\\n' .. ARGV[1])
return {'ok'}
"""
)
