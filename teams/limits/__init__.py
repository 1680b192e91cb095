"""Rate limits and token budgets, shared by every web process: `limiter()` picks the backend.

Redis when `INFERENCE_LIMITS_REDIS_URL` (default: a Redis channel layer's URL) names one,
else the database.
"""
from __future__ import annotations

import time

from django.conf import settings

from ..principal import Scope
from .base import LimitExceeded, Ticket, rate_headers, reservation_size, ticket_headers
from .database_backend import DatabaseLimiter
from .redis_backend import RedisLimiter

__all__ = ["LimitExceeded", "Ticket", "current_headers", "limiter", "rate_headers", "reservation_size",
           "ticket_headers"]

_limiter: DatabaseLimiter | RedisLimiter | None = None


def limiter() -> DatabaseLimiter | RedisLimiter:
    global _limiter
    if _limiter is None:
        url = settings.INFERENCE.teams.limits_redis_url
        _limiter = RedisLimiter(url) if url else DatabaseLimiter()
    return _limiter


async def current_headers(scopes: tuple[Scope, ...]) -> dict[str, str]:
    """The x-ratelimit-* headers as the counters stand now, read without counting or reserving
    anything (one read of the shared counters; none at all when no limit applies)."""
    now = time.time()
    limited = tuple(scope for scope in scopes if scope.limited)
    used = await limiter().peek(limited, now) if limited else {}
    return rate_headers(limited, used, now)
