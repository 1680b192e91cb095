"""Rate limits and token budgets, shared by every web process: `limiter()` picks the backend.

Redis when `INFERENCE_LIMITS_REDIS_URL` (default: a Redis channel layer's URL) names one,
else the database.
"""
from __future__ import annotations

from django.conf import settings

from .base import LimitExceeded, Ticket, rate_headers, reservation_size
from .database_backend import DatabaseLimiter
from .redis_backend import RedisLimiter

__all__ = ["LimitExceeded", "Ticket", "limiter", "rate_headers", "reservation_size"]

_limiter: DatabaseLimiter | RedisLimiter | None = None


def limiter() -> DatabaseLimiter | RedisLimiter:
    global _limiter
    if _limiter is None:
        url = settings.INFERENCE["LIMITS_REDIS_URL"]
        _limiter = RedisLimiter(url) if url else DatabaseLimiter()
    return _limiter
