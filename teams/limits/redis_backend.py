"""Scale-out's limiter: counters in Redis, checked and counted by one Lua script per step.

A script runs atomically on the server, so every web process sees one set of counters and
N replicas let through exactly what one would. Parallel slots are a sorted set of request
ids scored by lease expiry, so a crashed web process's slots free themselves.
"""
from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from ..principal import Scope
from .base import (BUDGET, DAY, LEASE_SECONDS, MINUTE, PARALLEL, REQUESTS, TOKENS, LimitExceeded, Ticket,
                   counter_names, limit_of, reset_at)

CHECKS = (REQUESTS, PARALLEL, TOKENS, BUDGET)
NO_LIMIT = -1

# KEYS: per scope, rpm / parallel / tpm / budget counter keys ("" where that limit is absent).
# ARGV: now, request id, lease end, then per scope: the four limits (-1: none) and four TTLs.
# Returns {0} and the values after admission, or {scope number, failed check index, value}.
ADMIT = """
local now = tonumber(ARGV[1])
local n = #KEYS / 4
local values = {}
for i = 1, n do
  local a = 3 + (i - 1) * 8
  for c = 1, 4 do
    local key, limit = KEYS[(i - 1) * 4 + c], tonumber(ARGV[a + c])
    local value = 0
    if limit >= 0 then
      if c == 2 then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
        value = redis.call('ZCARD', key)
      else
        value = tonumber(redis.call('GET', key) or '0')
      end
      if (c <= 2 and value + 1 > limit) or (c > 2 and value >= limit) then
        return {i, c, value}
      end
    end
    values[#values + 1] = value
  end
end
for i = 1, n do
  local a = 3 + (i - 1) * 8
  if tonumber(ARGV[a + 1]) >= 0 then
    local key = KEYS[(i - 1) * 4 + 1]
    values[(i - 1) * 4 + 1] = redis.call('INCR', key)
    redis.call('EXPIRE', key, ARGV[a + 5])
  end
  if tonumber(ARGV[a + 2]) >= 0 then
    local key = KEYS[(i - 1) * 4 + 2]
    redis.call('ZADD', key, ARGV[3], ARGV[2])
    redis.call('EXPIRE', key, ARGV[a + 6])
    values[(i - 1) * 4 + 2] = values[(i - 1) * 4 + 2] + 1
  end
end
table.insert(values, 1, 0)
return values
"""

# KEYS: per scope, tpm / budget keys. ARGV: tokens, then per scope: two limits (-1: none), two TTLs.
RESERVE = """
local tokens = tonumber(ARGV[1])
local n = #KEYS / 2
for i = 1, n do
  for c = 1, 2 do
    local limit = tonumber(ARGV[1 + (i - 1) * 4 + c])
    if limit >= 0 then
      local value = tonumber(redis.call('GET', KEYS[(i - 1) * 2 + c]) or '0')
      if value + tokens > limit then return {i, c, value} end
    end
  end
end
local values = {0}
for i = 1, n do
  for c = 1, 2 do
    local a = 1 + (i - 1) * 4
    local value = 0
    if tonumber(ARGV[a + c]) >= 0 then
      local key = KEYS[(i - 1) * 2 + c]
      value = redis.call('INCRBY', key, tokens)
      redis.call('EXPIRE', key, ARGV[a + 2 + c])
    end
    values[#values + 1] = value
  end
end
return values
"""


def _ttl(scope: Scope, check: str, now: float) -> int:
    return int(reset_at(scope, check, now) - now) + (DAY if check == BUDGET else MINUTE) + 1


class RedisLimiter:
    def __init__(self, url: str, prefix: str = "inference:limits:") -> None:
        self.url = url
        self.prefix = prefix
        self._clients: dict[int, aioredis.Redis] = {}

    def _client(self) -> aioredis.Redis:
        # A redis.asyncio pool belongs to the event loop that made it.
        loop = id(asyncio.get_running_loop())
        if loop not in self._clients:
            self._clients[loop] = aioredis.Redis.from_url(self.url)
        return self._clients[loop]

    def _key(self, name: str | None) -> str:
        return self.prefix + name if name else self.prefix + "unused"

    def _limit(self, scope: Scope, check: str) -> int:
        limit = limit_of(scope, check)
        return NO_LIMIT if limit is None else limit

    async def admit(self, ticket: Ticket) -> None:
        if ticket.empty:
            return
        keys, args = [], [ticket.now, ticket.request_id, ticket.now + LEASE_SECONDS]
        for scope in ticket.scopes:
            names = ticket.names[scope.name]
            keys += [self._key(names.get(check)) for check in CHECKS]
            args += [self._limit(scope, check) for check in CHECKS]
            args += [_ttl(scope, REQUESTS, ticket.now), LEASE_SECONDS, 0, 0]
        result = await self._client().eval(ADMIT, len(keys), *keys, *args)
        if result[0]:
            scope = ticket.scopes[result[0] - 1]
            raise LimitExceeded(scope, CHECKS[result[1] - 1], int(result[2]), ticket.now)
        for index, scope in enumerate(ticket.scopes):
            values = result[1 + index * 4: 5 + index * 4]
            ticket.used[scope.name] = {c: int(v) for c, v in zip(CHECKS, values) if c in ticket.names[scope.name]}

    async def reserve(self, ticket: Ticket, tokens: int) -> None:
        if ticket.empty:
            return
        keys, args = [], [tokens]
        for scope in ticket.scopes:
            names = ticket.names[scope.name]
            keys += [self._key(names.get(TOKENS)), self._key(names.get(BUDGET))]
            args += [self._limit(scope, TOKENS), self._limit(scope, BUDGET),
                     _ttl(scope, TOKENS, ticket.now), _ttl(scope, BUDGET, ticket.now)]
        result = await self._client().eval(RESERVE, len(keys), *keys, *args)
        if result[0]:
            scope = ticket.scopes[result[0] - 1]
            raise LimitExceeded(scope, (TOKENS, BUDGET)[result[1] - 1], int(result[2]), ticket.now, asked=tokens)
        for index, scope in enumerate(ticket.scopes):
            used = ticket.used.setdefault(scope.name, {})
            for offset, check in enumerate((TOKENS, BUDGET)):
                if check in ticket.names[scope.name]:
                    used[check] = int(result[1 + index * 2 + offset])
        ticket.reserved = tokens

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        if ticket.empty:
            return
        refund = ticket.reserved - used_tokens
        async with self._client().pipeline(transaction=True) as pipe:
            for scope in ticket.scopes:
                names = ticket.names[scope.name]
                for check in (TOKENS, BUDGET):
                    if check in names and refund:
                        pipe.decrby(self._key(names[check]), refund)
                if PARALLEL in names:
                    pipe.zrem(self._key(names[PARALLEL]), ticket.request_id)
            await pipe.execute()

    async def peek(self, scopes: tuple[Scope, ...], now: float) -> dict[str, dict[str, int]]:
        """Every scope's counters as they stand, in one round trip; counts and reserves nothing."""
        wanted = [(scope.name, check, name) for scope in scopes for check, name in counter_names(scope, now).items()]
        if not wanted:
            return {scope.name: {} for scope in scopes}
        async with self._client().pipeline(transaction=False) as pipe:
            for _, check, name in wanted:
                if check == PARALLEL:
                    pipe.zcount(self._key(name), now, "+inf")
                else:
                    pipe.get(self._key(name))
            values = await pipe.execute()
        result: dict[str, dict[str, int]] = {scope.name: {} for scope in scopes}
        for (scope_name, check, _), value in zip(wanted, values):
            result[scope_name][check] = int(value or 0)
        return result
