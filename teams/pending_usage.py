"""Usage settled but not yet in the database: what `/v1/key` adds to the ledger's rows.

The ledger writes its rows in batches (teams/ledger.py), so the database lags a request by up to
LEDGER_FLUSH_SECONDS, more while the database is down. Each row is noted here before it is queued
and forgotten once its batch is committed; `/v1/key` reads the team's noted rows, then the
database without them (by request id), and adds the two: a row is counted exactly once whether
its batch commits before, during or after the read, so a client that reads `/v1/key` as its
response ends sees that response's tokens.

In one process (the database limiter, `serve`'s embedded mode) the notes are a dict in memory.
With the Redis limiter (several web processes) they are a Redis hash per team, so any web process
sees what another settled; a reader deletes the notes of rows it finds committed (a process killed
before its own delete leaves nothing behind for long), and a hash untouched for PENDING_TTL
expires.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from django.conf import settings
import redis
import redis.asyncio as aioredis


logger = logging.getLogger(__name__)
PENDING_TTL = 86_400


@dataclass(frozen=True)
class PendingRow:
    request_id: str
    team_id: int
    key_id: int | None
    created_at: float  # the request's start, seconds since the epoch (periods are compared on it)
    prompt_tokens: int
    completion_tokens: int
    refused: bool


class LocalPending:
    """Notes in this process's memory (one web process)."""

    def __init__(self) -> None:
        self._rows: dict[str, PendingRow] = {}
        self._lock = threading.Lock()

    async def add(self, row: PendingRow) -> None:
        with self._lock:
            self._rows[row.request_id] = row

    def written(self, rows: Iterable[PendingRow]) -> None:
        """From the ledger's thread, after the batch holding `rows` is committed."""
        with self._lock:
            for row in rows:
                self._rows.pop(row.request_id, None)

    async def of_team(self, team_id: int) -> list[PendingRow]:
        with self._lock:
            return [row for row in self._rows.values() if row.team_id == team_id]

    async def forget(self, team_id: int, request_ids: Iterable[str]) -> None:
        self.written(PendingRow(request_id, team_id, None, 0, 0, 0, False) for request_id in request_ids)


class RedisPending:
    """Notes in Redis, one hash per team (request id -> row), shared by every web process."""

    def __init__(self, url: str, prefix: str = "inference:ledger:pending:team:") -> None:
        self.url = url
        self.prefix = prefix
        self._clients: dict[int, aioredis.Redis] = {}
        self._sync: redis.Redis | None = None

    def _client(self) -> aioredis.Redis:
        loop = id(asyncio.get_running_loop())  # a redis.asyncio pool belongs to the loop that made it
        if loop not in self._clients:
            self._clients[loop] = aioredis.Redis.from_url(self.url)
        return self._clients[loop]

    def _key(self, team_id: int) -> str:
        return f"{self.prefix}{team_id}"

    async def add(self, row: PendingRow) -> None:
        key = self._key(row.team_id)
        async with self._client().pipeline(transaction=False) as pipe:
            pipe.hset(key, row.request_id, json.dumps(asdict(row)))
            pipe.expire(key, PENDING_TTL)
            await pipe.execute()

    def written(self, rows: Iterable[PendingRow]) -> None:
        by_team: dict[int, list[str]] = {}
        for row in rows:
            by_team.setdefault(row.team_id, []).append(row.request_id)
        if not by_team:
            return
        if self._sync is None:
            self._sync = redis.Redis.from_url(self.url, socket_timeout=2)
        with self._sync.pipeline(transaction=False) as pipe:
            for team_id, ids in by_team.items():
                pipe.hdel(self._key(team_id), *ids)
            pipe.execute()

    async def of_team(self, team_id: int) -> list[PendingRow]:
        values = await self._client().hvals(self._key(team_id))
        return [PendingRow(**json.loads(value)) for value in values]

    async def forget(self, team_id: int, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        if ids:
            await self._client().hdel(self._key(team_id), *ids)


def pending_store() -> LocalPending | RedisPending:
    """Redis when the limiter's counters are there (every web process sees them), else this process."""
    url = settings.INFERENCE.teams.limits_redis_url
    return RedisPending(url) if url else LocalPending()
